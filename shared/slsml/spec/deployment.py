"""What the deployed stack and the code running in it agree on beyond the wiring: the bucket prefixes the functions may
touch, the metrics the dashboard and alarms read, the bucket's lifecycle rules (and the object tag by which they
expire transient scratch), the functions' default sizes and reserved concurrency (which ``slsml plan`` prices, and
the local host runs its functions with and holds them to, so that local GB-seconds are what a default deployment
bills and a local process runs out of memory where a container would), and the stack outputs that name the
functions' log groups. (The limits an operator sets on every run: ``slsml.spec.limits``.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from slsml.spec import keys, wiring
from slsml.spec.errors import BadInputError

METRICS_NAMESPACE = "slsml"
# POWERTOOLS_SERVICE_NAME of every function. Powertools adds it as the `service` dimension of each
# custom metric, so one value for all functions keeps a metric in one series whoever emits it.
SERVICE_NAME = "slsml"


class Metric(StrEnum):
    """Custom metrics (namespace METRICS_NAMESPACE, dimension service=SERVICE_NAME, no others), each emitted
    where it is true: see ``slsml.pipeline.metrics``."""

    ITERATION_SECONDS = "IterationSeconds"
    WORKER_COMPUTE_SECONDS = "WorkerComputeSeconds"
    TRAIN_LOSS = "TrainLoss"
    WORKERS_DONE = "WorkersDone"
    LATE_WORKERS = "LateWorkers"
    BYTES_READ = "BytesRead"
    BYTES_WRITTEN = "BytesWritten"
    DEADLINE_ACTIONS = "DeadlineActions"  # the watchdog fired a barrier, re-launched steps, failed or completed a run
    REJECTED_MESSAGES = "RejectedMessages"  # malformed, or not belonging to the run it names: no step acted
    REFUSED_STARTS = "RefusedStarts"  # a model dropped under incoming/ that the RunStarter could not start
    REFUSED_OBJECTS = "RefusedObjects"  # an object read or replaced that the pipeline did not store


# What the functions' IAM policies let them read in the bucket (keys.py puts every object under one of these);
# what each may write: its kinds of object (slsml.spec.wiring.Function.writes, keys.*_OBJECTS), all under runs/.
RUNS_PREFIX = "runs/"
DATASETS_PREFIX = "datasets/"
READABLE_PREFIXES = (RUNS_PREFIX, DATASETS_PREFIX)

# The bucket's policy refuses a request that creates an object of these kinds (a PutObject, a CopyObject, a
# CompleteMultipartUpload: `s3:ObjectCreationOperation`) without If-None-Match (the `s3:if-none-match` condition key):
# what is stored there is never overwritten, whoever writes. Models and final models are left out:
# they are made by server-side copies (the run state machine's initial model, the final model, a resumed run's
# first), and S3 refuses every copy into keys that such a policy covers. They are guarded by the pipeline instead
# (a foreign object at a model's key is replaced, the final model's ETag is recorded and checked by its readers)
# and by bucket versioning where it is on.
CREATE_ONLY_OBJECTS = (keys.SCRATCH_OBJECTS, keys.RUN_CONFIG_OBJECTS, keys.SOURCE_MODEL_OBJECTS)


def bucket_policy_statements(bucket_arn: str) -> list[dict[str, Any]]:
    """The statements slsml puts in the data bucket's policy, as infra/storage.py deploys them and the local cloud
    installs and enforces them (``slsml.local.moto_server.bucket_policies``): create-only ``CREATE_ONLY_OBJECTS``
    (beside ``deletion_statements``)."""
    return [
        {
            "Sid": "CreateOnlyRunObjects",
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": "s3:PutObject",
            "Resource": [f"{bucket_arn}/{kind}" for kind in CREATE_ONLY_OBJECTS],
            # a request that creates an object (a PutObject, a CopyObject, a CompleteMultipartUpload) without
            # If-None-Match; a multipart upload's start and parts, which carry no conditional header, are let through
            "Condition": {"Null": {"s3:if-none-match": "true"}, "Bool": {"s3:ObjectCreationOperation": "true"}},
        }
    ]


# The signing keys of runs (slsml.pipeline.proof): each sealed under the deployment's KMS key with the encryption
# context {run, kind}; a role unseals its own kind's alone
SIGNING_KIND = "kms:EncryptionContext:kind"
MAKE_KEY_PAIRS = "kms:GenerateDataKeyPairWithoutPlaintext"
VOUCH_ACTION = "kms:Encrypt"
KEY_PAIR_SPEC = "ECC_NIST_P256"  # KMS's data key pairs offer no Ed25519; P-256 signatures are as quick to check
# the context's kind under which the step that makes a run's keys vouches for their public keys (kms:Encrypt of their
# digest, which no other role may do); every role unseals it
VOUCH = "public-keys"


def signing_grants(fn: wiring.Function, key_arn: str) -> list[dict[str, Any]]:
    """The IAM statements that let ``fn``'s role use the signing key ``key_arn``: unseal the launch's vouch for a run's
    public keys (``VOUCH``) and its own kind's private key of any run (a kind that signs: ``wiring.SIGNERS``), and, for
    the step that launches runs, make every kind's key pair without seeing a private key and vouch for their public
    keys. infra/compute.py grants them; the key's policy denies anything more (``key_policy_statements``)."""
    grants: list[dict[str, Any]] = [
        {
            "Effect": "Allow",
            "Action": "kms:Decrypt",
            "Resource": key_arn,
            "Condition": {"StringEquals": {SIGNING_KIND: [*_own_kind(fn), VOUCH]}},
        }
    ]
    if fn.makes_run_keys:
        grants.append(
            {
                "Effect": "Allow",
                "Action": MAKE_KEY_PAIRS,
                "Resource": key_arn,
                "Condition": {"StringEquals": {"kms:DataKeyPairSpec": KEY_PAIR_SPEC}},
            }
        )
        grants.append(
            {
                "Effect": "Allow",
                "Action": VOUCH_ACTION,
                "Resource": key_arn,
                "Condition": {"StringEquals": {SIGNING_KIND: VOUCH}},
            }
        )
    return grants


