"""The attack matrix, against the local cloud while a healthy run trains, all sent with boto3: messages that are
well-formed but that the pipeline did not send (unsigned, changed on their way, replayed from another run, signed by
a role with its own key but of a kind its step does not send), sent to its topics and queues — each is rejected
(logged, dead-lettered, counted); objects placed where the run's next update, next model and final model will be
written — none is trusted for sitting at the expected key: each is replaced by the step's own; and an overwrite of a
completed run's final model — detected by every reader of it. Each run completes with weights bit-identical to an
undisturbed run's. (The bucket's policy refuses a PUT without If-None-Match of an update, in the local cloud as on
AWS: the objects are placed create-only, so that what is tested is the pipeline's own checks; a delete under runs/
with the owner's credentials, and a Worker's signed PUT replayed with another body, are refused outright.) What is
changed behind the pipeline's back (the run item, a manifest, a shard, a shard entering iteration 0, the dataset,
run.json, the model the run started from, the last model before its final copy, an update replaced twice) fails the
run naming it; an update replaced once is refused and its round computed anew, and the run completes bit-identical to
an undisturbed one. Models dropped meanwhile that are too large to load (a zip bomb, a config
declaring gigabytes of weights, an oversized run request) are refused by name."""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial
from typing import Any

import boto3
import numpy as np
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.exceptions import ClientError
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from slsml.aws.storage import etag_of
from slsml.client import demo, runs
from slsml.data import datasets as data
from slsml.local.cloud import REGION
from slsml.local.faults import Delay, Faults
from slsml.pipeline import launch, proof
from slsml.pipeline.proof import RunKeys
from slsml.pipeline.steps.merger import GENERATION_METADATA, MERGED_METADATA
from slsml.spec import keys, wiring
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec
from slsml.spec.deployment import VOUCH, Metric
from slsml.spec.errors import SlsmlError
from slsml.spec.messages import Manifest, ReduceDone, WorkDone
from slsml.state import records
from slsml.training import feedback, modelio, npz, shards, updates
from tests import archives

from .conftest import DIGITS, dead_letters, final_weights, finish, log_entries, train
from .test_orchestration import _execution

RUN, REFERENCE = "attacked", "attacked-reference"
SPEC = TrainingSpec(workers=2, reducers=2, global_batch=64, iterations=4, eval_every=0)
ETAG = etag_of(b"")  # an update's ETag, as a report names it
AT = 2  # the iteration the run is in when the messages come
# reads of the weights entering iteration AT take 6 s (workers', then reducers'): the run is still in it while
# the messages are retried and dead-lettered, and before its next objects are written
PARTICIPANTS = [{"worker": 0, "samples": 32, "etag": ETAG}, {"worker": 1, "samples": 32, "etag": ETAG}]


def _message(**fields: Any) -> str:
    return json.dumps({"run_id": RUN, "iteration": AT, **fields})


UNSIGNED = "carries no proof of origin"
NOT_HOLDING = "its proof of origin does not hold"
# (topic, or "deadlines" for the watchdog's queue), body, the function it reaches, what its rejection says: each would
# fit the run but for its proof of origin (none: the pipeline did not send it)
ROWS: list[tuple[str, str, str, str]] = [
    ("Reduce", _message(shard=0, participants=[{"worker": 0, "samples": 64, "etag": ETAG}]), "reducer", UNSIGNED),
    ("Work", _message(iteration=AT + 1, worker=0, workers=2), "worker", UNSIGNED),
    (
        "WorkDone",
        _message(worker=1, samples=32, loss=0.1, compute_s=1, finite=False, etag=ETAG),
        "reduce_launcher",
        UNSIGNED,
    ),
    ("ReduceDone", _message(shard=1), "merger", UNSIGNED),
    (
        "RunControl",
        json.dumps({"run_id": RUN, "task_token": "forged"}),
        "work_launcher",
        "no execution of run 'attacked' waits on its task token",
    ),
    # deadlines due now at each of the chain's first links: at the floor, at the run's last retry, of the reduce stage
    *[
        ("deadlines", _message(stage="work", round=round_, due_at=1.0, link=k), "watchdog", UNSIGNED)
        for k in range(6)
        for round_ in (0, TrainingSpec().deadline_retries)
    ],
    *[("deadlines", _message(stage="reduce", round=2, due_at=1.0, link=k), "watchdog", UNSIGNED) for k in range(6)],
    ("deadlines", _message(stage="work", round=0, due_at=1.0, forged=True), "watchdog", "Extra inputs"),
]


