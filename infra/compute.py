"""Compute: one Lambda function per pipeline step in slsml.spec.wiring.FUNCTIONS, each with its own
least-privilege role. TensorFlow steps run as one container image (functions/worker/Dockerfile, the
handler picked by the image command); the others are zip functions on the common layer. A GPU worker runs its own
image (functions/worker/Dockerfile.gpu) on the stack's GPU fleet (infra/gpu.py), which the WorkLauncher and the
Watchdog size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import Duration, Fn, Size
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from cdk_nag import NagPackSuppression, NagSuppressions, RegexAppliesTo
from constructs import Construct

from infra.gpu import GpuFleet
from infra.layers import ARCHITECTURE, ROOT, RUNTIME, CommonLayer
from infra.messaging import grant_publish
from infra.naming import pascal
from infra.settings import GPU_FUNCTION, Settings
from slsml.spec import deployment, keys, wiring
from slsml.state.records import RUNS_INDEX

FUNCTIONS_DIR = ROOT / "functions"
DOCKERFILE = "functions/worker/Dockerfile"  # relative to the image's build context, the repository root
GPU_DOCKERFILE = "functions/worker/Dockerfile.gpu"  # a GPU worker's image (CUDA TensorFlow, Lambda Managed Instances)
HANDLER = "lambda_handler"  # the entry point in every functions/<name>/handler.py
# the kinds of object under runs/ a step writes (slsml.spec.keys.*_OBJECTS), as cdk-nag names the resources
OBJECT_KINDS_REGEX = r"/^Resource::<.+\.Arn>\/runs\/\*\/(iters\/\*|models\/\*|final\.keras|source\.keras|run\.json)$/g"
# the run-state actions of every step on the table; no step deletes a run's items
TABLE_ACTIONS = [
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:Query",
]
# Powertools Idempotency keeps a step's message records in the table, in a partition of their own (this key, of the
# function's name after this prefix: slsml.state.idempotency), and deletes one when the step fails, so that a retry
# runs again: a step that handles messages once (wiring.Function.once_per_message) may delete items of it alone
IDEMPOTENCY_PARTITION_PREFIX = "IDEMPOTENCY#"


class Compute(Construct):
    """The pipeline functions, by wiring name."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        bucket: s3.IBucket,
        table: dynamodb.ITable,
        topics: Mapping[str, sns.ITopic],
        queues: Mapping[str, sqs.IQueue],
        failures: sqs.IQueue,
        state_machine: sfn.IStateMachine,
        signing_key: kms.IKey,
        gpu: GpuFleet | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._settings = settings
        self._gpu = gpu
        self._bucket = bucket
        self._table = table
        self._topics = topics
        self._queues = queues
        self._failures = failures
        self._state_machine = state_machine
        self._signing_key = signing_key
        self.layer = CommonLayer(self, "CommonLayer", build=not settings.skip_layer_build).layer
        self.log_groups: dict[str, logs.LogGroup] = {}
        self.functions: dict[str, lambda_.Function] = {fn.name: self._function(fn) for fn in wiring.FUNCTIONS}
        for fn in wiring.FUNCTIONS:
            if fn.once_per_message:
                self._forget_failed_messages(fn)
        if gpu is not None:
            self._size_fleet(self.functions[GPU_FUNCTION])

    def _function(self, fn: wiring.Function) -> lambda_.Function:
        name = pascal(fn.name)
        sizing = self._settings.functions[fn.name]
        log_group = logs.LogGroup(
            self,
            f"{name}Logs",
            retention=self._settings.log_retention,
            removal_policy=self._settings.cdk_removal_policy,
        )
        self.log_groups[fn.name] = log_group
        role = self._role(fn, log_group)
        environment = {  # the dead-letter reader's sources are added by Messaging.subscribe
            wiring.BUCKET_ENV: self._bucket.bucket_name,
            wiring.TABLE_ENV: self._table.table_name,
            wiring.STORAGE_ENV: str(sizing.ephemeral_storage_mb),
            "POWERTOOLS_SERVICE_NAME": deployment.SERVICE_NAME,
            "POWERTOOLS_METRICS_NAMESPACE": deployment.METRICS_NAMESPACE,
            wiring.RUN_LIMITS_ENV: self._settings.limits.model_dump_json(),
            wiring.SIGNING_KEY_ENV: self._signing_key.key_arn,
            **{topic.env_var: self._topics[topic.name].topic_arn for topic in fn.publishes},
            **{queue.env_var: self._queues[queue.name].queue_url for queue in fn.sends},
        }
        if fn.starts_runs:
            environment[wiring.STATE_MACHINE_ENV] = self._state_machine.state_machine_arn
            environment[wiring.RUN_DEFAULTS_ENV] = self._settings.run_defaults.model_dump_json()
        triggers = "/".join([t.name for t in fn.triggers] + ([fn.queue.name] if fn.queue else []))
        publishes = ", ".join(t.name for t in fn.publishes) or "S3"
        common = {
            "description": f"slsml {fn.name}: {triggers} -> {publishes}",
            "role": role,
            "log_group": log_group,
            "environment": environment,
            "architecture": ARCHITECTURE,
            "memory_size": sizing.memory_mb,
            "timeout": Duration.seconds(sizing.timeout_s),
            "ephemeral_storage_size": Size.mebibytes(sizing.ephemeral_storage_mb),
            "reserved_concurrent_executions": sizing.reserved_concurrency,
            "tracing": lambda_.Tracing.ACTIVE,
            # the dead-letter reader is only ever invoked by its queues (synchronously): no DLQ of its own
            "dead_letter_queue": None if fn.reads_dead_letters else self._failures,
        }
        if fn.needs_tensorflow and sizing.gpu:
            return self._gpu_function(fn, name, common)
        if fn.needs_tensorflow:
            code = lambda_.DockerImageCode.from_image_asset(
                str(ROOT),
                file=DOCKERFILE,
                cmd=[f"{fn.name}.handler.{HANDLER}"],
                platform=ecr_assets.Platform.LINUX_AMD64,
            )
            return lambda_.DockerImageFunction(self, name, code=code, **common)
        function = lambda_.Function(
            self,
            name,
            runtime=RUNTIME,
            handler=f"handler.{HANDLER}",
            code=lambda_.Code.from_asset(str(FUNCTIONS_DIR / fn.name), exclude=["__pycache__"]),
            layers=[self.layer],
            **common,
        )
        NagSuppressions.add_resource_suppressions(
            function,
            [
                NagPackSuppression(
                    id="AwsSolutions-L1",
                    reason=f"Pinned to {RUNTIME.name}, the Python of the TensorFlow image (TensorFlow 2.21"
                    " wheels need glibc 2.27, so no image older than python:3.12) and of the layer's wheels.",
                )
            ],
        )
        return function

    def _gpu_function(self, fn: wiring.Function, name: str, common: dict[str, Any]) -> lambda_.Function:
        """``fn`` on the GPU fleet: the CUDA image (x86_64, as AcceleratorConfig requires); its concurrency is the
        fleet's (no reservation)."""
        assert self._gpu is not None, "a GPU function needs the stack's GPU fleet"
        code = lambda_.DockerImageCode.from_image_asset(
            str(ROOT),
            file=GPU_DOCKERFILE,
            cmd=[f"{fn.name}.handler.{HANDLER}"],
            platform=ecr_assets.Platform.LINUX_AMD64,
            exclude=[f"!{GPU_DOCKERFILE}"],  # .dockerignore keeps functions/ to the handlers and the CPU Dockerfile
        )
        function = lambda_.DockerImageFunction(self, name, code=code, **common)
        self._gpu.attach(function)
        return function

    def _size_fleet(self, worker: lambda_.Function) -> None:
        """The functions that size the GPU worker's fleet (``deployment.FLEET_SIZERS``): its name and cap in their
        environment, the scaling calls on its published version and nothing else, and the query of running runs
        (the runs index) that sizes it."""
        cap = self._settings.functions[GPU_FUNCTION].max_environments
        versions = [worker.function_arn, f"{worker.function_arn}:{deployment.FLEET_QUALIFIER}"]
        for sizer in deployment.FLEET_SIZERS:
            function = self.functions[sizer]
            function.add_environment(deployment.FLEET_FUNCTION_ENV, worker.function_name)
            function.add_environment(deployment.FLEET_CAP_ENV, str(cap))
            role = function.role
            assert role is not None
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=[
                        "lambda:PutFunctionScalingConfig",
                        "lambda:GetFunctionScalingConfig",
                        "lambda:GetFunctionConfiguration",
                    ],
                    resources=versions,
                )
            )
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["dynamodb:Query"], resources=[f"{self._table.table_arn}/index/{RUNS_INDEX.name}"]
                )
            )

    def _role(self, fn: wiring.Function, log_group: logs.ILogGroup) -> iam.Role:
        """Logs; reads of runs/ and datasets/ (and the prefix whose uploads trigger it); writes of the kinds of object
        its step creates alone (``wiring.Function.writes``) and deletes of those it deletes (``deletes``: superseded
        carried state, a foreign object it replaces); the table; its own topics and queues; the answers to a run's
        execution its step gives (``answers``). The dead-letter reader: only what failing a run takes."""
        role = iam.Role(
            self,
            f"{pascal(fn.name)}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"slsml {fn.name}",
        )
        log_group.grant_write(role)
        self._answer_executions(role, fn)
        for grant in deployment.signing_grants(fn, self._signing_key.key_arn):
            role.add_to_policy(iam.PolicyStatement.from_json(grant))
        if fn.reads_dead_letters:  # the run item's update and the execution's task failure (its queues: their own)
            # a deadline SQS moved is re-checked as the watchdog would (``steps.dead_letters``): the run's public keys
            # (its KEY item, and the launch's vouch for them: its signing grants) and its run.json are read
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["dynamodb:GetItem", "dynamodb:UpdateItem"], resources=[self._table.table_arn]
                )
            )
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["s3:GetObject"], resources=[self._bucket.arn_for_objects(keys.RUN_CONFIG_OBJECTS)]
                )
            )
            NagSuppressions.add_resource_suppressions(
                role,
                [
                    NagPackSuppression(
                        id="AwsSolutions-IAM5",
                        reason="Objects are keyed by run: a run's run.json is read by run; X-Ray accepts no resource"
                        " but *.",
                        applies_to=[RegexAppliesTo(regex=OBJECT_KINDS_REGEX), "Resource::*"],
                    )
                ],
                apply_to_children=True,
            )
            return role
        readable = [self._bucket.arn_for_objects(f"{prefix}*") for prefix in deployment.READABLE_PREFIXES]
        notified = [self._bucket.arn_for_objects(f"{prefix}*") for prefix in wiring.notified_prefixes(fn)]
        role.add_to_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=list(dict.fromkeys(readable + notified)))
        )
        # ListBucket makes a GET/HEAD of a missing key answer 404 (not 403), which storage.head relies
        # on; IfExists: that check carries no s3:prefix, a listing must stay within the readable prefixes.
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self._bucket.bucket_arn],
                conditions={"StringLikeIfExists": {"s3:prefix": [f"{p}*" for p in deployment.READABLE_PREFIXES]}},
            )
        )
        if fn.writes:
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["s3:PutObject"], resources=[self._bucket.arn_for_objects(p) for p in fn.writes]
                )
            )
        if keys.SCRATCH_OBJECTS in fn.writes:  # written with the expiry tag; a large one in parts, aborted on failure
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["s3:PutObjectTagging", "s3:AbortMultipartUpload"],
                    resources=[self._bucket.arn_for_objects(keys.SCRATCH_OBJECTS)],
                )
            )
        if fn.deletes:
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["s3:DeleteObject"], resources=[self._bucket.arn_for_objects(p) for p in fn.deletes]
                )
            )
        role.add_to_policy(iam.PolicyStatement(actions=TABLE_ACTIONS, resources=[self._table.table_arn]))
        for topic in fn.publishes:
            grant_publish(self._topics[topic.name], role)
        for queue in fn.sends:
            self._queues[queue.name].grant_send_messages(role)
        if fn.starts_runs:
            self._state_machine.grant_start_execution(role)
            self._state_machine.grant_execution(role, "states:DescribeExecution")
        NagSuppressions.add_resource_suppressions(
            role,
            [
                NagPackSuppression(
                    id="AwsSolutions-IAM5",
                    reason="Objects are keyed by run and iteration, so access is granted per prefix and kind of"
                    " object (read runs/ and datasets/, and the prefix whose uploads trigger the function; write the"
                    " kinds of object under runs/ its step creates); a run starter follows the executions it starts,"
                    " whose names are run ids; X-Ray accepts no resource but *.",
                    applies_to=[
                        RegexAppliesTo(regex=r"/^Resource::<.+\.Arn>\/(runs|datasets|incoming)\/\*$/g"),
                        RegexAppliesTo(regex=OBJECT_KINDS_REGEX),
                        RegexAppliesTo(regex=r"/^Resource::arn:<AWS::Partition>:states:.*:execution:.*:\*$/g"),
                        "Resource::*",
                    ],
                )
            ],
            apply_to_children=True,
        )
        return role

    def _forget_failed_messages(self, fn: wiring.Function) -> None:
        """DeleteItem on the function's own message records (``IDEMPOTENCY_PARTITION_PREFIX`` and its name), and on no
        other item: a policy of its own, for it names the function (the role's default policy is one the function waits
        for)."""
        function = self.functions[fn.name]
        role = function.role
        assert role is not None
        partition = Fn.join("", [IDEMPOTENCY_PARTITION_PREFIX, function.function_name])
        iam.Policy(
            self,
            f"{pascal(fn.name)}MessageRecords",
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    actions=["dynamodb:DeleteItem"],
                    resources=[self._table.table_arn],
                    conditions={"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [partition]}},
                )
            ],
        )

    def _answer_executions(self, role: iam.Role, fn: wiring.Function) -> None:
        """The task-token calls its step makes to a run's execution, and no other."""
        if fn.answers:
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=[f"states:{answer}" for answer in fn.answers],
                    resources=[self._state_machine.state_machine_arn],
                )
            )