def _own_kind(fn: wiring.Function) -> list[str]:
    """The kind of private key ``fn``'s role unseals: its own, if it signs."""
    return [fn.name] if fn.name in wiring.SIGNERS else []


def key_policy_statements(roles: Mapping[str, str]) -> list[dict[str, Any]]:
    """The Deny statements of the signing key's policy (``roles``: each function's role ARN): a role unseals no kind's
    private key but its own (one that signs nothing, none) and the launch's vouch (``VOUCH``), none but the one that
    launches runs makes key pairs or vouches for them (encrypts), and none re-encrypts a sealed key under another
    context. infra/signing.py deploys them beside the account's own statement, and the local cloud installs and
    enforces them (``slsml.local.moto_server.key_policies``)."""

    def deny(sid: str, action: str, arns: Sequence[str], kinds: Sequence[str] = ()) -> dict[str, Any]:
        condition: dict[str, Any] = {"ArnEquals": {"aws:PrincipalArn": list(arns)}}
        if kinds:
            condition["StringNotEquals"] = {SIGNING_KIND: list(kinds)}
        return {
            "Sid": sid,
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": action,
            "Resource": "*",
            "Condition": condition,
        }

    every = [roles[fn.name] for fn in wiring.FUNCTIONS]
    statements = [
        deny(
            f"Unseal{''.join(part.title() for part in fn.name.split('_'))}KeysOnly",
            "kms:Decrypt",
            [roles[fn.name]],
            [fn.name, VOUCH],
        )
        for fn in wiring.FUNCTIONS
        if fn.name in wiring.SIGNERS
    ]
    unsigned = [roles[fn.name] for fn in wiring.FUNCTIONS if fn.name not in wiring.SIGNERS]
    if unsigned:
        statements.append(deny("UnsealNoKeys", "kms:Decrypt", unsigned, [VOUCH]))
    launching = [roles[fn.name] for fn in wiring.FUNCTIONS if not fn.makes_run_keys]
    statements.append(deny("MakeKeyPairsAtLaunchOnly", MAKE_KEY_PAIRS, launching))
    statements.append(deny("VouchAtLaunchOnly", VOUCH_ACTION, launching))
    statements.append(deny("ReEncryptNoKeys", "kms:ReEncryptFrom", every))
    return statements