def _kms_as(local, function: str) -> Any:
    """A KMS client of the local cloud signing with ``function``'s role's credentials."""
    signing = local.deployment.signing_as(function)
    return boto3.client(
        "kms",
        endpoint_url=local.deployment.endpoint,
        region_name=REGION,
        aws_access_key_id=signing["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=signing["AWS_SECRET_ACCESS_KEY"],
    )


def _as(local, services, function: str) -> RunKeys:
    """The run keys of ``function``, with its role's credentials."""
    return RunKeys(services.table, _kms_as(local, function), local.deployment.signing_key, function)


def _signed_rows(local, services) -> list[tuple[str, str, str, str]]:
    """A report the pipeline signed, changed on its way (its update made non-finite); one of the undisturbed run,
    sent under this run's name (replayed from another run); and messages a role signed with its own key, with its own
    credentials, that its kind does not send: a Reducer's non-finite report, a Worker's shard done."""
    done = WorkDone(run_id=RUN, iteration=AT, worker=1, samples=32, loss=0.1, compute_s=1, etag=ETAG)
    changed = services.keys.sign(done).model_copy(update={"finite": False, "loss": 0.0})
    other = services.keys.sign(done.model_copy(update={"run_id": REFERENCE})).model_copy(update={"run_id": RUN})
    by_reducer = _as(local, services, "reducer").sign(done.model_copy(update={"finite": False, "loss": 0.0}))
    by_worker = _as(local, services, "worker").sign(ReduceDone(run_id=RUN, iteration=AT, shard=1))
    return [
        ("WorkDone", changed.model_dump_json(), "reduce_launcher", NOT_HOLDING),
        ("WorkDone", other.model_dump_json(), "reduce_launcher", NOT_HOLDING),
        ("WorkDone", by_reducer.model_dump_json(), "reduce_launcher", "'reducer', which does not send WorkDone"),
        ("ReduceDone", by_worker.model_dump_json(), "merger", "'worker', which does not send ReduceDone"),
    ]


def test_a_role_can_unseal_its_own_kinds_key_alone(local, services, undisturbed):
    """With each role's credentials, each kind's sealed private key of a run: the role's own opens; another kind's is
    refused by the signing key's policy, and opens no more with the role's own kind named in its context."""
    sealed = services.table.run_keys(REFERENCE)
    assert sealed is not None and sorted(sealed.keys) == sorted(wiring.SIGNERS)
    opened = set()
    for fn in wiring.FUNCTIONS:
        kms = _kms_as(local, fn.name)
        for kind, key in sealed.keys.items():
            unseal = partial(kms.decrypt, KeyId=local.deployment.signing_key, CiphertextBlob=key.sealed)
            try:
                unseal(EncryptionContext=proof.context(REFERENCE, kind))
                opened.add((fn.name, kind))
            except ClientError as error:
                assert error.response["Error"]["Code"] == "AccessDeniedException", (fn.name, kind, error)
            if kind != fn.name and fn.name in wiring.SIGNERS:  # its own kind named: the sealed key does not open
                with pytest.raises(ClientError, match="InvalidCiphertext"):
                    unseal(EncryptionContext=proof.context(REFERENCE, fn.name))
    assert opened == {(kind, kind) for kind in wiring.SIGNERS}


@pytest.fixture(scope="module")
def undisturbed(services, digits) -> np.ndarray:
    """The final weights of the run undisturbed."""
    train(services, SPEC, REFERENCE)
    assert finish(services, REFERENCE).status == "COMPLETED"
    return final_weights(services, REFERENCE)[0]


def _hold(local, services, run_id: str, spec: TrainingSpec = SPEC) -> float:
    """Start ``run_id`` with the reads entering iteration AT held (6 s each); returns once it is in AT, with the
    time left to act on it."""
    local.host.faults = Faults(
        s3_get_delay=Delay(probability=1, seconds=6),
        s3_get_delay_match=rf"^runs/{run_id}/iters/{AT:06d}/(weights\.npy|shards/)",
    )
    train(services, spec, run_id)
    deadline = time.monotonic() + 120
    while services.table.get_run(run_id).iteration < AT:
        assert time.monotonic() < deadline, "the run never reached the iteration the attack comes in"
        time.sleep(0.05)
    return deadline


def test_messages_that_do_not_belong_to_a_run_are_rejected_and_change_nothing(local, services, undisturbed):
    sns = boto3.client("sns", endpoint_url=local.deployment.endpoint, region_name=REGION)
    sqs = boto3.client("sqs", endpoint_url=local.deployment.endpoint, region_name=REGION)
    try:
        deadline = _hold(local, services, RUN)
        token = services.table.get_run(RUN).task_token
        rows = ROWS + _signed_rows(local, services)
        for topic, body, *_ in rows:
            if topic == "deadlines":
                sqs.send_message(QueueUrl=local.deployment.deadline_queue_url, MessageBody=body)
            else:
                sns.publish(TopicArn=local.deployment.topic_arns[topic], Message=body)
        bodies = {body: (function, problem) for _, body, function, problem in rows}
        letters = dead_letters(local, bodies, deadline + 60 - time.monotonic())
        during = services.table.get_run(RUN)
    finally:
        local.host.faults = None
    assert during.status == "RUNNING", f"the run was {during.status} meanwhile: {during.reason}"
    assert during.task_token == token  # a forged start did not replace the execution's token
    missing = [bodies[b] for b in set(bodies) - set(letters)]
    assert not missing, f"not dead-lettered: {missing}"
    wrong = [
        (letters[body], function, problem)
        for body, (function, problem) in bodies.items()
        if not (
            letters[body]["function"] == function and letters[body]["rejected"] and problem in letters[body]["error"]
        )
    ]
    assert not wrong, wrong

    run = finish(services, RUN)
    assert run.status == "COMPLETED", run.reason
    assert run.iteration == SPEC.iterations
    assert np.array_equal(final_weights(services, RUN)[0], undisturbed)


# What is changed behind the pipeline's back while a run trains, each with boto3 as a hand with access to the table
# or the bucket would: the run fails with a reason naming what changed, before it goes past the iteration after the
# change (a step notices it, no deadline has to come; a deleted key: the first step that reads it), within one deadline
# period, rather than training on it or hanging.
EDITED, MANIFEST, DELETED, SWAPPED = "item-edited", "manifest-replaced", "shard-deleted", "dataset-swapped"
CONFIGURED, FINAL = "config-replaced", "final-swapped"
UPDATED, SHARDED, KEYLESS, PRECLAIMED = "update-replaced", "shard-replaced", "key-deleted", "launch-preclaimed"
RESIDUAL = "residual-replaced"
INITIAL, SOURCE, PLANTED = "initial-shard-replaced", "source-replaced", "key-planted"
PINNED = "digits-pinned"  # the swapped run's dataset, of no other run: no warm function holds its shards


def _edit_run_item(local, s3, services) -> tuple[str, str, int]:
    """``training.iterations`` of the run item raised by hand (UpdateItem) while the run is in AT."""
    _hold(local, services, EDITED)
    dynamodb = boto3.resource("dynamodb", endpoint_url=local.deployment.endpoint, region_name=REGION)
    table = dynamodb.Table(services.table.table.name)
    item = {records.PARTITION_KEY.name: f"RUN#{EDITED}", records.SORT_KEY.name: records.META}
    training = json.loads(table.get_item(Key=item, ConsistentRead=True)["Item"]["training"])
    table.update_item(
        Key=item,
        UpdateExpression="SET training = :training",
        ExpressionAttributeValues={":training": json.dumps(training | {"iterations": SPEC.iterations + 2})},
    )
    return EDITED, f"training.iterations is {SPEC.iterations + 2}, run.json says {SPEC.iterations}", AT


def _replace_manifest(local, s3, services) -> tuple[str, str, int]:
    """A plain PUT over the manifest of the model entering AT + 1, as soon as the Merger stored it (its reads are
    held 6 s), naming the shards in another order."""
    key = keys.manifest(MANIFEST, AT + 1)
    local.host.faults = Faults(s3_get_delay=Delay(probability=1, seconds=6), s3_get_delay_match=rf"^{re.escape(key)}$")
    train(services, SPEC, MANIFEST)
    _wait_for(lambda: services.store.exists(key), "the Merger never stored the manifest")
    stored = Manifest.model_validate_json(services.store.get(key))
    s3.put_object(
        Bucket=services.store.bucket,
        Key=key,
        Body=stored.model_copy(update={"shards": stored.shards[::-1]}).model_dump_json().encode(),
    )
    return MANIFEST, f"{key} is not the object the pipeline stored there", AT + 1


def _delete_shard(local, s3, services) -> tuple[str, str, int]:
    """A DeleteObject of a shard (weights and optimizer state) entering AT, before its reads (held 6 s), by a hand
    holding a Worker's credentials: the bucket's policy refuses deletes under runs/ to all but the roles of the steps
    that delete each kind (a Worker deletes scratch)."""
    _hold(local, services, DELETED)
    key = keys.shard(DELETED, AT, 1)
    with pytest.raises(ClientError, match="AccessDenied"):  # the owner's credentials: refused
        s3.delete_object(Bucket=services.store.bucket, Key=key)
    _as_function(local, "worker").delete_object(Bucket=services.store.bucket, Key=key)
    return DELETED, f"{key} does not exist, though the run has not moved past it: it was deleted behind", AT


def _swap_dataset_shard(local, s3, services) -> tuple[str, str, int]:
    """The run's dataset's train shard replaced (other bytes of its length) once its first iteration is launched,
    before the workers' first reads of it (held 6 s)."""
    data.put_dataset(services.store, PINNED, *demo.digits())
    key = keys.dataset_shard(PINNED, "train", 0)
    local.host.faults = Faults(
        s3_get_delay=Delay(probability=1, seconds=6),
        s3_get_delay_match=rf"^{re.escape(keys.dataset_shards(PINNED, 'train'))}",
    )
    launch.start_run(services, modelio.save_model(demo.digits_cnn(seed=1)), PINNED, SPEC, run_id=SWAPPED)
    _wait_for(lambda: services.table.get_counter(SWAPPED, 0).workers is not None, "the run was never launched")
    s3.put_object(Bucket=services.store.bucket, Key=key, Body=services.store.get(key)[::-1])
    return SWAPPED, f"dataset {PINNED!r}: train shard 0 is not the one its manifest lists", 0


def _replace_run_json(local, s3, services) -> tuple[str, str, int]:
    """``run.json`` replaced (a learning rate of 0.3) as soon as ``run start`` returned, before any step
    reads it (its reads are held 6 s): the owner's DeleteObject is refused, so the hand is one that may lift the
    bucket's policy for the while (``s3:PutBucketPolicy``) and delete it and PUT its own."""
    key = keys.run_config(CONFIGURED)
    local.host.faults = Faults(s3_get_delay=Delay(probability=1, seconds=6), s3_get_delay_match=rf"^{re.escape(key)}$")
    train(services, SPEC, CONFIGURED)
    bucket = services.store.bucket
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.delete_object(Bucket=bucket, Key=key)
    stored = RunConfig.model_validate_json(services.store.get(key))
    faster = stored.optimizer.model_copy(update={"learning_rate": 0.3})
    _replace_lifting_policy(s3, bucket, key, stored.model_copy(update={"optimizer": faster}).stored())
    return CONFIGURED, f"{key} is not the run.json run '{CONFIGURED}' registered: it was replaced", 0


def _replace_lifting_policy(s3, bucket: str, key: str, body: bytes) -> None:
    """``key`` deleted and ``body`` PUT in its place by a hand that lifts the bucket's policy for the while."""
    policy = s3.get_bucket_policy(Bucket=bucket)["Policy"]
    s3.delete_bucket_policy(Bucket=bucket)
    try:
        s3.delete_object(Bucket=bucket, Key=key)
        s3.put_object(Bucket=bucket, Key=key, Body=body)
    finally:
        s3.put_bucket_policy(Bucket=bucket, Policy=policy)


def _swap_final_model(local, s3, services) -> tuple[str, str, int]:
    """A plain PUT of the run's initial (untrained) model over the last model the Merger stored
    (``models/<iterations>.keras``), before the final copy of it is made: the final evaluation's reads are held 6 s."""
    last = SPEC.iterations
    key = keys.model(FINAL, last)
    local.host.faults = Faults(
        s3_get_delay=Delay(probability=1, seconds=6), s3_get_delay_match=rf"^runs/{FINAL}/iters/{last:06d}/shards/"
    )
    train(services, SPEC, FINAL)
    _wait_for(lambda: services.store.exists(key), "the Merger never stored the last model")
    s3.put_object(Bucket=services.store.bucket, Key=key, Body=services.store.get(keys.source_model(FINAL)))
    return FINAL, f"{key} is not the model the Merger stored: it was replaced behind the pipeline's back", last


def _replace_updates(local, services, run_id: str, attempts: int) -> str:
    """Worker 0's update of AT, once stored, deleted and created anew (create-only) with its metadata and its values
    scaled by −40, before the reducers read it (their reads of worker 0's updates are held 6 s): by a hand holding a
    Worker's credentials (its role deletes scratch; the owner's delete is refused); and so for each of the next
    ``attempts`` − 1 updates of the round, as each re-launch of it stores its own. The key of the last replaced."""
    local.host.faults = Faults(
        s3_get_delay=Delay(probability=1, seconds=6),
        s3_get_delay_match=rf"^{re.escape(keys.update(run_id, AT, 0, 0).rpartition('/')[0])}/",
    )
    train(services, SPEC, run_id)
    for attempt in range(attempts):
        key = keys.update(run_id, AT, 0, attempt)
        _wait_for(partial(services.store.exists, key), f"worker 0 never stored its update of attempt {attempt}")
        stored = services.store.read(key)
        vector, samples = updates.decode(stored.body)
        scaled, _ = updates.encode(vector * -40, samples)
        _recreate(local, services, key, scaled, stored.metadata)
    return key


def _replace_update_twice(local, s3, services) -> tuple[str, str, int]:
    """Worker 0's update of AT replaced (``_replace_updates``): its round is re-launched once; and the update of that
    re-launch replaced too: the run fails naming it."""
    key = _replace_updates(local, services, UPDATED, attempts=2)
    return UPDATED, f"{key} is not the update worker 0 reported", AT


def _replace_shard(local, s3, services) -> tuple[str, str, int]:
    """Shard 1 entering AT (weights and optimizer state), once the workers read it (the reduce fired), deleted and
    created anew with its weights + 1, before its reducer reads it (held 6 s), by a hand holding a Worker's
    credentials."""
    _hold(local, services, SHARDED)
    _wait_for(lambda: services.table.get_counter(SHARDED, AT).reduce_fired_by is not None, "the reduce never fired")
    key = keys.shard(SHARDED, AT, 1)
    stored = shards.decode(services.store.get(key))
    _recreate(local, services, key, shards.encode(shards.Shard(stored.weights + 1, stored.state, stored.averaged)))
    return SHARDED, f"{key} is not the shard the manifest of iteration {AT} names", AT


def _replace_residual(local, s3, services) -> tuple[str, str, int]:
    """Worker 0's residual of AT − 1 (what compression left out of its updates so far, which it adds to its update of
    AT) deleted and created anew as ones, before the worker reads it (its reads entering AT are held 6 s), by a hand
    holding a Worker's credentials."""
    _hold(local, services, RESIDUAL, HANDED_SPEC.model_copy(update={"eval_every": 0}))
    key = keys.residual(RESIDUAL, AT - 1, 0)
    _recreate(local, services, key, feedback.encode_residual(np.ones(len(services.store.get(key)) // 2, np.float32)))
    return RESIDUAL, f"{key} is not the object the pipeline stored there", AT


def _replace_initial_shard(local, s3, services) -> tuple[str, str, int]:
    """Shard 1 entering iteration 0 (weights and optimizer state), which run.json names by its ETag, deleted and
    created anew with its weights + 1 as soon as ``run start`` returned, before any step reads it (their reads of it
    are held 6 s), by a hand holding a Worker's credentials."""
    key = keys.shard(INITIAL, 0, 1)
    local.host.faults = Faults(s3_get_delay=Delay(probability=1, seconds=6), s3_get_delay_match=rf"^{re.escape(key)}$")
    train(services, SPEC, INITIAL)
    stored = shards.decode(services.store.get(key))
    _recreate(local, services, key, shards.encode(shards.Shard(stored.weights + 1, stored.state, stored.averaged)))
    return INITIAL, f"{key} is not the shard entering iteration 0 that run.json names", 0


def _replace_source_model(local, s3, services) -> tuple[str, str, int]:
    """The model the run was started with (``source.keras``, which run.json names by its SHA-256 and the steps build
    their models from), replaced by a loadable model of its shape with other weights as soon as ``run start``
    returned, before any step reads it (their reads of it are held 6 s), by a hand that may lift the bucket's policy
    (no role deletes it)."""
    key = keys.source_model(SOURCE)
    local.host.faults = Faults(s3_get_delay=Delay(probability=1, seconds=6), s3_get_delay_match=rf"^{re.escape(key)}$")
    train(services, SPEC, SOURCE)
    _replace_lifting_policy(s3, services.store.bucket, key, modelio.save_model(demo.digits_cnn(seed=7)))
    return SOURCE, f"{key} is not the model run.json names (its SHA-256)", 0


def _delete_run_key(local, s3, services) -> tuple[str, str, int]:
    """The run's message key (its KEY item) deleted by hand (DeleteItem) while the run is in AT: containers that keep
    the key read before go on proving the run's messages under it (the key it had), and the first step that needs it
    from the table fails the run, whichever iteration that is in."""
    _hold(local, services, KEYLESS)
    dynamodb = boto3.resource("dynamodb", endpoint_url=local.deployment.endpoint, region_name=REGION)
    dynamodb.Table(services.table.table.name).delete_item(
        Key={records.PARTITION_KEY.name: f"RUN#{KEYLESS}", records.SORT_KEY.name: records.KEY}
    )
    named = f"run {KEYLESS!r} lost its signing keys (its KEY item was deleted behind the pipeline's back)"
    return KEYLESS, named, SPEC.iterations


def _plant_run_keys(local, s3, services) -> tuple[str, str, int]:
    """The run's KEY item put by hand (PutItem), after its start stored run.json and before its execution launches
    it, with key pairs of a Worker's making (a role that writes the run table): the Worker's role may not vouch for
    keys of its own (kms:Encrypt), and the launch takes no keys without a vouch that holds for them."""
    config = launch.prepare_run(services, modelio.save_model(demo.digits_cnn(seed=1)), DIGITS, SPEC, run_id=PLANTED)
    kms = _kms_as(local, "worker")
    with pytest.raises(ClientError, match="AccessDeniedException"):
        kms.encrypt(
            KeyId=local.deployment.signing_key, Plaintext=b"keys", EncryptionContext=proof.context(PLANTED, VOUCH)
        )
    made = {}
    for kind in wiring.SIGNERS:
        pair = ec.generate_private_key(ec.SECP256R1())
        made[kind] = pair.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    dynamodb = boto3.resource("dynamodb", endpoint_url=local.deployment.endpoint, region_name=REGION)
    dynamodb.Table(services.table.table.name).put_item(
        Item={
            records.PARTITION_KEY.name: f"RUN#{PLANTED}",
            records.SORT_KEY.name: records.KEY,
            "public": made,
            "sealed": {kind: b"sealed by no one" for kind in made},
        }
    )
    launch.launch_run(services, config)
    return PLANTED, f"run {PLANTED!r}'s signing keys (its KEY item) are not the ones its launch made", 0


def _preclaim_launch(local, s3, services) -> tuple[str, str, int]:
    """The counter of iteration AT + 1 put by hand (PutItem) with a launch claim of its own while the run is in AT:
    the WorkLauncher's launch of it is skipped, and the run fails naming the claim (nothing launched the workers)."""
    _hold(local, services, PRECLAIMED)
    dynamodb = boto3.resource("dynamodb", endpoint_url=local.deployment.endpoint, region_name=REGION)
    claimed = {
        records.PARTITION_KEY.name: f"RUN#{PRECLAIMED}",
        records.SORT_KEY.name: records.iteration_sk(AT + 1),
        "launched_by": "forged",
    }
    dynamodb.Table(services.table.table.name).put_item(Item=claimed)
    named = f"the launch of iteration {AT + 1} was claimed behind the pipeline's back: its ITER#{AT + 1:06d} item"
    return PRECLAIMED, f"{named} names 'forged', which launched nothing", AT + 1


def _recreate(local, services, key: str, body: bytes, metadata: dict[str, str] | None = None) -> None:
    """``key`` deleted and created anew (create-only) with ``body``, with a Worker's credentials."""
    worker = _as_function(local, "worker")
    worker.delete_object(Bucket=services.store.bucket, Key=key)
    worker.put_object(Bucket=services.store.bucket, Key=key, Body=body, Metadata=metadata or {}, IfNoneMatch="*")


def _as_function(local, function: str) -> Any:
    """An S3 client signing with ``function``'s credentials, as its role."""
    key, secret = local.deployment.identities[function]
    return boto3.client(
        "s3",
        endpoint_url=local.deployment.endpoint,
        region_name=REGION,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(signature_version="s3v4"),
    )


def _replayed(local, key: str, signed_for: bytes, sent: bytes) -> tuple[int, bytes]:
    """The bucket's answer to a create-only PUT of ``key`` that a Worker signed for the body ``signed_for``, sent
    (captured on its way, within the 15 minutes its signature lasts) with the body ``sent``."""
    url = f"{local.deployment.endpoint}/{local.deployment.bucket}/{key}"
    request = AWSRequest(method="PUT", url=url, data=signed_for, headers={"If-None-Match": "*"})
    S3SigV4Auth(local.cloud.identities["worker"], "s3", REGION).add_auth(request)
    replay = urllib.request.Request(url, data=sent, headers=dict(request.headers.items()), method="PUT")
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(replay, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def _wait_for(condition: Callable[[], bool], failure: str) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.05)


@pytest.mark.parametrize(
    "change",
    [
        _edit_run_item,
        _replace_manifest,
        _delete_shard,
        _swap_dataset_shard,
        _replace_run_json,
        _swap_final_model,
        _replace_update_twice,
        _replace_shard,
        _replace_residual,
        _replace_initial_shard,
        _replace_source_model,
        _delete_run_key,
        _plant_run_keys,
        _preclaim_launch,
    ],
)
def test_what_is_changed_behind_the_pipelines_back_fails_the_run_naming_it(local, services, digits, change):
    s3 = boto3.client("s3", endpoint_url=local.deployment.endpoint, region_name=REGION)
    try:
        run_id, named, changed_in = change(local, s3, services)
        local.host.faults = None  # the change is made: the reads it was made before are held no more
        changed = time.monotonic()
        run = finish(services, run_id)
    finally:
        local.host.faults = None
    assert run.status == "FAILED" and named in (run.reason or ""), run.reason
    assert run.iteration <= changed_in + 1, f"the run went on to iteration {run.iteration}: {run.reason}"
    assert time.monotonic() - changed < SPEC.deadline_s  # within one deadline period, not at the heartbeat
    execution, _ = _execution(local, run_id)  # ended by the step that failed the run, or by the watchdog it asked
    assert (execution["status"], execution.get("cause")) == ("FAILED", run.reason)


REDONE = "update-redone"


def test_a_replaced_update_is_refused_and_its_round_computed_anew(local, services, undisturbed):
    """Worker 0's update of AT replaced (``_replace_updates``) once: each reducer refuses it, counted; its worker's
    round is re-launched once, under the same inputs, and the reduce fired again with the fresh update: the run
    completes bit-identical to the undisturbed run."""
    try:
        replaced = _replace_updates(local, services, REDONE, attempts=1)
        run = finish(services, REDONE)
    finally:
        local.host.faults = None
    assert run.status == "COMPLETED", run.reason
    assert np.array_equal(final_weights(services, REDONE)[0], undisturbed)
    refusals = [
        entry
        for entry in log_entries(local.log_dir / "reducer.log")
        if entry.get("message") == "object refused" and entry.get("key") == replaced
    ]
    assert len(refusals) == SPEC.reducers, refusals  # each reducer read it, and refused it
    relaunched = log_entries(local.log_dir / "reducer.log", message="update refused: its worker's round re-launched")
    assert [(e["run_id"], e["worker"], e["attempt"]) for e in relaunched if e["run_id"] == REDONE] == [(REDONE, 0, 1)]
    counter = services.table.get_counter(REDONE, AT)
    assert counter.redone == {0}
    frozen = services.table.frozen_participants(REDONE, AT)
    assert frozen is not None and [(p.worker, p.attempt) for p in frozen[1]] == [(0, 1), (1, 0)]
    assert frozen[1][0].etag == services.store.read(keys.update(REDONE, AT, 0, 1)).etag


PLACED = "preplaced"


def test_objects_placed_at_a_runs_next_keys_are_not_trusted_and_a_replaced_final_model_is_detected(
    local, services, undisturbed
):
    s3 = boto3.client("s3", endpoint_url=local.deployment.endpoint, region_name=REGION)
    bucket = services.store.bucket
    forged = modelio.save_model(demo.digits_cnn(seed=7))  # a loadable model of the run's shape, other weights
    done = WorkDone(run_id=PLACED, iteration=AT + 1, worker=0, samples=32, loss=0.1, compute_s=1, etag=etag_of(b""))
    elsewhere = Manifest(iteration=AT + 1, shards=[etag_of(forged)] * SPEC.reducers).model_dump_json().encode()
    placed = {  # key → (body, metadata): each claims to be what the pipeline would have written there
        keys.update(PLACED, AT + 1, 0): (b"\0" * 4096, {"done": done.model_dump_json()}),
        keys.manifest(PLACED, AT + 1): (elsewhere, {MERGED_METADATA: str(AT), GENERATION_METADATA: "0"}),
        keys.model(PLACED, SPEC.iterations): (forged, {}),
        keys.final_model(PLACED): (forged, {}),
    }
    try:
        _hold(local, services, PLACED)
        with pytest.raises(ClientError, match="AccessDenied"):  # a plain PUT of an update: the bucket refuses it
            s3.put_object(Bucket=bucket, Key=keys.update(PLACED, AT + 1, 0), Body=b"\0" * 4096)
        for key, (body, metadata) in placed.items():  # create-only PUTs, as any principal with write access could
            s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata=metadata, IfNoneMatch="*")
        # a delete under runs/, which would let a create-only PUT take the object's place: refused to all but the
        # roles that delete its kind (one DeleteObject, one DeleteObjects)
        with pytest.raises(ClientError, match="AccessDenied"):
            s3.delete_object(Bucket=bucket, Key=keys.run_config(PLACED))
        deleting = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": keys.shard(PLACED, AT, 0)}]})
        assert [error["Code"] for error in deleting["Errors"]] == ["AccessDenied"]
        # a Worker's signed PUT of its update replayed with another body: refused, nothing stored
        replayed = keys.update(PLACED, AT + 1, 1)
        status, answer = _replayed(local, replayed, signed_for=b"\1" * 4096, sent=b"\0" * 4096)
        assert status == 403 and b"XAmzContentSHA256Mismatch" in answer, answer
        assert not services.store.exists(replayed)
    finally:
        local.host.faults = None
    run = finish(services, PLACED)
    assert run.status == "COMPLETED", run.reason
    assert np.array_equal(final_weights(services, PLACED)[0], undisturbed)
    # what the run recorded of its final model is what readers are handed: the model the Merger stored last
    assert run.final_sha256 == hashlib.sha256(runs.final_model(services, run)).hexdigest()
    assert (
        run.final_sha256
        == Manifest.model_validate_json(services.store.get(keys.manifest(PLACED, SPEC.iterations))).model_sha256
    )
    for key, (body, _) in placed.items():  # each was replaced by the step's own, and the step said so
        assert services.store.get(key) != body, key
    replaced = {
        entry["key"]
        for log in ("worker", "merger", "watchdog")
        for entry in log_entries(local.log_dir / f"{log}.log")
        if entry.get("message", "").startswith("an object not") and entry.get("key", "").startswith(f"runs/{PLACED}/")
    }
    assert replaced == set(placed)

    # an overwrite of the completed run's final model: every reader of it refuses what it finds there
    s3.put_object(Bucket=bucket, Key=keys.final_model(PLACED), Body=forged)
    with pytest.raises(SlsmlError, match=f"runs/{PLACED}/final.keras is not the final model run '{PLACED}' stored"):
        runs.final_model(services, services.table.get_run(PLACED))


# a run whose steps hand each other state that no message names: the workers' residuals (error feedback), their
# evaluation states, the reducers' averages (the norm exchange)
HANDED_SPEC = SPEC.model_copy(
    update={
        "compress": "topk:0.05",
        "compress_warmup": 0,
        "eval_every": 1,
        "optimizer": OptimizerConfig(name="sgd", learning_rate=0.05, momentum=0.9, global_clipnorm=1.0),
    }
)
HANDED_KINDS = re.compile(r"/iters/\d+/(residuals|evaluation|means)/")


def test_state_placed_where_a_runs_steps_hand_it_on_is_replaced_and_changes_nothing(local, services, digits):
    """Objects placed, before the run starts, at every key where its steps would store the state they hand each other
    without a message naming it (each loadable as what it claims to be where it can be): each is replaced by the
    step's own, and the run ends bit-identical to the same run undisturbed."""
    train(services, HANDED_SPEC, "handed-reference")
    assert finish(services, "handed-reference").status == "COMPLETED"
    residuals = [  # carried state, deleted once superseded: each slot's of each iteration
        keys.residual("handed-reference", i, w) for i in range(SPEC.iterations) for w in range(SPEC.workers)
    ]
    stored = [k for k in services.store.list_keys("runs/handed-reference/iters/") if HANDED_KINDS.search(k)]
    reference = set(residuals + stored)
    assert {HANDED_KINDS.search(k)[1] for k in reference} == {"residuals", "evaluation", "means"}
    size = final_weights(services, "handed-reference")[0].size
    forged = {  # a residual of ones, an evaluation state of zeros, an average of other bytes
        "residuals": feedback.encode_residual(np.ones(size, np.float32)),
        "evaluation": npz.encode_array(np.zeros(3)),
        "means": b"not an average",
    }
    placed = {key.replace("handed-reference", "handed-placed", 1) for key in reference}
    for key in placed:
        services.store.put_new(key, forged[HANDED_KINDS.search(key)[1]])
    logs = [local.log_dir / f"{log}.log" for log in ("worker", "reducer")]
    before = {log: len(log_entries(log)) for log in logs}  # the entries of the runs before, all ended
    train(services, HANDED_SPEC, "handed-placed")
    run = finish(services, "handed-placed")
    assert run.status == "COMPLETED", run.reason
    assert np.array_equal(final_weights(services, "handed-placed")[0], final_weights(services, "handed-reference")[0])
    entries = [entry for log in logs for entry in log_entries(log)[before[log] :]]
    replaced = {
        entry["key"]
        for entry in entries
        if entry.get("message", "").startswith("an object not") and "/handed-placed/" in entry.get("key", "")
    }
    assert replaced == placed
    refusals = Metric.REFUSED_OBJECTS.value
    # each replaced object counted on the dashboard
    assert sum(np.sum(entry[refusals]) for entry in entries if refusals in entry) == len(placed)


BOMBED = "bombed"
# incoming/<name>.keras, its run request, and what its refusal says: each too large for the RunStarter to hold
DROPS: list[tuple[str, bytes, bytes, str]] = [
    ("bomb", archives.bomb(4_000_000_000), b'{"dataset": "digits"}', "the model expands to 4,000,00"),
    ("wide", archives.declaring(30_000), b'{"dataset": "digits"}', "the model declares 3,600,360,008 bytes"),
    (
        "padded",
        archives.small_model(),
        json.dumps({"dataset": "digits", "pad": " " * 70_000}).encode(),
        "incoming/padded.json is too large: 70,0",
    ),
]


def test_models_too_large_to_load_dropped_while_a_run_trains_are_refused_and_change_nothing(
    local, services, undisturbed
):
    s3 = boto3.client("s3", endpoint_url=local.deployment.endpoint, region_name=REGION)
    bucket = services.store.bucket
    train(services, SPEC, BOMBED)
    for name, model, request, _ in DROPS:
        s3.put_object(Bucket=bucket, Key=keys.incoming_request(name), Body=request)
        s3.put_object(Bucket=bucket, Key=f"incoming/{name}.keras", Body=model)
    run = finish(services, BOMBED)
    assert run.status == "COMPLETED", run.reason
    assert np.array_equal(final_weights(services, BOMBED)[0], undisturbed)
    deadline = time.monotonic() + 60
    while (
        len(
            refused := {
                r.run_id.rpartition("-")[0]: r
                for r in services.table.list_runs()
                if r.status == "FAILED" and r.run_id.rpartition("-")[0] in {d[0] for d in DROPS}
            }
        )
        < 3
    ):
        assert time.monotonic() < deadline, f"refused so far: {sorted(refused)}"
        time.sleep(0.1)
    for name, _, _, reason in DROPS:  # each a FAILED run naming why, and nothing stored under runs/
        assert refused[name].reason.startswith(f"incoming/{name}.keras not started: {reason}"), refused[name].reason
        assert services.store.list_keys(keys.run_prefix(refused[name].run_id)) == []