# The kinds of object under runs/, each of which the bucket's policy lets only the roles that own its deletes delete
RUN_OBJECTS = (
    keys.RUN_CONFIG_OBJECTS,
    keys.SOURCE_MODEL_OBJECTS,
    keys.MODEL_OBJECTS,
    keys.FINAL_MODEL_OBJECTS,
    keys.SCRATCH_OBJECTS,
)
DELETE_ACTIONS = ("s3:DeleteObject", "s3:DeleteObjectVersion")


def run_deleters(roles: Mapping[str, str], others: Sequence[str] = ()) -> dict[str, list[str]]:
    """Who may delete each kind of object under ``runs/`` (``RUN_OBJECTS``): the principals (``roles``: ARNs by
    function name) of the steps that delete it (``wiring.Function.deletes``), and ``others`` (what empties the
    bucket) every kind; what ``deletion_statements`` takes."""
    return {kind: [*(roles[fn.name] for fn in wiring.FUNCTIONS if kind in fn.deletes), *others] for kind in RUN_OBJECTS}


def deletion_statements(bucket_arn: str, deleters: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
    """The statements of the data bucket's policy that deny deletes under ``runs/`` to every principal but the roles
    that own them: ``deleters`` maps each kind of object (``RUN_OBJECTS``) to the ARNs of the roles that delete it
    (none: nobody deletes it). Any object under ``runs/`` is denied to all but those roles together, each kind to all
    but its own. S3's lifecycle expirations are not requests, and are not refused. infra/storage.py deploys them, and
    the local cloud installs and enforces them (each of its functions signs as a principal of its own)."""

    def denied(sid: str, pattern: str, allowed: Sequence[str]) -> dict[str, Any]:
        statement: dict[str, Any] = {
            "Sid": sid,
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": list(DELETE_ACTIONS),
            "Resource": f"{bucket_arn}/{pattern}",
        }
        if allowed:
            statement["Condition"] = {"ArnNotEquals": {"aws:PrincipalArn": list(allowed)}}
        return statement

    unknown = deleters.keys() - set(RUN_OBJECTS)
    if unknown:
        raise ValueError(f"not kinds of object under {RUNS_PREFIX}: {sorted(unknown)}")
    owners = list(dict.fromkeys(arn for kind in RUN_OBJECTS for arn in deleters.get(kind, ())))
    statements = [denied("DeleteRunObjects", f"{RUNS_PREFIX}*", owners)]
    for kind in RUN_OBJECTS:
        allowed = list(deleters.get(kind, ()))
        if set(allowed) != set(owners):  # e.g. runs/*/final.keras → DeleteRunsFinalKeras
            statements.append(denied("Delete" + "".join(c for c in kind.title() if c.isalnum()), kind, allowed))
    return statements


# S3 lifecycle rules filter on a key prefix and object tags, not on a pattern: transient scratch under
# runs/<run>/iters/ (slsml.spec.keys.is_transient) carries this tag (PutObject Tagging="slsml-scratch=true") and
# expires after a few days; carried state is stored untagged and deleted by the pipeline once superseded.
SCRATCH_TAG_KEY = "slsml-scratch"
SCRATCH_TAG_VALUE = "true"
SCRATCH_EXPIRY_DAYS = 7
DAY_S = 24 * 3600
# The longest a run reads transient scratch: its iteration and the `staleness` ones after it, each bounded by the
# run's heartbeat (TrainingSpec refuses more). A deployment's scratch expiry must exceed it.
TRANSIENT_USE_MAX_S = 2 * DAY_S


class LifecycleRule(BaseModel):
    """One rule of the bucket's lifecycle configuration, as infra/storage.py deploys it and the local cloud applies
    it (``slsml.local.lifecycle``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    prefix: str = ""
    tags: dict[str, str] = Field(default_factory=dict)
    expiration_days: int | None = None  # objects matching prefix and tags, this many days after their creation
    abort_uploads_days: int | None = None  # incomplete multipart uploads, this many days after they began


def lifecycle_rules(scratch_expiry_days: int = SCRATCH_EXPIRY_DAYS) -> tuple[LifecycleRule, ...]:
    """The data bucket's lifecycle rules: tagged transient scratch expires, incomplete uploads are aborted."""
    return (
        LifecycleRule(
            id="ExpireIterationScratch",
            prefix=RUNS_PREFIX,
            tags={SCRATCH_TAG_KEY: SCRATCH_TAG_VALUE},
            expiration_days=scratch_expiry_days,
        ),
        LifecycleRule(id="AbortIncompleteUploads", abort_uploads_days=1),
    )


def lifecycle_configuration(rules: tuple[LifecycleRule, ...]) -> dict[str, Any]:
    """``rules`` as S3's PutBucketLifecycleConfiguration takes them."""
    configured = []
    for rule in rules:
        tags = [{"Key": k, "Value": v} for k, v in rule.tags.items()]
        entry: dict[str, Any] = {
            "ID": rule.id,
            "Status": "Enabled",
            "Filter": {"And": {"Prefix": rule.prefix, "Tags": tags}} if tags else {"Prefix": rule.prefix},
        }
        if rule.expiration_days is not None:
            entry["Expiration"] = {"Days": rule.expiration_days}
        if rule.abort_uploads_days is not None:
            entry["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": rule.abort_uploads_days}
        configured.append(entry)
    return {"Rules": configured}


class GpuInstance(BaseModel):
    """An EC2 instance type a GPU function's capacity provider may launch: what one instance holds."""

    model_config = ConfigDict(frozen=True)

    card: str  # its GPU, as NVIDIA's driver names it
    vcpus: int
    memory_gib: int
    gpus: int
    gpu_memory_gib: int  # of each GPU


# The GPU instance types a deployment may name (``functions.worker.instance_types``), as EC2 describes them (the types
# ``slsml.accounting.prices`` prices). An execution environment's AcceleratorConfig asks for GPUs with at least
# ``accelerator_gib`` of memory each, so that must fit the GPU of every type allowed; its vCPUs (memory over
# GPU_MEMORY_GIB_PER_VCPU) and memory must fit an instance.
GPU_INSTANCES: dict[str, GpuInstance] = {
    "g4dn.xlarge": GpuInstance(card="NVIDIA T4", vcpus=4, memory_gib=16, gpus=1, gpu_memory_gib=16),
    "g5.xlarge": GpuInstance(card="NVIDIA A10G", vcpus=4, memory_gib=16, gpus=1, gpu_memory_gib=24),
    "g5.2xlarge": GpuInstance(card="NVIDIA A10G", vcpus=8, memory_gib=32, gpus=1, gpu_memory_gib=24),
    "g6.xlarge": GpuInstance(card="NVIDIA L4", vcpus=4, memory_gib=16, gpus=1, gpu_memory_gib=24),
    "g6.2xlarge": GpuInstance(card="NVIDIA L4", vcpus=8, memory_gib=32, gpus=1, gpu_memory_gib=24),
    "g6.12xlarge": GpuInstance(card="NVIDIA L4", vcpus=48, memory_gib=192, gpus=4, gpu_memory_gib=24),
    "g6e.xlarge": GpuInstance(card="NVIDIA L40S", vcpus=4, memory_gib=32, gpus=1, gpu_memory_gib=48),
    "g6e.2xlarge": GpuInstance(card="NVIDIA L40S", vcpus=8, memory_gib=64, gpus=1, gpu_memory_gib=48),
}
# Lambda Managed Instances: PutFunctionScalingConfig's bound on a function's execution environments, and the memory
# an execution environment may have (a multiple of its GiB per vCPU, which the stack sets to this: compute-bound)
FLEET_ENVIRONMENTS_MAX = 15_000
MANAGED_MEMORY_MB = (2048, 32768)
GPU_MEMORY_GIB_PER_VCPU = 2
# The GPU instance type a GPU worker's capacity provider allows unless its context names others
# (``functions.worker.instance_types``): what the stack deploys and ``slsml plan`` prices. One NVIDIA L4 (24 GiB),
# 4 vCPUs, 16 GiB.
GPU_INSTANCE_TYPE = "g6.xlarge"
# What a GPU worker is, where its context names only accelerator_gib: 2 vCPUs beside its GPU, a fleet of
# GPU_INSTANCE_TYPE of at most 8 execution environments; no reserved concurrency (its fleet bounds it)
GPU_WORKER_DEFAULTS: dict[str, Any] = {
    "memory_mb": 4096,
    "reserved_concurrency": None,
    "instance_types": (GPU_INSTANCE_TYPE,),
    "max_environments": 8,
}
# The environment of the functions that size a GPU worker's fleet at a run's start and end (``slsml.aws.fleet``):
# the worker's function name and the fleet's most execution environments. Unset: a CPU worker, no fleet to size.
FLEET_FUNCTION_ENV = "SLSML_FLEET_FUNCTION"
FLEET_CAP_ENV = "SLSML_FLEET_CAP"
# the version whose execution environments the fleet sizes: what an unqualified invocation (SNS's) of a function on
# Lambda Managed Instances runs, republished by every deployment of the function
FLEET_QUALIFIER = "$LATEST.PUBLISHED"
# the functions that size the fleet: the WorkLauncher at a run's first launch, the Watchdog while it runs and once it
# ended (both complete runs)
FLEET_SIZERS = ("work_launcher", "watchdog")


class FunctionSettings(BaseModel):
    """Sizing of one Lambda function."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: int = Field(default=512, ge=128, le=10240)
    timeout_s: int = Field(default=60, ge=1, le=900)
    ephemeral_storage_mb: int = Field(default=512, ge=512, le=10240)
    reserved_concurrency: int | None = Field(default=None, ge=1)
    # GPU memory per execution environment (Lambda Managed Instances' AcceleratorConfig); None: a CPU function
    accelerator_gib: Literal[3, 6, 12, 16, 24, 48] | None = None
    # a GPU function's fleet: the EC2 instance types its capacity provider may launch (GPU_INSTANCES), and the most
    # execution environments it may have at once, all runs together (each takes one request at a time)
    instance_types: tuple[str, ...] = ()
    max_environments: int | None = Field(default=None, ge=1, le=FLEET_ENVIRONMENTS_MAX)

    @model_validator(mode="after")
    def _fleet_of_a_gpu_function(self) -> FunctionSettings:
        if self.accelerator_gib is None and (self.instance_types or self.max_environments is not None):
            raise ValueError("instance_types and max_environments size a GPU fleet: set accelerator_gib too")
        return self

    @property
    def gpu(self) -> bool:
        """Whether the function runs on GPU instances (Lambda Managed Instances)."""
        return self.accelerator_gib is not None


def check_gpu_function(function: FunctionSettings, where: str) -> None:
    """A GPU function's settings as Lambda Managed Instances takes them, the one check the stack (``infra.settings``)
    and ``slsml plan`` make: memory a multiple of its GiB per vCPU within Lambda's bounds, known GPU instance types
    whose GPU holds ``accelerator_gib`` and whose instance holds an execution environment, no reserved concurrency
    (its fleet bounds it); else ValueError naming the setting (``where``: the function's, e.g. functions.worker) and
    what to give."""
    low, high = MANAGED_MEMORY_MB
    step = GPU_MEMORY_GIB_PER_VCPU * 1024
    if not (low <= function.memory_mb <= high and function.memory_mb % step == 0):
        raise ValueError(
            f"{where}.memory_mb={function.memory_mb}: a GPU function's memory is a multiple of {step} MB"
            f" ({GPU_MEMORY_GIB_PER_VCPU} GiB per vCPU) from {low} to {high} MB (Lambda Managed Instances)"
        )
    if function.reserved_concurrency is not None:
        raise ValueError(
            f"{where}.reserved_concurrency={function.reserved_concurrency}: a GPU function's concurrency is its"
            f" fleet's; set {where}.max_environments instead (null reserves none)"
        )
    if not function.instance_types:
        raise ValueError(f"{where}.instance_types: name at least one of {', '.join(GPU_INSTANCES)}")
    unknown = [t for t in function.instance_types if t not in GPU_INSTANCES]
    if unknown:
        raise ValueError(
            f"{where}.instance_types: {unknown} are not GPU instance types slsml knows ({', '.join(GPU_INSTANCES)})"
        )
    vcpus = function.memory_mb // step
    for instance_type in function.instance_types:
        instance = GPU_INSTANCES[instance_type]
        if function.accelerator_gib is not None and function.accelerator_gib > instance.gpu_memory_gib:
            raise ValueError(
                f"{where}.accelerator_gib={function.accelerator_gib}: the GPU of a {instance_type} has"
                f" {instance.gpu_memory_gib} GiB"
            )
        if vcpus > instance.vcpus or function.memory_mb >= instance.memory_gib * 1024:
            fits = min(instance.vcpus, (instance.memory_gib * 1024 - 1) // step) * step
            raise ValueError(
                f"{where}.memory_mb={function.memory_mb} ({vcpus} vCPUs): more than a {instance_type}"
                f" ({instance.vcpus} vCPUs, {instance.memory_gib} GiB) holds; give at most {fits} MB"
            )


# The functions an iteration's two stages wait on (the workers, then the reducers), whose steps the watchdog
# re-launches at a stage's deadline: a run's deadline may not be shorter than their timeouts (``RunLimits``), or a
# step still running would be launched again beside itself. Their default timeouts are the default deadline's
# 120 s (``TrainingSpec.deadline_s``): a step slower than that was re-launched anyway, and a hung invocation bills
# no more than that.
STAGE_FUNCTIONS = ("worker", "reducer")

# The TensorFlow functions get room for the framework and a cached model; 1769 MB is one full vCPU
# for the reducers' numpy math. The fleet (the functions a run's width multiplies: its workers, their
# reports, its reducers, their reports) has reserved concurrency: together they can never take more than
# that of the account's concurrency, so the watchdog, the dead-letter reader and the launchers, unreserved,
# always find room (AWS keeps at least UNRESERVED_MINIMUM of an account's concurrency unreserved).
DEFAULT_FUNCTIONS: dict[str, FunctionSettings] = {
    "work_launcher": FunctionSettings(memory_mb=512, timeout_s=60),
    "worker": FunctionSettings(memory_mb=3008, timeout_s=120, ephemeral_storage_mb=2048, reserved_concurrency=300),
    "reduce_launcher": FunctionSettings(memory_mb=512, timeout_s=60, reserved_concurrency=100),
    "reducer": FunctionSettings(memory_mb=1769, timeout_s=120, reserved_concurrency=100),
    "merger": FunctionSettings(memory_mb=3008, timeout_s=300, ephemeral_storage_mb=2048, reserved_concurrency=20),
    "watchdog": FunctionSettings(memory_mb=512, timeout_s=60),
    "run_starter": FunctionSettings(memory_mb=3008, timeout_s=300, ephemeral_storage_mb=2048),
    # fails runs of dead-lettered messages: a table update and a task failure each
    "dead_letters": FunctionSettings(memory_mb=256, timeout_s=30),
}


def checked_settings(field: str, values: dict[str, int], functions: Iterable[str]) -> dict[str, int]:
    """``values`` of one ``FunctionSettings`` field (function → value), as a deployment's ``functions.<name>.<field>``
    sets them, or ``BadInputError`` naming a function not among ``functions`` or a value Lambda refuses."""
    for function, value in values.items():
        if function not in functions:
            raise BadInputError(f"no function named {function!r} to set (the functions: {', '.join(functions)})")
        try:
            FunctionSettings.model_validate({field: value})
        except ValidationError as error:
            raise BadInputError(f"functions.{function}.{field}={value}: {error.errors()[0]['msg']}") from None
    return dict(values)


# A GPU worker (``functions.worker.accelerator_gib``) runs on Lambda Managed Instances in the stack's VPC, which has no
# route out: the AWS services it calls are reached through VPC endpoints, gateway ones (free) and interface ones
# (billed per endpoint, per Availability Zone and hour, and per GB), in ENDPOINT_AZS zones. The stack deploys them and
# ``slsml plan`` prices them. They are what the worker's step calls (``wiring.Function("worker")``: S3 and the table;
# SNS for Work and WorkDone, SQS for Deadlines; it answers no execution, so no Step Functions) and what Lambda sends
# from its environments (logs, X-Ray traces of its active tracing; metrics go out as log lines). The functions that
# size the fleet call the Lambda API from outside the VPC, like every other function of the stack.
GATEWAY_ENDPOINTS = ("s3", "dynamodb")
INTERFACE_ENDPOINTS = ("sns", "sqs", "logs", "xray")
ENDPOINT_AZS = 2

UNRESERVED_MINIMUM = 100  # of an account's Lambda concurrency, which AWS refuses to let reservations take
ACCOUNT_CONCURRENCY = 1000  # Lambda's default concurrency quota per region


def log_group_output(function: str) -> str:
    """The stack output naming a function's log group (``worker`` → ``WorkerLogGroupName``)."""
    return "".join(part.capitalize() for part in function.split("_")) + "LogGroupName"
