"""ReduceLauncher, Reducer, Merger and Watchdog against moto: non-finite updates left out (or failing the
run when all are), parts dropped by the reducer's read quorum, barriers that fire once whatever the
duplicates, run-table items whose size does not depend on the fleet, and the watchdog's deadline chain."""

from __future__ import annotations

import hashlib
import json
import struct
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypeVar

import boto3
import numpy as np
import pytest
from moto import mock_aws

from slsml.aws.storage import etag_of
from slsml.local import faults
from slsml.local.faults import Delay, InjectedFault, InvocationFaults
from slsml.pipeline.services import Services, failing_run_on_bad_input
from slsml.pipeline.steps import reduce_launcher, reducer, watchdog, work_launcher
from slsml.pipeline.steps.common import carried_state, load_weights, run_config
from slsml.pipeline.steps.watchdog import Action
from slsml.pipeline.steps.work_launcher import Outcome
from slsml.spec import keys, wiring
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec, config_digest
from slsml.spec.deployment import STAGE_FUNCTIONS
from slsml.spec.errors import RunFailed
from slsml.spec.limits import RunLimits
from slsml.spec.messages import (
    Deadline,
    Manifest,
    ModelLanded,
    ModelMerged,
    Participant,
    ReduceMessage,
    RunStarted,
    WorkDone,
    WorkMessage,
)
from slsml.spec.reliability import READ_QUORUM_ENV, READ_TIMEOUT_ENV
from slsml.spec.shardplan import ShardPlan, VariableSpec
from slsml.state import records
from slsml.state.records import DEADLINE_LAUNCH, DEADLINE_OWNER, iteration_sk, participants_sk, plain, worker_sk
from slsml.training import optimizers, shards, updates

from . import cloud

T = TypeVar("T")
PLAN = ShardPlan.build(
    [VariableSpec(name="kernel", shape=(2, 3), trainable=True), VariableSpec(name="mean", shape=(2,), trainable=False)],
    reducers=2,
)
WEIGHTS = np.linspace(-1, 1, PLAN.size, dtype=np.float32)
SGD = OptimizerConfig(name="sgd", learning_rate=0.1)
RNG = np.random.default_rng(0)
VECTORS = [RNG.standard_normal(PLAN.size).astype(np.float32) for _ in range(4)]
SAMPLES = [4, 4, 8, 4]


@pytest.fixture
def services(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in (READ_TIMEOUT_ENV, READ_QUORUM_ENV):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
        boto3.client("dynamodb", region_name="us-east-1").create_table(**records.create_table_arguments("runs"))
        sns = boto3.client("sns", region_name="us-east-1")
        arns = {t.name: sns.create_topic(Name=t.name)["TopicArn"] for t in wiring.TOPICS}
        deadlines = boto3.client("sqs", region_name="us-east-1").create_queue(QueueName="deadlines")["QueueUrl"]
        # a deployment whose stage functions time out after a second: the runs here have deadlines of seconds
        quick = RunLimits(function_timeouts_s=dict.fromkeys(STAGE_FUNCTIONS, 1))
        cloud.signing_key(monkeypatch)
        yield Services.from_names("bucket", "runs", arns, deadline_queue_url=deadlines, limits=quick)


@pytest.fixture
def sent(services: Services, monkeypatch: pytest.MonkeyPatch) -> list[Deadline]:
    """The deadlines sent (to the real queue) from here on."""
    deadlines: list[Deadline] = []
    schedule = services.deadlines.schedule

    def recording(deadline: Deadline) -> None:
        deadlines.append(deadline)
        schedule(deadline)

    monkeypatch.setattr(services.deadlines, "schedule", recording)
    return deadlines


def _register(
    services: Services,
    run_id: str,
    workers: int,
    quorum: float = 1.0,
    watched: bool = True,
    optimizer: OptimizerConfig = SGD,
    launched: bool = True,
    stage_blocks: tuple[int, ...] | None = None,
    **training: object,
) -> RunConfig:
    """A run as prepare_run leaves it (config, shards and flat weights of iteration 0), with iteration 0
    launched unless ``launched`` is False: the deadline chain is at its first link unless ``watched`` is False;
    ``stage_blocks``: a run in pipeline stages."""
    spec = TrainingSpec(workers=workers, reducers=PLAN.reducers, global_batch=8 * workers, quorum=quorum, **training)
    config = RunConfig(
        run_id=run_id,
        dataset="d",
        training=spec,
        optimizer=optimizer,
        loss="mse",
        classification=False,
        plan=PLAN,
        stage_blocks=stage_blocks,
    )
    services.store.put_json_new(keys.run_config(run_id), config.model_dump(mode="json"))
    for shard in range(PLAN.reducers):
        layout = PLAN.shard(shard)
        state = optimizers.initial_state(optimizer, int(layout.trainable.sum()))
        initial = shards.Shard(WEIGHTS[layout.start : layout.stop], state, averaged=[])
        services.store.put_new(keys.shard(run_id, 0, shard), shards.encode(initial))
    _put_run(services, config, launched)
    if watched:  # the launch's first message, signed, made the run's keys
        services.keys.sign(WorkMessage(run_id=run_id, iteration=0, worker=0, workers=workers))
        assert services.table.watch(run_id, None, 0, None) is not None
    return config


def _manifest(services: Services, run_id: str, iteration: int) -> None:
    """The manifest of ``iteration``, naming its stored shards, as the Merger stores it (its proof of origin)."""
    etags = [services.store.etag(keys.shard(run_id, iteration, r)) or "" for r in range(PLAN.reducers)]
    key, body = keys.manifest(run_id, iteration), Manifest(iteration=iteration, shards=etags).model_dump_json().encode()
    services.store.put_new(key, body, services.keys.sign_object(run_id, key, body))


def _put_run(services: Services, config: RunConfig, launched: bool = True) -> None:
    """The run's record as the state machine registers it, with iteration 0 launched unless ``launched`` is False."""
    spec, digest = config.training, config_digest(config.stored())
    services.table.table.put_item(Item=records.run_item(config.run_id, "d", spec, time.time(), digest))
    if launched:
        assert services.table.claim_launch(config.run_id, 0, "launch-0", 0, spec.workers) is not None


def _done(
    run_id: str, worker: int, finite: bool = True, attempt: int = 0, tracked: bool = False, iteration: int = 0
) -> WorkDone:
    """``tracked``: with a train metrics state (the Merger then turns the sum into figures: of a run with a model
    and data)."""
    samples = SAMPLES[worker % len(SAMPLES)]
    return WorkDone(
        run_id=run_id,
        iteration=iteration,
        worker=worker,
        attempt=attempt,
        samples=samples,
        loss=0.5 if finite else 0.0,
        metrics=_state(worker) if finite and tracked else None,
        compute_s=0.01,
        finite=finite,
        etag=_etag(worker, finite, iteration),
    )


def _update(worker: int, finite: bool = True, iteration: int = 0) -> updates.Encoded:
    """Worker ``worker``'s update of ``iteration`` as it stores it (VECTORS[worker] + iteration): its bytes and
    header."""
    vector = VECTORS[worker % len(VECTORS)] + iteration if finite else np.full(PLAN.size, np.nan, dtype=np.float32)
    return updates.encode(vector, SAMPLES[worker % len(SAMPLES)])


def _etag(worker: int, finite: bool = True, iteration: int = 0) -> str:
    """The ETag S3 gives ``_update``'s bytes."""
    return etag_of(_update(worker, finite, iteration)[0])


def _state(worker: int) -> list[float]:
    """A worker's train metrics state: the loss's sum and samples, then a metric's correct ones and samples."""
    samples = SAMPLES[worker % len(SAMPLES)]
    return [0.5 * samples, samples, worker + 1 / 3, samples]


def _arrive(
    services: Services,
    run_id: str,
    worker: int,
    finite: bool = True,
    attempt: int = 0,
    tracked: bool = False,
    iteration: int = 0,
) -> list[ReduceMessage]:
    """What a worker does (store the update, announce it), then the ReduceLauncher."""
    body, header = _update(worker, finite, iteration)
    done = _done(run_id, worker, finite, attempt, tracked, iteration)  # stored with the update, as the worker does
    services.store.put_new(
        keys.update(run_id, iteration, worker, attempt), body, {"done": done.model_dump_json(), **header}
    )
    return reduce_launcher.on_work_done(done, services)


def _expected_weights(workers: list[int], vectors: list[np.ndarray] = VECTORS) -> np.ndarray:
    """One SGD step on the sample-weighted mean of these workers' vectors (float64 sums in worker order)."""
    mean = np.zeros(PLAN.size, dtype=np.float64)
    for w in workers:
        mean += vectors[w].astype(np.float64) * SAMPLES[w]
    mean = (mean / sum(SAMPLES[w] for w in workers)).astype(np.float32)
    trainable = PLAN.trainable_mask()
    stepped, _ = optimizers.apply(
        SGD, WEIGHTS[trainable], mean[trainable], optimizers.initial_state(SGD, int(trainable.sum()))
    )
    expected = WEIGHTS.copy()
    expected[trainable], expected[~trainable] = stepped, mean[~trainable]
    return expected


def _shard(services: Services, run_id: str, iteration: int, shard: int) -> shards.Shard:
    return shards.decode(services.store.get(keys.shard(run_id, iteration, shard)), PLAN.shard(shard).size)


def _new_weights(services: Services, run_id: str) -> np.ndarray:
    return np.concatenate([_shard(services, run_id, 1, r).weights for r in range(PLAN.reducers)])


def _part(array: np.ndarray, shard: int) -> np.ndarray:
    return array[PLAN.shard(shard).start : PLAN.shard(shard).stop]


def _assert_kept(services: Services, run_id: str, shard: int) -> None:
    """``shard`` enters iteration 1 with the weights and optimizer state it entered iteration 0 with."""
    kept = _shard(services, run_id, 1, shard)
    assert kept.kept and kept.averaged == []
    assert np.array_equal(kept.weights, _part(WEIGHTS, shard))
    assert int(kept.state["step"]) == 0


def test_a_non_finite_update_is_left_out(services: Services) -> None:
    _register(services, "one-nan", workers=3)
    assert _arrive(services, "one-nan", 0) == []
    assert _arrive(services, "one-nan", 1, finite=False) == []
    fired = _arrive(services, "one-nan", 2)  # everyone is in: the reduce fires without worker 1
    assert [m.shard for m in fired] == [0, 1]
    assert [(p.worker, p.samples) for p in fired[0].participants] == [(0, 4), (2, 8)]
    record = services.table.get_iteration("one-nan", 0)
    assert record.nonfinite == {1} and record.done == {0, 1, 2}
    assert [p.worker for p in record.participants] == [0, 2]
    assert (record.reduce_fired_by, record.participant_count) == (2, 2)
    for message in fired:
        reducer.reduce(message, services)
    assert np.array_equal(_new_weights(services, "one-nan"), _expected_weights([0, 2]))  # bit for bit
    assert [_shard(services, "one-nan", 1, r).averaged for r in range(2)] == [[0, 2], [0, 2]]
    assert int(_shard(services, "one-nan", 1, 0).state["step"]) == 1
    assert services.table.get_iteration("one-nan", 0).dropped_parts == set()
    assert services.table.get_run("one-nan").status == "RUNNING"


def test_the_quorum_counts_finite_updates_only(services: Services) -> None:
    _register(services, "half-nan", workers=4, quorum=0.5)
    assert _arrive(services, "half-nan", 0, finite=False) == []
    assert _arrive(services, "half-nan", 1) == []  # two in, but one finite: below ⌈0.5·4⌉
    fired = _arrive(services, "half-nan", 2)
    assert [p.worker for p in fired[0].participants] == [1, 2]
    assert _arrive(services, "half-nan", 3) == []  # late
    record = services.table.get_iteration("half-nan", 0)
    assert record.nonfinite == {0} and record.late == {0, 3}


def test_all_updates_non_finite_fails_the_run(services: Services) -> None:
    _register(services, "all-nan", workers=2)
    assert _arrive(services, "all-nan", 0, finite=False) == []
    assert _arrive(services, "all-nan", 1, finite=False) == []
    run = services.table.get_run("all-nan")
    assert run.status == "FAILED"
    assert run.reason == "all 2 workers produced non-finite updates at iteration 0"
    record = services.table.get_iteration("all-nan", 0)
    assert record.nonfinite == {0, 1} and record.reduce_fired_by is None and record.participants == []


def _slow_part_of_worker_1(services: Services, monkeypatch: pytest.MonkeyPatch, seconds: float) -> InvocationFaults:
    """Reads of worker 1's update take ``seconds``; a reducer waits 0.2 s for a part once half are in."""
    monkeypatch.setenv(READ_TIMEOUT_ENV, "0.2")
    monkeypatch.setenv(READ_QUORUM_ENV, "0.5")
    faults.install(services.store.s3, services.bus.sns)
    return InvocationFaults(s3_get_delay=Delay(probability=1, seconds=seconds), s3_get_delay_match="/updates/00001")


def test_the_reducer_drops_a_part_whose_read_times_out(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    _register(services, "slow-part", workers=3)
    fired = [m for w in range(3) for m in _arrive(services, "slow-part", w)]
    slow = _slow_part_of_worker_1(services, monkeypatch, 1.5)
    started = time.perf_counter()
    for message in fired:
        with faults.invocation(slow) as injected:
            done = reducer.reduce(message, services)
        assert injected == {"s3_get_delay": 1}
        assert (done.iteration, done.shard) == (0, message.shard)
    assert time.perf_counter() - started < 2.5  # neither reducer waited for the slow part
    assert services.table.get_iteration("slow-part", 0).dropped_parts == {"0:1", "1:1"}
    assert np.array_equal(_new_weights(services, "slow-part"), _expected_weights([0, 2]))
    assert [_shard(services, "slow-part", 1, r).averaged for r in range(2)] == [[0, 2], [0, 2]]


def test_with_a_read_quorum_nothing_is_dropped_from_reads_within_the_timeout(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(services, "all-parts", workers=3)
    fired = [m for w in range(3) for m in _arrive(services, "all-parts", w)]
    monkeypatch.setenv(READ_TIMEOUT_ENV, "5")
    monkeypatch.setenv(READ_QUORUM_ENV, "0.5")
    for message in fired:
        reducer.reduce(message, services)
    assert services.table.get_iteration("all-parts", 0).dropped_parts == set()
    assert np.array_equal(_new_weights(services, "all-parts"), _expected_weights([0, 1, 2]))


def test_a_report_of_a_superseded_attempt_is_ignored(services: Services) -> None:
    _register(services, "superseded", workers=2)
    services.table.relaunch_workers("superseded", 0, 0, {1: 1})
    assert _arrive(services, "superseded", 0) == []
    assert _arrive(services, "superseded", 1, attempt=0) == []  # its first attempt, late: ignored
    record = services.table.get_iteration("superseded", 0)
    assert (record.done, record.stale_attempts, record.relaunched) == ({0}, 1, {1: 1})
    assert record.arrived == 1
    fired = _arrive(services, "superseded", 1, attempt=1)
    assert [(p.worker, p.attempt) for p in fired[0].participants] == [(0, 0), (1, 1)]
    for message in fired:
        reducer.reduce(message, services)
    assert np.array_equal(_new_weights(services, "superseded"), _expected_weights([0, 1]))


def test_a_superseded_attempt_that_was_not_finite_leaves_its_worker_in(services: Services) -> None:
    _register(services, "superseded-nan", workers=2)
    services.table.relaunch_workers("superseded-nan", 0, 0, {1: 1})
    assert _arrive(services, "superseded-nan", 1, finite=False, attempt=0) == []  # stale: not counted at all
    assert _arrive(services, "superseded-nan", 0) == []
    fired = _arrive(services, "superseded-nan", 1, attempt=1)
    assert [(p.worker, p.attempt) for p in fired[0].participants] == [(0, 0), (1, 1)]
    record = services.table.get_iteration("superseded-nan", 0)
    assert (record.nonfinite, record.stale_attempts, record.nonfinite_arrived) == (set(), 1, 0)


def test_duplicate_reports_count_twice_but_the_reduce_fires_once_with_each_worker_once(services: Services) -> None:
    _register(services, "dup-work", workers=3)

    def arrive(worker: int) -> list[ReduceMessage]:
        return _arrive(services, "dup-work", worker, tracked=True)

    assert arrive(0) == []
    assert arrive(0) == []
    assert arrive(1) == []  # the counter says three arrived: the records say two
    counter = services.table.get_counter("dup-work", 0)
    assert (counter.arrived, counter.reduce_fired_by) == (3, None)
    fired = arrive(2)
    assert [m.shard for m in fired] == [0, 1]
    assert [p.worker for p in fired[0].participants] == [0, 1, 2]
    assert arrive(1) == []  # after the fire: not a late worker, not a second fire
    assert arrive(2) == []  # the firing message again: its reduce went out the first time
    record = services.table.get_iteration("dup-work", 0)
    assert (record.arrived, record.participant_count, record.reduce_fired_by) == (6, 3, 2)
    assert [p.worker for p in record.participants] == [0, 1, 2]
    assert record.done == {0, 1, 2} and record.late == set()
    assert record.train_loss == pytest.approx(0.5)
    # the participants' states summed, each once (the duplicates' not again)
    assert record.train_state == pytest.approx(
        [sum(v) for v in zip(*(_state(w) for w in range(3)), strict=True)], rel=1e-15
    )


def test_a_retry_of_a_report_that_fired_but_did_not_publish_publishes_the_same_reduce_once(
    services: Services,
) -> None:
    """The firing message's first copy froze the participants, then crashed before it published the reduce:
    its retry publishes that reduce (with those participants), and a copy after that publishes nothing."""
    _register(services, "fire-crash", workers=3, quorum=0.6)
    assert _arrive(services, "fire-crash", 0) == []
    frozen = [Participant(worker=w, samples=SAMPLES[w], etag=etag_of(_update(w)[0])) for w in (0, 1)]  # what it froze
    assert services.table.freeze_participants("fire-crash", 0, 1, frozen, 0) == (1, frozen)
    services.store.put_new(keys.update("fire-crash", 0, 1), *updates.encode(VECTORS[1], SAMPLES[1]))
    retried = reduce_launcher.on_work_done(_done("fire-crash", 1), services)
    assert [m.shard for m in retried] == [0, 1] and all(m.participants == tuple(frozen) for m in retried)
    assert reduce_launcher.on_work_done(_done("fire-crash", 1), services) == []
    assert _arrive(services, "fire-crash", 2) == []  # late: the reduce fired without it
    record = services.table.get_iteration("fire-crash", 0)
    assert (record.reduce_fired_by, [p.worker for p in record.participants], record.late) == (1, [0, 1], {2})


def test_a_duplicate_non_finite_report_does_not_hold_the_quorum_back(services: Services) -> None:
    _register(services, "dup-nan", workers=4, quorum=0.5)
    for _ in range(3):
        assert _arrive(services, "dup-nan", 0, finite=False) == []
    assert _arrive(services, "dup-nan", 1) == []  # the counter says all four in: one finite report, though
    fired = _arrive(services, "dup-nan", 2)
    assert [p.worker for p in fired[0].participants] == [1, 2]
    record = services.table.get_iteration("dup-nan", 0)
    assert (record.nonfinite, record.nonfinite_arrived, record.participant_count) == ({0}, 3, 2)


def _item_bytes(services: Services, run_id: str, sort_key: str) -> int:
    """An item's stored size, counted as DynamoDB does roughly: attribute names plus encoded values."""
    item = services.table.table.get_item(Key={"pk": f"RUN#{run_id}", "sk": sort_key})["Item"]
    return sum(len(name) + len(json.dumps(plain(value), default=sorted)) for name, value in item.items())


def _report_all(services: Services, run_id: str, workers: int) -> list[ReduceMessage]:
    fired = []
    for worker in range(workers):
        fired += reduce_launcher.on_work_done(_done(run_id, worker), services)
    return fired


def test_the_counter_and_a_workers_record_do_not_grow_with_the_workers(services: Services) -> None:
    sizes = {}
    for workers in (10, 300):
        run_id = f"fleet-{workers:03d}"
        _register(services, run_id, workers=workers)
        fired = _report_all(services, run_id, workers)
        assert len(fired[0].participants) == workers
        services.table.record_shard(run_id, 0, 0)
        sizes[workers] = {
            "counter": _item_bytes(services, run_id, iteration_sk(0)),
            "record": _item_bytes(services, run_id, worker_sk(0, 7)),
            "participants": _item_bytes(services, run_id, participants_sk(0)),
        }
    small, large = sizes[10], sizes[300]
    assert large["counter"] - small["counter"] <= 16  # a few more digits in the counts and times, no more
    assert large["record"] == small["record"]
    assert large["counter"] < 1024 and large["record"] < 300
    assert large["participants"] < 300 * 60  # written once per iteration: ~50 bytes per participant, ETag included


def _deadline(
    run_id: str, stage: str = "work", round_: int = 0, due_in: float = 0.0, link: int = 0, iteration: int = 0
) -> Deadline:
    return Deadline(
        run_id=run_id, iteration=iteration, stage=stage, round=round_, due_at=time.time() + due_in, link=link
    )


def _due(deadline: Deadline, services: Services) -> Deadline:
    """``deadline`` as it arrives when its time has come: the run's record of it (what the watchdog acts on) says it
    is due now."""
    now = time.time()
    run = services.table.get_run(deadline.run_id)
    if run.pending is not None:
        pending = run.pending.model_copy(update={"due_at": now})
        services.table.table.update_item(
            Key={"pk": f"RUN#{deadline.run_id}", "sk": "META"},
            UpdateExpression="SET pending = :pending",
            ExpressionAttributeValues={":pending": pending.model_dump_json()},
        )
    return deadline.model_copy(update={"due_at": now})


def _delayed(services: Services) -> int:
    """Deadline messages waiting in the queue for their delay to pass."""
    attributes = services.deadlines.sqs.get_queue_attributes(
        QueueUrl=services.deadlines.queue_url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessagesDelayed"])


def test_a_deadline_that_comes_early_is_sent_on(services: Services, sent: list[Deadline]) -> None:
    _register(services, "early", workers=2)
    assert watchdog.on_deadline(_deadline("early", due_in=3600), services) == Action.NOT_DUE
    assert _delayed(services) == 1
    assert [(d.link, d.resent) for d in sent] == [(0, 1)]  # the same link: the chain has not moved
    assert services.table.get_run("early").watched == 0
    assert services.table.get_iteration("early", 0).relaunched == {}


def test_at_a_deadline_the_reduce_fires_with_the_workers_in_if_they_reach_the_floor(
    services: Services, sent: list[Deadline]
) -> None:
    _register(services, "floor", workers=4, deadline_floor=0.5)
    assert _arrive(services, "floor", 0) == [] and _arrive(services, "floor", 1) == []  # quorum 1: waiting
    assert watchdog.on_deadline(_deadline("floor"), services) == Action.FIRED
    record = services.table.get_iteration("floor", 0)
    assert record.fired_at_deadline and record.reduce_fired_by == DEADLINE_OWNER
    assert [p.worker for p in record.participants] == [0, 1]
    assert _delayed(services) == 1
    assert [(d.stage, d.round, d.link) for d in sent] == [("reduce", 0, 1)]  # the reducers' deadline
    assert _arrive(services, "floor", 2) == []
    assert services.table.get_iteration("floor", 0).late == {2}


def test_below_the_floor_missing_workers_are_relaunched_then_the_run_fails(
    services: Services, sent: list[Deadline]
) -> None:
    _register(services, "below", workers=4, deadline_floor=0.5, deadline_retries=1, deadline_s=30)
    _arrive(services, "below", 0)
    assert watchdog.on_deadline(_deadline("below"), services) == Action.RELAUNCHED
    assert services.table.get_iteration("below", 0).relaunched == {1: 1, 2: 1, 3: 1}
    assert [(d.stage, d.round, d.link) for d in sent] == [("work", 1, 1)]
    assert watchdog.on_deadline(_due(sent[-1], services), services) == Action.FAILED
    run = services.table.get_run("below")
    assert run.status == "FAILED"
    assert run.reason == (
        "work stage of iteration 0: 1 of 4 workers delivered an update within 2 deadlines of 30 s, fewer than the"
        " floor of 2; workers [1, 2, 3] were re-launched 1 times"
    )
    assert len(sent) == 1  # the run failed: the chain ends


def test_a_duplicate_deadline_does_not_start_a_second_chain(services: Services, sent: list[Deadline]) -> None:
    _register(services, "dup-deadline", workers=4, deadline_floor=0.5)
    _arrive(services, "dup-deadline", 0)
    deadline = _deadline("dup-deadline")
    assert watchdog.on_deadline(deadline, services) == Action.RELAUNCHED
    assert watchdog.on_deadline(deadline, services) == Action.NOTHING  # the copy: the chain moved on
    assert [(d.stage, d.round, d.link) for d in sent] == [("work", 1, 1)]
    assert _delayed(services) == 1
    assert services.table.get_run("dup-deadline").watched == 1
    assert services.table.get_iteration("dup-deadline", 0).relaunched == {1: 1, 2: 1, 3: 1}


def test_the_first_launch_sends_the_runs_only_deadline(services: Services, sent: list[Deadline]) -> None:
    _register(services, "chain", workers=2, watched=False, launched=False)
    landed = ModelLanded(key=keys.model("chain", 0), sequencer="a")
    assert work_launcher.on_model(landed, services) == Outcome.LAUNCHED
    assert work_launcher.on_model(landed, services) == Outcome.LAUNCHED  # the same event again: published again
    again = ModelLanded(key=landed.key, sequencer="b")
    assert work_launcher.on_model(again, services) == Outcome.ALREADY_LAUNCHED
    assert [(d.iteration, d.stage, d.link) for d in sent] == [(0, "work", 0)]
    services.table.advance("chain", 1, 0)
    manifest_event = ModelLanded(key=keys.trigger("chain", 1), sequencer="c")
    assert work_launcher.on_model(manifest_event, services) == Outcome.IGNORED  # the Merger announces a manifest
    assert work_launcher.on_merged(ModelMerged(run_id="chain", iteration=1), services) == Outcome.LAUNCHED
    assert len(sent) == 1  # the chain goes on from the deadline pending, not from every launch
    assert services.table.get_run("chain").watched == 0


def _published(services: Services, monkeypatch: pytest.MonkeyPatch, topic: wiring.Topic) -> list:
    """The messages published to ``topic`` from here on (published as ever)."""
    published: list = []
    publish = services.bus.publish

    def recording(to: wiring.Topic, messages: list) -> None:
        published.extend(messages if to == topic else ())
        publish(to, messages)

    monkeypatch.setattr(services.bus, "publish", recording)
    return published


def _meanwhile(monkeypatch: pytest.MonkeyPatch, target: object, name: str, other: Callable[[], T]) -> list[T]:
    """The first call of ``target.name`` runs ``other`` first (a second invocation, meanwhile); what it returned, once
    it ran."""
    real, started, returned = getattr(target, name), [], []

    def after_the_other(*args, **kwargs):
        if not started:
            started.append(True)
            returned.append(other())
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, after_the_other)
    return returned


def test_two_copies_of_a_model_event_handled_at_once_start_one_chain(
    services: Services, sent: list[Deadline], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duplicate delivery handled by a second invocation while the first is between reading the run and
    launching: both may send the chain's first deadline, but when the two come, one carries the chain on."""
    _register(services, "chain-race", workers=2, watched=False, launched=False)
    landed = ModelLanded(key=keys.model("chain-race", 0), sequencer="a")
    other_copy = _meanwhile(
        monkeypatch, services.table, "claim_launch", lambda: work_launcher.on_model(landed, services)
    )
    assert work_launcher.on_model(landed, services) == Outcome.LAUNCHED
    assert other_copy == [Outcome.LAUNCHED]
    firsts = list(sent)
    assert {(d.iteration, d.link) for d in firsts} == {(0, 0)} and 1 <= len(firsts) <= 2
    sent.clear()
    actions = [watchdog.on_deadline(_due(d, services), services) for d in firsts]
    assert actions.count(Action.NOTHING) == len(firsts) - 1
    assert [(d.link, d.round) for d in sent] == [(1, 1)]  # one next deadline: the chain did not fork
    assert services.table.get_run("chain-race").watched == 1


def test_a_deadline_of_an_iteration_the_run_has_passed_watches_the_current_one(
    services: Services, sent: list[Deadline]
) -> None:
    _register(services, "moved", workers=2, deadline_s=60)
    services.table.advance("moved", 2, 0)
    entered = services.table.get_run("moved").iteration_at
    assert watchdog.on_deadline(_deadline("moved"), services) == Action.NOTHING
    assert [(d.iteration, d.stage, d.round, d.link) for d in sent] == [(2, "work", 0, 1)]
    assert sent[0].due_at == pytest.approx(entered + 60)
    assert services.table.get_iteration("moved", 0).relaunched == {}


def test_a_deadline_rebased_on_an_overdue_iteration_acts_on_it_at_once(
    services: Services, sent: list[Deadline]
) -> None:
    _register(services, "overdue", workers=2, deadline_s=60)
    services.table.advance("overdue", 2, 0)
    services.table.table.update_item(  # iteration 2 started longer than a deadline ago
        Key={"pk": "RUN#overdue", "sk": "META"},
        UpdateExpression="SET iteration_at = :t",
        ExpressionAttributeValues={":t": Decimal(repr(time.time() - 600))},
    )
    assert watchdog.on_deadline(_deadline("overdue"), services) == Action.RELAUNCHED
    assert services.table.get_iteration("overdue", 2).relaunched == {0: 1, 1: 1}
    assert services.table.get_iteration("overdue", 0).relaunched == {}
    assert [(d.iteration, d.stage, d.round, d.link) for d in sent] == [(2, "work", 1, 1)]


def test_an_iteration_whose_launch_is_late_is_launched_by_its_deadline_and_the_late_launch_does_nothing(
    services: Services, sent: list[Deadline]
) -> None:
    """The model of iteration 1 is merged, but its announcement is held past the deadline: the watchdog launches the
    iteration with the run's workers now (scaled to 3), and the announcement, when it comes, finds it launched."""
    _register(services, "late-launch", workers=2, deadline_s=5)
    services.table.advance("late-launch", 1, 0)
    services.table.scale_workers("late-launch", 3, "scaled by the user")
    services.table.table.update_item(  # iteration 1 started longer than a deadline ago
        Key={"pk": "RUN#late-launch", "sk": "META"},
        UpdateExpression="SET iteration_at = :t",
        ExpressionAttributeValues={":t": Decimal(repr(time.time() - 60))},
    )
    before = time.time()
    assert watchdog.on_deadline(_deadline("late-launch"), services) == Action.RELAUNCHED
    record = services.table.get_iteration("late-launch", 1)
    assert (record.launched_by, record.workers, record.relaunched) == (DEADLINE_LAUNCH, 3, {0: 1, 1: 1, 2: 1})
    assert record.launched_at >= before
    late = ModelMerged(run_id="late-launch", iteration=1)
    assert work_launcher.on_merged(late, services) == Outcome.ALREADY_LAUNCHED
    assert services.table.get_iteration("late-launch", 1).launched_at == record.launched_at


def test_a_deadline_past_the_last_iteration_launches_the_evaluation_then_completes_the_run(
    services: Services, sent: list[Deadline]
) -> None:
    """The final model (entering iteration 1 of a 1-iteration run) is merged, but its event is lost: the
    watchdog waits for the model, launches the workers that evaluate it (a round past the budget), and once
    they evaluated it, but their finish was lost too, completes the run with their figures."""
    _register(services, "lost-final", workers=2, deadline_s=5, iterations=1)
    services.table.advance("lost-final", 1, 0)
    services.table.table.update_item(  # iteration 1 started longer than a deadline ago
        Key={"pk": "RUN#lost-final", "sk": "META"},
        UpdateExpression="SET iteration_at = :t",
        ExpressionAttributeValues={":t": Decimal(repr(time.time() - 60))},
    )
    assert watchdog.on_deadline(_deadline("lost-final"), services) == Action.NOTHING  # the model is not in yet
    assert services.table.get_run("lost-final").status == "RUNNING" and sent[-1].iteration == 1
    final = b"the final model"
    services.store.put_new(keys.model("lost-final", 1), final)
    manifest = Manifest(iteration=1, shards=[], model_sha256=hashlib.sha256(final).hexdigest()).model_dump_json()
    signed = services.keys.sign_object("lost-final", keys.manifest("lost-final", 1), manifest.encode())
    services.store.put_new(keys.manifest("lost-final", 1), manifest.encode(), signed)  # as the Merger stores it
    assert watchdog.on_deadline(_due(sent[-1], services), services) == Action.RELAUNCHED
    record = services.table.get_iteration("lost-final", 1)
    assert (record.launched_by, record.relaunched) == (DEADLINE_LAUNCH, {0: 1, 1: 1})
    assert services.table.get_run("lost-final").final_key is None  # not evaluated yet
    services.table.record_evaluation("lost-final", 0, "test", {"loss": 0.25, "auc": 0.75})
    assert watchdog.on_deadline(_due(sent[-1], services), services) == Action.COMPLETED
    run = services.table.get_run("lost-final")
    assert (run.final_key, run.test_loss, run.test) == (
        keys.final_model("lost-final"),
        0.25,
        {"loss": 0.25, "auc": 0.75},
    )
    assert services.store.get(keys.final_model("lost-final")) == b"the final model"
    assert [c.iteration for c in services.table.list_iterations("lost-final")] == [0]  # the evaluation round: none


def test_two_copies_of_a_deadline_handled_at_once_carry_the_chain_on_once(
    services: Services, sent: list[Deadline], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue may hand two copies of a deadline to two invocations at once (in AWS the watchdog's
    Powertools Idempotency drops the second; here the step alone): both act, both send the next
    deadline, and when those come, only one goes on."""
    _register(services, "deadline-race", workers=4, deadline_floor=0.5)
    _arrive(services, "deadline-race", 0)
    deadline = _deadline("deadline-race")
    other_copy = _meanwhile(monkeypatch, services.table, "watch", lambda: watchdog.on_deadline(deadline, services))
    assert {watchdog.on_deadline(deadline, services), *other_copy} == {Action.RELAUNCHED}
    assert [(d.stage, d.round, d.link) for d in sent] == [("work", 1, 1)] * 2
    assert sent[0] == sent[1]  # identical messages: the watchdog's idempotency takes them once
    assert services.table.get_run("deadline-race").watched == 1
    nexts = list(sent)
    sent.clear()
    actions = [watchdog.on_deadline(_due(d, services), services) for d in nexts]
    assert actions.count(Action.NOTHING) == 1
    assert len({d.link for d in sent}) == 1 and len(sent) == 1 and services.table.get_run("deadline-race").watched == 2


def test_a_deadline_that_failed_midway_is_carried_on_by_its_redelivery(
    services: Services, sent: list[Deadline]
) -> None:
    """The queue delivers a deadline again when its handler failed: the chain must not end there."""
    _register(services, "redelivered", workers=4, deadline_floor=0.5)
    _arrive(services, "redelivered", 0)
    deadline = _deadline("redelivered")
    faults.install(services.store.s3, services.bus.sns)
    with faults.invocation(InvocationFaults(crash="publish")), pytest.raises(InjectedFault):
        watchdog.on_deadline(deadline, services)  # stops before the re-launched workers' messages go out
    assert sent == []
    assert watchdog.on_deadline(deadline, services) == Action.RELAUNCHED
    assert [(d.stage, d.round) for d in sent] == [("work", 1)]
    assert services.table.get_iteration("redelivered", 0).relaunched == {1: 1, 2: 1, 3: 1}


def test_a_shard_whose_reducer_never_finishes_keeps_its_weights(services: Services, sent: list[Deadline]) -> None:
    _register(services, "stale", workers=2, deadline_retries=1)
    fired = _arrive(services, "stale", 0) + _arrive(services, "stale", 1)
    reducer.reduce(fired[0], services)
    services.table.record_shard("stale", 0, 0)  # the Merger has shard 0 only
    assert watchdog.on_deadline(_deadline("stale", "reduce"), services) == Action.RELAUNCHED
    assert services.table.get_iteration("stale", 0).reduce_relaunches == 1
    assert [(d.stage, d.round) for d in sent] == [("reduce", 1)]
    assert watchdog.on_deadline(_due(sent[-1], services), services) == Action.STALE_SHARDS
    assert services.table.get_iteration("stale", 0).stale_shards == {1}
    _assert_kept(services, "stale", 1)
    assert np.array_equal(_shard(services, "stale", 1, 0).weights, _part(_expected_weights([0, 1]), 0))
    assert [d.stage for d in sent] == ["reduce", "work"]  # then it watches the next iteration


def test_the_watchdog_keeps_a_shard_before_a_late_reducer_the_kept_shard_stands(
    services: Services, sent: list[Deadline]
) -> None:
    _register(services, "kept", workers=2, deadline_retries=0)
    fired = _arrive(services, "kept", 0) + _arrive(services, "kept", 1)
    assert watchdog.on_deadline(_deadline("kept", "reduce"), services) == Action.STALE_SHARDS
    for message in fired:  # the late reducers announce the stored shards
        done = reducer.reduce(message, services)
        assert (done.iteration, done.shard) == (0, message.shard)
    for shard in range(2):
        _assert_kept(services, "kept", shard)
    assert services.table.get_iteration("kept", 0).stale_shards == {0, 1}


def test_a_late_reducer_that_stores_first_its_average_stands(services: Services) -> None:
    config = _register(services, "late-first", workers=2, deadline_retries=0)
    fired = _arrive(services, "late-first", 0) + _arrive(services, "late-first", 1)
    reducer.reduce(fired[0], services)
    assert reducer.keep_weights(services, config, 0, 0, 1) is False
    assert reducer.keep_weights(services, config, 0, 1, 1) is True
    assert np.array_equal(_shard(services, "late-first", 1, 0).weights, _part(_expected_weights([0, 1]), 0))
    assert _shard(services, "late-first", 1, 0).averaged == [0, 1]
    _assert_kept(services, "late-first", 1)
    assert services.table.get_iteration("late-first", 0).stale_shards == {1}


def test_a_reducer_overtaken_by_the_watchdog_keeps_the_shard_it_kept(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While reducer 0 reads, the watchdog keeps shard 0: the reducer's average is dropped, weights and
    optimizer state stay the kept ones, and the reducer announces the shard all the same."""
    config = _register(services, "overtaken", workers=2)
    fired = _arrive(services, "overtaken", 0) + _arrive(services, "overtaken", 1)
    read = services.store.get_quorum

    def overtaken(*args, **kwargs):
        assert reducer.keep_weights(services, config, 0, 0, 1)
        return read(*args, **kwargs)

    monkeypatch.setattr(services.store, "get_quorum", overtaken)
    done = reducer.reduce(fired[0], services)
    assert (done.iteration, done.shard) == (0, 0)
    _assert_kept(services, "overtaken", 0)
    assert services.table.get_iteration("overtaken", 0).stale_shards == {0}


def test_a_retried_reducer_stands_by_what_its_first_try_stored(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first tries leave worker 1 out (its reads are slow) and store; the retries read every part in
    time, yet the shards stay the first tries' averages of workers 0 and 2."""
    _register(services, "retried", workers=3)
    fired = [m for w in range(3) for m in _arrive(services, "retried", w)]
    slow = _slow_part_of_worker_1(services, monkeypatch, 1)
    for message in fired:
        with faults.invocation(slow):
            reducer.reduce(message, services)
    monkeypatch.setenv(READ_TIMEOUT_ENV, "5")
    for message in fired:
        reducer.reduce(message, services)
    assert np.array_equal(_new_weights(services, "retried"), _expected_weights([0, 2]))
    assert [_shard(services, "retried", 1, r).averaged for r in range(2)] == [[0, 2], [0, 2]]


class Crash(Exception):
    """A reducer that stops before it stores its shard."""


def test_a_reducer_that_stopped_before_storing_is_retried_in_full(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(services, "crashed", workers=3)
    fired = [m for w in range(3) for m in _arrive(services, "crashed", w)]
    with monkeypatch.context() as crashing:

        def put_new(key: str, data: bytes, metadata: dict[str, str] | None = None) -> bool:
            raise Crash(key)

        crashing.setattr(services.store, "put_new", put_new)
        for message in fired:
            with pytest.raises(Crash):
                reducer.reduce(message, services)
    assert not any(services.store.exists(keys.shard("crashed", 1, r)) for r in range(2))
    for message in fired:
        reducer.reduce(message, services)
    assert np.array_equal(_new_weights(services, "crashed"), _expected_weights([0, 1, 2]))


def test_parts_dropped_by_a_try_whose_shard_was_not_stored_are_not_counted(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A duplicate Reduce message after the shard is stored reads slowly and leaves worker 1 out: the
    stored shard, which averaged every worker, is what the run's record must tell."""
    _register(services, "dup-reduce", workers=3)
    fired = [m for w in range(3) for m in _arrive(services, "dup-reduce", w)]
    for message in fired:
        reducer.reduce(message, services)
    slow = _slow_part_of_worker_1(services, monkeypatch, 1)
    for message in fired:
        with faults.invocation(slow):
            reducer.reduce(message, services)
    assert [_shard(services, "dup-reduce", 1, r).averaged for r in range(2)] == [[0, 1, 2], [0, 1, 2]]
    assert services.table.get_iteration("dup-reduce", 0).dropped_parts == set()


def _merge_run(services: Services, run_id: str, **training: object) -> list[ReduceMessage]:
    """A run of a small Keras model whose workers reported; the Reduce messages of its shards."""
    import keras

    from slsml.training import modelio

    keras.utils.set_random_seed(0)
    body = modelio.save_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, use_bias=False)]))
    model = modelio.load_model(body)  # as prepare_run reads it
    plan = ShardPlan.build(modelio.variable_specs(model), reducers=2)
    spec = TrainingSpec.model_validate(
        {"workers": 2, "reducers": 2, "global_batch": 4, "iterations": 5, "eval_every": 0, **training}
    )
    config = RunConfig(
        run_id=run_id,
        dataset="d",
        training=spec,
        optimizer=SGD,
        loss=modelio.loss_config(model, "mse"),
        classification=False,
        plan=plan,
    )
    services.store.put_json_new(keys.run_config(run_id), config.model_dump(mode="json"))
    flat = modelio.get_flat(model, plan)
    for shard in range(2):
        layout = plan.shard(shard)
        initial = shards.Shard(flat[layout.start : layout.stop], optimizers.initial_state(SGD, layout.size), [])
        services.store.put_new(keys.shard(run_id, 0, shard), shards.encode(initial))
    services.store.put_new(keys.source_model(run_id), body)
    services.store.put_new(keys.model(run_id, 0), body)  # the run state machine's copy: the first trigger
    _put_run(services, config)
    fired = []
    for worker in range(spec.initial_workers):
        update, header = updates.encode(RNG.standard_normal(plan.size), 2)
        services.store.put_new(keys.update(run_id, 0, worker), update, header)
        fired += reduce_launcher.on_work_done(
            _done(run_id, worker).model_copy(update={"etag": etag_of(update)}), services
        )
    return fired


def test_duplicate_shard_reports_count_twice_but_the_merge_fires_once(services: Services) -> None:
    from slsml.pipeline.steps import merger

    fired = _merge_run(services, "dup-merge")
    first = reducer.reduce(fired[0], services)
    merged = [merger.on_reduce_done(first, services) for _ in range(2)]
    assert merged == [None, None]  # the counter says both shards are in: shard 1 is not, though
    assert services.table.get_counter("dup-merge", 0).merge_fired_by is None
    second = reducer.reduce(fired[1], services)
    merged = [merger.on_reduce_done(done, services) for done in (second, second, first)]
    assert merged == [keys.manifest("dup-merge", 1), None, None]
    counter = services.table.get_counter("dup-merge", 0)
    assert (counter.shards_in, counter.merge_fired_by) == (5, 1)
    weights = np.concatenate(
        [shards.decode(services.store.get(keys.shard("dup-merge", 1, r))).weights for r in range(2)]
    )
    config = run_config(services, "dup-merge")
    assert np.array_equal(load_weights(services.store, config, 1), weights)  # what the workers of iteration 1 read
    named = Manifest.model_validate_json(services.store.get(keys.manifest("dup-merge", 1)))
    assert named.shards == [services.store.etag(keys.shard("dup-merge", 1, r)) for r in range(2)]
    assert not services.store.exists(keys.model("dup-merge", 1))  # no model is saved where the run cannot end
    manifest = keys.manifest("dup-merge", 1)
    assert services.store.head(manifest) == {
        merger.MERGED_METADATA: "0",
        merger.GENERATION_METADATA: "0",
        **services.keys.sign_object("dup-merge", manifest, services.store.get(manifest)),  # its proof of origin
    }
    assert services.table.get_run("dup-merge").iteration == 1


def test_the_workers_take_only_the_shards_the_manifest_names(services: Services) -> None:
    """A shard replaced after the merge (a forged object at the shard's key) is not read as the weights."""
    from slsml.pipeline.steps import merger

    dones = [reducer.reduce(message, services) for message in _merge_run(services, "forged-shard")]
    assert [merger.on_reduce_done(d, services) for d in dones] == [None, keys.manifest("forged-shard", 1)]
    stored = shards.decode(services.store.get(keys.shard("forged-shard", 1, 1)))
    forged = shards.Shard(stored.weights + 1, stored.state, stored.averaged)
    services.store.replace(keys.shard("forged-shard", 1, 1), shards.encode(forged))
    with pytest.raises(RunFailed, match=r"shards/0001/shard\.bin is not the shard the manifest of iteration 1 names"):
        load_weights(services.store, run_config(services, "forged-shard"), 1)
    # nor stepped by its reducer: the reduce of iteration 1 refuses it by name, and stores nothing
    participants = (Participant(worker=0, samples=2, etag=etag_of(_update(0)[0])),)
    services.store.put_new(keys.update("forged-shard", 1, 0), *_update(0))
    message = ReduceMessage(run_id="forged-shard", iteration=1, shard=1, participants=participants)
    with pytest.raises(RunFailed, match=r"shards/0001/shard\.bin is not the shard the manifest of iteration 1 names"):
        reducer.reduce(message, services)
    assert not services.store.exists(keys.shard("forged-shard", 2, 1))


@pytest.mark.parametrize(
    ("training", "saved"),
    [({"checkpoint_every": 1}, "a checkpoint"), ({"iterations": 1}, "the final model, with its optimizer's state")],
)
def test_the_merger_saves_the_model_at_a_checkpoint_and_for_the_final_one(
    services: Services, training: dict[str, int], saved: str
) -> None:
    from slsml.pipeline.steps import merger
    from slsml.training import modelio

    run_id = f"saved-{next(iter(training))}".replace("_", "-")
    dones = [reducer.reduce(message, services) for message in _merge_run(services, run_id, **training)]
    assert [merger.on_reduce_done(d, services) for d in dones] == [None, keys.manifest(run_id, 1)]
    model = modelio.load_model(services.store.get(keys.model(run_id, 1)))
    config = run_config(services, run_id)
    assert np.array_equal(modelio.get_flat(model, config.plan), load_weights(services.store, config, 1)), saved
    assert bool(getattr(model, "optimizer", None)) == ("final" in saved)  # fit_state: gradient averaging


def test_an_earlier_generations_late_reports_leave_a_resumed_runs_iteration_alone(services: Services) -> None:
    """The run fails and is resumed at the iteration its reducers were finishing: their reports, and its
    workers', late, must neither merge nor recreate the counter the resume deleted (the new generation would
    find it counted), and the workers' records they leave give way to the new generation's."""
    from slsml.pipeline.steps import merger

    dones = [reducer.reduce(message, services) for message in _merge_run(services, "resumed-race")]
    assert services.table.fail("resumed-race", "a failure for the test") is not None
    assert services.table.resume("resumed-race", 0).generation == 1
    services.table.forget_iterations("resumed-race", 0)
    assert [merger.on_reduce_done(d, services) for d in dones] == [None, None]
    assert [reduce_launcher.on_work_done(_done("resumed-race", w), services) for w in range(2)] == [[], []]
    relaunched = services.table.claim_launch("resumed-race", 0, "resume-1", 1, 2)
    assert (relaunched.arrived, relaunched.shards_in, relaunched.merge_fired_by) == (0, 0, None)
    assert not services.store.exists(keys.manifest("resumed-race", 1))
    # the late workers' records give way to the new generation's re-launch (worker 0) and report (worker 1)
    services.table.relaunch_workers("resumed-race", 0, 1, {0: 1})
    assert services.table.get_iteration("resumed-race", 0).relaunched == {0: 1}
    reports = [
        _done("resumed-race", 0, attempt=1).model_copy(update={"generation": 1}),
        _done("resumed-race", 1).model_copy(update={"generation": 1}),
    ]
    fired = [m for report in reports for m in reduce_launcher.on_work_done(report, services)]
    assert fired and all({p.worker for p in m.participants} == {0, 1} for m in fired)


def _resume_at_0(services: Services, run_id: str) -> None:
    """The run fails and is resumed as ``runs.resume_run`` leaves it: generation 1, iteration 0's items gone."""
    assert services.table.fail(run_id, "a failure for the test") is not None
    assert services.table.resume(run_id, 0).generation == 1
    services.table.forget_iterations(run_id, 0)


def _resume_before(
    monkeypatch: pytest.MonkeyPatch,
    services: Services,
    run_id: str,
    target: object,
    method: str,
    first_argument: str | None = None,
) -> None:
    """The run fails and is resumed at iteration 0 just before ``target.method`` is first called (with
    ``first_argument``, if given): a step of the generation before that was under way then goes on after."""
    original = getattr(target, method)

    def resumed_first(*args: object, **kwargs: object) -> object:
        if first_argument is None or args[0] == first_argument:
            monkeypatch.setattr(target, method, original)
            _resume_at_0(services, run_id)
        return original(*args, **kwargs)

    monkeypatch.setattr(target, method, resumed_first)


def _report_in_generation_1(services: Services, run_id: str) -> list[ReduceMessage]:
    """Workers 0 and 1 report iteration 0 again in the resumed run's generation 1 (their updates are stored)."""
    return [
        m
        for w in range(2)
        for m in reduce_launcher.on_work_done(
            _done(run_id, w).model_copy(
                update={"generation": 1, "etag": services.store.etag(keys.update(run_id, 0, w))}
            ),
            services,
        )
    ]


def test_a_reduce_an_earlier_generation_fires_after_the_resume_leaves_the_new_barrier_alone(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation 0's last report passes the barrier, and the run is resumed before it fires the reduce: what
    its firing writes must not stand for generation 1, whose reports fire the reduce anew."""
    _register(services, "late-fire", workers=2)
    assert _arrive(services, "late-fire", 0) == []
    _resume_before(monkeypatch, services, "late-fire", services.table, "freeze_participants")
    _arrive(services, "late-fire", 1)
    assert services.table.claim_launch("late-fire", 0, "resume-1", 1, 2) is not None
    fired = _report_in_generation_1(services, "late-fire")
    assert [(m.shard, m.generation, {p.worker for p in m.participants}) for m in fired] == [
        (0, 1, {0, 1}),
        (1, 1, {0, 1}),
    ]
    assert services.table.get_iteration("late-fire", 0).participants == list(fired[0].participants)


def test_a_merge_an_earlier_generation_claims_after_the_resume_leaves_the_new_merge_alone(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation 0's Merger counts the last shard, and the run is resumed before it claims the merge: its
    claim must neither stand for generation 1 (whose last shard is another) nor store a model."""
    from slsml.pipeline.steps import merger

    dones = [reducer.reduce(message, services) for message in _merge_run(services, "late-claim")]
    assert merger.on_reduce_done(dones[0], services) is None
    _resume_before(monkeypatch, services, "late-claim", services.table, "fire_merge")
    assert merger.on_reduce_done(dones[1], services) is None
    assert not services.store.exists(keys.manifest("late-claim", 1))
    assert services.table.claim_launch("late-claim", 0, "resume-1", 1, 2) is not None
    fired = _report_in_generation_1(services, "late-claim")
    again = [reducer.reduce(message, services) for message in fired]
    assert [merger.on_reduce_done(d, services) for d in reversed(again)] == [None, keys.manifest("late-claim", 1)]
    assert (services.table.get_run("late-claim").iteration, again[0].generation) == (1, 1)


def test_an_earlier_generations_merger_resumed_before_it_advances_stores_no_model(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation 0's Merger claims the merge, and the run is resumed before it advances the run: it must not
    move generation 1's run on nor store the model (whose event would launch it in generation 1)."""
    from slsml.pipeline.steps import merger

    dones = [reducer.reduce(message, services) for message in _merge_run(services, "late-advance")]
    _resume_before(monkeypatch, services, "late-advance", services.table, "advance")
    assert [merger.on_reduce_done(d, services) for d in dones] == [None, None]
    run = services.table.get_run("late-advance")
    assert (run.iteration, run.generation, services.store.exists(keys.manifest("late-advance", 1))) == (0, 1, False)


def test_a_model_an_earlier_generation_stored_after_the_resume_is_stored_again_and_announced(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation 0's Merger advanced the run, and the run is resumed before its model lands: its announcement
    comes while the resumed run is at the iteration before and launches nothing. Generation 1's merge of that
    iteration finds the model and stores it again in place as its own, and its announcement launches the next one."""
    from slsml.pipeline.steps import merger

    announced: list[ModelMerged] = _published(services, monkeypatch, wiring.MODEL_UPDATED)
    dones = [reducer.reduce(message, services) for message in _merge_run(services, "adopt")]
    _resume_before(monkeypatch, services, "adopt", services.store, "put_new", keys.manifest("adopt", 1))
    assert [merger.on_reduce_done(d, services) for d in dones] == [None, keys.manifest("adopt", 1)]
    assert [(m.iteration, m.generation) for m in announced] == [(1, 0)]
    assert work_launcher.on_merged(announced.pop(), services) == Outcome.IGNORED  # of generation 0
    assert services.table.claim_launch("adopt", 0, "resume-1", 1, 2) is not None
    fired = _report_in_generation_1(services, "adopt")
    again = [reducer.reduce(message, services) for message in fired]
    assert [merger.on_reduce_done(d, services) for d in again] == [None, keys.manifest("adopt", 1)]
    manifest = keys.manifest("adopt", 1)
    assert services.store.head(manifest) == {
        merger.MERGED_METADATA: "0",
        merger.GENERATION_METADATA: "1",
        **services.keys.sign_object("adopt", manifest, services.store.get(manifest)),  # its proof of origin
    }
    assert [(m.iteration, m.generation) for m in announced] == [(1, 1)]
    assert work_launcher.on_merged(announced[0], services) == Outcome.LAUNCHED
    assert merger.on_reduce_done(again[1], services) is None  # a retry of generation 1's merge: stored already
    assert announced[1:] == announced[:1]  # and announced again, in case its announcement was what failed
    assert work_launcher.on_merged(announced[1], services) == Outcome.LAUNCHED  # the same launch, claimed once
    assert services.table.get_iteration("adopt", 1).launched_by == f"{keys.manifest('adopt', 1)}#1"


def test_a_launch_an_earlier_generations_watchdog_claims_after_the_resume_gives_way_to_the_new_launch(
    services: Services,
) -> None:
    """Generation 0's watchdog read the run before the resume and claims the iteration's launch after the resume
    deleted its counter: the resumed run's own launch must take the counter over, anew, and its workers fire."""
    _merge_run(services, "takeover")
    _resume_at_0(services, "takeover")
    assert services.table.claim_launch("takeover", 0, DEADLINE_LAUNCH, 0, 2) is not None  # the late watchdog
    work_launcher.on_run_started(RunStarted(run_id="takeover", task_token="token"), services)
    counter = services.table.get_counter("takeover", 0)
    assert (counter.launched_by, counter.generation, counter.arrived) == ("resume-1", 1, 0)
    fired = _report_in_generation_1(services, "takeover")
    assert [(m.shard, m.generation) for m in fired] == [(0, 1), (1, 1)]


def test_a_copy_of_the_merging_report_after_the_merge_does_not_merge_again(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy whose first claimed the merge and crashed before the manifest was stored merges; once the manifest is
    stored, a copy finds it and stops before it lists the shards again."""
    from slsml.pipeline.steps import merger

    dones = [reducer.reduce(message, services) for message in _merge_run(services, "copy-merge")]
    assert merger.on_reduce_done(dones[0], services) is None
    assert services.table.fire_merge("copy-merge", 0, 1, 0)  # the crashed copy's claim
    claimed_at = services.table.get_counter("copy-merge", 0).merged_at
    assert merger.on_reduce_done(dones[1], services) == keys.manifest("copy-merge", 1)
    assert services.table.get_counter("copy-merge", 0).merged_at == claimed_at  # the merge's time is the first's

    def listed(*_: object) -> None:
        raise AssertionError("a copy of the merging report listed the shards again")

    monkeypatch.setattr(merger, "shard_etags", listed)
    assert merger.on_reduce_done(dones[1], services) is None
    assert services.table.get_run("copy-merge").iteration == 1


def test_a_late_duplicate_of_the_merging_shard_report_leaves_the_run_where_it_is(services: Services) -> None:
    from slsml.pipeline.steps import merger

    dones = [reducer.reduce(message, services) for message in _merge_run(services, "late-merge")]
    assert [merger.on_reduce_done(d, services) for d in dones] == [None, keys.manifest("late-merge", 1)]
    services.table.advance("late-merge", 2, 0)  # the next iteration merged too
    entered = services.table.get_run("late-merge").iteration_at
    merged_at = services.table.get_counter("late-merge", 0).merged_at
    assert merger.on_reduce_done(dones[1], services) is None  # a retry of the merging message, minutes later
    run = services.table.get_run("late-merge")
    assert (run.iteration, run.iteration_at) == (2, entered)
    assert services.table.get_counter("late-merge", 0).merged_at == merged_at  # the merge's time is the first's


def test_norm_exchange_releases_each_clipped_step_once(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    """global_clipnorm with a variable cut by the shards: the reducers wait for each other's sums of squares;
    the one that completes them steps and releases the other, and duplicates change nothing."""
    clip = OptimizerConfig(name="sgd", learning_rate=0.1, global_clipnorm=0.5)
    _register(services, "clip", workers=4, optimizer=clip)
    released: list[ReduceMessage] = _published(services, monkeypatch, wiring.REDUCE)
    fired = [m for w in range(4) for m in _arrive(services, "clip", w)]
    released.clear()
    assert [m.shard for m in fired] == [0, 1]
    assert reducer.reduce(fired[0], services) is None
    assert reducer.reduce(fired[0], services) is None  # a duplicate still waits, and releases nothing
    assert not released
    assert reducer.reduce(fired[1], services) is not None  # completes the sums: steps, releases shard 0
    assert [(m.shard, m.squares is not None) for m in released] == [(0, True)]
    assert not services.store.exists(keys.shard("clip", 1, 0))
    assert reducer.reduce(released[0], services) is not None
    assert reducer.reduce(fired[0], services) is not None  # a late duplicate finds the sums complete
    assert len(released) == 1  # ...and leaves the release to the shard that claimed it

    mean = sum(v * n for v, n in zip(VECTORS, SAMPLES, strict=True)) / sum(SAMPLES)
    trainable = PLAN.trainable_mask()
    norm = np.sqrt(np.square(mean[trainable], dtype=np.float64).sum())
    expected = mean.copy()
    expected[trainable] = WEIGHTS[trainable] - 0.1 * mean[trainable] * min(1.0, 0.5 / norm)
    got = np.concatenate([shards.decode(services.store.get(keys.shard("clip", 1, r))).weights for r in range(2)])
    assert norm > 1.0, "the clipping must bite"
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("forged", "named"),
    [
        (
            updates.encode(VECTORS[1], SAMPLES[1], kind="weight change"),
            "holds a weight change, but the run averages a gradient",
        ),
        (updates.Encoded(updates.encode(VECTORS[1], SAMPLES[1]).body, {}), "not an slsml update"),
        (updates.Encoded(updates.encode(VECTORS[1], SAMPLES[1]).body, {updates.METADATA: "2/0/0"}), "version 2"),
    ],
)
def test_a_reducer_refuses_an_update_the_run_did_not_ask_for_by_name(
    services: Services, forged: updates.Encoded, named: str
) -> None:
    """An update whose header names another kind, no header or an unknown version fails the run with the object's
    key in the reason; nothing of the next iteration is stored."""
    run_id = f"forged-{abs(hash(named)) % 10_000}"
    _register(services, run_id, workers=2)
    fired = _arrive(services, run_id, 0)
    services.store.put_new(keys.update(run_id, 0, 1), *forged)  # the worker's own (its report names it)
    fired = reduce_launcher.on_work_done(_done(run_id, 1).model_copy(update={"etag": etag_of(forged.body)}), services)
    with pytest.raises(RunFailed, match=named) as failure:
        reducer.reduce(fired[0], services)
    assert keys.update(run_id, 0, 1) in str(failure.value)
    assert not services.store.exists(keys.shard(run_id, 1, 0))


# ---- compressed updates ------------------------------------------------------------------------------------


def _compressed(worker: int, compress: str, vector: np.ndarray | None = None) -> updates.Encoded:
    """Worker ``worker``'s update as a run that compresses with ``compress`` stores it."""
    compression = updates.Compression.parse(compress)
    weights = WEIGHTS if compression.kind == "significance" else None
    vector = VECTORS[worker] if vector is None else vector
    return updates.encode(vector, SAMPLES[worker], "gradient", compression, PLAN, weights)


def _arrive_with(services: Services, run_id: str, worker: int, update: updates.Encoded) -> list[ReduceMessage]:
    services.store.put_new(keys.update(run_id, 0, worker), *update)
    return reduce_launcher.on_work_done(
        _done(run_id, worker).model_copy(update={"etag": etag_of(update.body)}), services
    )


@pytest.mark.parametrize("compress", ["none", "significance:0.5"])
def test_a_reducer_takes_only_the_update_its_workers_report_names(services: Services, compress: str) -> None:
    """An update whose bytes are not the ones its worker's signed report names by their ETag (another object put in
    its place): every reducer refuses it by name before reading any part (the part table's entries, of a tabled
    update, are checked first), and stores nothing of the next iteration: the first re-launches its round, and the
    re-launched round's update refused too fails the run."""
    run_id = f"replaced-update-{compress.split(':')[0]}"
    _register(services, run_id, workers=2, compress=compress)
    _arrive_with(services, run_id, 0, _compressed(0, compress))
    fired = reduce_launcher.on_work_done(
        _done(run_id, 1).model_copy(update={"etag": etag_of(_compressed(1, compress).body)}), services
    )
    services.store.put_new(keys.update(run_id, 0, 1), *_compressed(1, compress, VECTORS[1] * -40))
    assert [m.shard for m in fired] == [0, 1]
    for message in fired:
        assert reducer.reduce(message, services) is None
        assert not services.store.exists(keys.shard(run_id, 1, message.shard))
    assert services.table.get_counter(run_id, 0).redone == {1}
    services.store.put_new(keys.update(run_id, 0, 1, 1), *_compressed(1, compress, VECTORS[1] * -40))
    again = reduce_launcher.on_work_done(
        _done(run_id, 1, attempt=1).model_copy(update={"etag": etag_of(_compressed(1, compress).body)}), services
    )
    for message in again:
        with pytest.raises(
            RunFailed, match=r"is not the update worker 1 reported \(ETag \"[0-9a-f]{32}\"\)"
        ) as failure:
            reducer.reduce(message, services)
        assert str(failure.value).startswith(keys.update(run_id, 0, 1, 1) + " ")
        assert not services.store.exists(keys.shard(run_id, 1, message.shard))


@pytest.mark.parametrize("compress", ["fp16", "topk:0.5", "significance:0.5"])
def test_reducers_average_compressed_updates(services: Services, compress: str) -> None:
    """Each reducer reads its part of every update (top-k: the 2 largest of shard 0's 4 trainable entries, 1 of
    shard 1's 2; significance: through the part table) and steps the mean of what was sent."""
    run_id = f"compressed-{compress.split(':')[0]}"
    _register(services, run_id, workers=3, compress=compress)
    fired = [m for w in range(3) for m in _arrive_with(services, run_id, w, _compressed(w, compress))]
    for message in fired:
        reducer.reduce(message, services)
    compression = updates.Compression.parse(compress)
    sent = [updates.decode(_compressed(w, compress).body, plan=PLAN, compression=compression)[0] for w in range(3)]
    if compression.kind != "fp16":
        assert all(0 < np.count_nonzero(s[PLAN.trainable_mask()]) < 6 for s in sent), "sparse, but not empty"
    assert np.array_equal(_new_weights(services, run_id), _expected_weights([0, 1, 2], sent))
    assert not np.array_equal(_new_weights(services, run_id), _expected_weights([0, 1, 2]))


def _forged_indices(update: updates.Encoded, compress: str) -> updates.Encoded:
    """``update`` with the first index of every part set to 9, beyond each part's 4 entries."""
    body, compression = bytearray(update.body), updates.Compression.parse(compress)
    for shard in range(PLAN.reducers):
        if compression.kind == "significance":
            first, last = updates.table_range(PLAN, shard)
            first, _ = updates.significant_part_range(bytes(body[first : last + 1]), PLAN, shard, len(body))
            first += 4  # the part's count
        else:
            first, _ = updates.part_range(PLAN, shard, compression)
        struct.pack_into("<I", body, first, 9)
    return updates.Encoded(bytes(body), update.metadata)


def _table_beyond_the_end(update: updates.Encoded, compress: str) -> updates.Encoded:
    """A significance update whose part table puts every part's end 8 bytes past the object's."""
    body = bytearray(update.body)
    for shard in range(PLAN.reducers):
        struct.pack_into("<Q", body, updates.table_range(PLAN, shard)[0] + 8, len(body) + 8)
    return updates.Encoded(bytes(body), update.metadata)


@pytest.mark.parametrize(
    ("compress", "forge", "named"),
    [
        ("topk:0.5", _forged_indices, "index 9 lies outside the part's 4 entries"),
        ("significance:0.5", _forged_indices, "index 9 lies outside the part's 4 entries"),
        (
            "significance:0.5",
            _table_beyond_the_end,
            r"the part table puts shard \d's part at bytes .* of the object's 112",
        ),
        (
            "topk:0.5",
            lambda u, c: _compressed(1, "fp16"),
            "the update's encoding is 1 \\(dense float16\\), but the run's"
            " compress option topk:0.5 sends encoding 2 \\(top-k\\)",
        ),
        (
            "significance:0.5",
            lambda u, c: _compressed(1, "none"),
            "the update's encoding is 0 \\(dense float32\\), but"
            " the run's compress option significance:0.5 sends encoding 3 \\(significance\\)",
        ),
        (
            "none",
            lambda u, c: _compressed(1, "topk:0.5"),
            "the update's encoding is 2 \\(top-k\\), but the run's compress option none sends encoding 0",
        ),
        (
            "fp16",
            lambda u, c: updates.Encoded(u.body[:-2], u.metadata),
            "part of shard 1 has 10 bytes, expected 12 bytes",
        ),
    ],
)
def test_a_reducer_refuses_a_forged_compressed_update_by_name(
    services: Services, compress: str, forge, named: str
) -> None:
    """A sparse part whose indices fall outside the part, a part table beyond the object, an encoding the run does not
    send, a part of the wrong length: the run fails with the object's key and the reason; nothing of the next
    iteration is stored."""
    run_id = f"forged-{compress.split(':')[0]}-{abs(hash(named)) % 10_000}"
    _register(services, run_id, workers=2, compress=compress)
    _arrive_with(services, run_id, 0, _compressed(0, compress))
    fired = _arrive_with(services, run_id, 1, forge(_compressed(1, compress), compress))
    shards_failed = [0, 1] if "shard 1" not in named else [1]
    for message in fired:
        if message.shard not in shards_failed:
            continue
        with pytest.raises(RunFailed, match=named) as failure:
            reducer.reduce(message, services)
        assert str(failure.value).startswith(keys.update(run_id, 0, 1) + ": ")
        assert not services.store.exists(keys.shard(run_id, 1, message.shard))


def test_a_step_that_finds_superseded_state_gone_is_late_and_fails_no_run(services: Services) -> None:
    """The Merger deletes the carried state entering an iteration once the run has advanced two past it: a late copy
    of a step of that iteration finds it gone, and is dropped; a step that finds the state of an iteration the run
    still stands at missing fails the run, as before."""
    config = _register(services, "late-step", workers=2)
    for worker in range(2):
        fired = _arrive(services, "late-step", worker)
    assert services.table.advance("late-step", 2, 0) is not None  # the run merged iterations 0 and 1
    services.store.delete(carried_state(config, 0))
    with failing_run_on_bad_input(services, "late-step", "reducer 0", fired[0].iteration, fired[0].generation):
        reducer.reduce(fired[0], services)
    assert services.table.get_run("late-step").status == "RUNNING"
    assert not services.store.exists(keys.shard("late-step", 1, 0))  # it did nothing

    config = _register(services, "lost-state", workers=2)
    for worker in range(2):
        fired = _arrive(services, "lost-state", worker)
    services.store.delete(carried_state(config, 0))
    with failing_run_on_bad_input(services, "lost-state", "reducer 0", fired[0].iteration, fired[0].generation):
        reducer.reduce(fired[0], services)
    run = services.table.get_run("lost-state")
    assert run.status == "FAILED" and "runs/lost-state/iters/000000/shards/0000/shard.bin does not exist" in run.reason


def test_a_launch_claimed_by_an_item_no_launch_wrote_fails_the_run_naming_it(services: Services) -> None:
    """The counter of iteration 0 put by hand with a claim (no time, workers or generation, as every launch's claim
    holds): the landed model's launch is skipped and the run fails naming the item, rather than waiting on workers
    that nothing launched; a launch's own claim, by another trigger, is skipped alone."""
    _register(services, "preclaimed", workers=2, watched=False, launched=False)
    services.table.table.put_item(Item={"pk": "RUN#preclaimed", "sk": iteration_sk(0), "launched_by": "forged"})
    landed = ModelLanded(key=keys.model("preclaimed", 0), sequencer="a")
    assert work_launcher.on_model(landed, services) == Outcome.REFUSED
    run = services.table.get_run("preclaimed")
    assert run.status == "FAILED"
    assert run.reason == (
        "the launch of iteration 0 was claimed behind the pipeline's back: its ITER#000000 item names 'forged',"
        " which launched nothing"
    )
    _register(services, "claimed", workers=2, watched=False)  # launched by its "launch-0" trigger
    assert work_launcher.on_model(ModelLanded(key=keys.model("claimed", 0), sequencer="b"), services) == (
        Outcome.ALREADY_LAUNCHED
    )
    assert services.table.get_run("claimed").status == "RUNNING"


def test_an_update_in_stages_is_read_by_its_index_and_a_part_replaced_after_it_is_refused(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's round in pipeline stages leaves its update as each stage's part, stored as it is, and an index at
    the update's key naming them by their ETag (``updates.StagedIndex``): each reducer reads the index of the ETag the
    report names, then its shard's ranges of the parts, and steps as from the dense update. A part replaced after the
    index named it is refused by the reducer that reads it, as an update replaced is: its shard not stored, the round
    re-launched once (each of its stages), and the step, once the re-launched round reports, the undisturbed one."""
    work: list[WorkMessage] = _published(services, monkeypatch, wiring.WORK)
    cut = PLAN.bounds[1] // 2  # within shard 0: its range spans both parts, shard 1's the second alone

    def arrive(run_id: str, worker: int, attempt: int = 0) -> list[ReduceMessage]:
        values = [VECTORS[worker][:cut], VECTORS[worker][cut:]]
        etags = tuple(
            services.store.put_own(keys.stage_values(run_id, 0, worker, attempt, stage), part.tobytes())[1]
            for stage, part in enumerate(values)
        )
        index = updates.StagedIndex(((0, 0, cut), (1, cut, PLAN.size - cut)), etags).encode()
        done = _done(run_id, worker, attempt=attempt).model_copy(update={"etag": etag_of(index)})
        header = {"done": done.model_dump_json(), **updates.header(PLAN.size, done.samples).metadata}
        services.store.put_new(keys.update(run_id, 0, worker, attempt), index, header)
        return reduce_launcher.on_work_done(done, services)

    for run_id in ("staged-parts", "staged-part-replaced"):
        _register(services, run_id, workers=2, stage_blocks=(1, 1), pipeline_stages=2)
        arrive(run_id, 0)
        fired = arrive(run_id, 1)
        if run_id == "staged-part-replaced":
            services.store.replace(keys.stage_values(run_id, 0, 1, 0, 0), (VECTORS[1][:cut] * -40).tobytes())
            assert reducer.reduce(fired[0], services) is None and not services.store.exists(keys.shard(run_id, 1, 0))
            assert [(w.worker, w.attempt, w.pipeline_stage) for w in work] == [(1, 1, 0), (1, 1, 1)]
            fired = fired[1:] + arrive(run_id, 1, attempt=1)  # (its round computes the same values again)
        for message in fired:
            reducer.reduce(message, services)
        assert np.array_equal(_new_weights(services, run_id), _expected_weights([0, 1]))


def test_a_refused_update_relaunches_its_round_once_and_a_second_refusal_fails_the_run(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's update replaced after its report (other values at its key): each reducer refuses it and stores
    nothing; the first re-launches the worker's round once, as its next attempt; that round's report fires the reduce
    again with its update in the refused one's place, and the step is the undisturbed one. The re-launched round's
    update replaced too: the run fails naming it."""
    work: list[WorkMessage] = _published(services, monkeypatch, wiring.WORK)
    for run_id in ("redone", "refused-twice"):
        _register(services, run_id, workers=2)
        _arrive(services, run_id, 0)
        fired = _arrive(services, run_id, 1)
        header = _update(0)[1]
        services.store.replace(keys.update(run_id, 0, 0), _update(2)[0], header)
        assert [reducer.reduce(message, services) for message in fired] == [None] * PLAN.reducers
        assert not any(services.store.exists(keys.shard(run_id, 1, r)) for r in range(PLAN.reducers))
        assert [(w.run_id, w.worker, w.attempt) for w in work] == [(run_id, 0, 1)]  # once, by the first refusal
        work.clear()
        # the round re-launched stores its update (the same values: the same inputs) and reports it
        again = _arrive(services, run_id, 0, attempt=1)
        assert [(p.worker, p.attempt) for m in again for p in m.participants] == [(0, 1), (1, 0)] * PLAN.reducers
        assert reduce_launcher.on_work_done(_done(run_id, 0, attempt=1), services) == []  # a duplicate: fired once
        if run_id == "redone":
            for message in again:
                reducer.reduce(message, services)
            assert np.array_equal(_new_weights(services, run_id), _expected_weights([0, 1]))
        else:
            refused = keys.update(run_id, 0, 0, 1)
            services.store.replace(refused, _update(2)[0], header)
            with pytest.raises(RunFailed, match=rf"^{refused} is not the update worker 0 reported"):
                reducer.reduce(again[0], services)
            assert work == []  # not re-launched twice


def test_a_reduce_waiting_for_a_relaunched_round_that_never_reports_fails_the_run_naming_the_update(
    services: Services, sent: list[Deadline]
) -> None:
    """Its reducers re-launched until the retries are spent, the watchdog fails the run naming the refused update,
    rather than have the shards keep their weights."""
    _register(services, "never-redone", workers=2, deadline_retries=1)
    fired = _arrive(services, "never-redone", 0) + _arrive(services, "never-redone", 1)
    services.store.replace(keys.update("never-redone", 0, 0), _update(2)[0], _update(0)[1])
    assert [reducer.reduce(message, services) for message in fired] == [None] * PLAN.reducers
    assert watchdog.on_deadline(_deadline("never-redone", "reduce"), services) == Action.RELAUNCHED
    assert watchdog.on_deadline(_due(sent[-1], services), services) == Action.FAILED
    run = services.table.get_run("never-redone")
    refused = keys.update("never-redone", 0, 0)
    assert run.status == "FAILED" and (run.reason or "").startswith(f"{refused} was refused and the round of worker 0")
    assert not any(services.store.exists(keys.shard("never-redone", 1, r)) for r in range(PLAN.reducers))


def test_a_reducer_refusing_an_update_while_another_records_its_relaunch_gives_way(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-launch claimed by the first reducer's refusal, its next attempt not yet recorded (two writes): the second
    reducer's refusal waits for that record and gives way, rather than fail the run as if the update were the
    re-launched round's."""
    work: list[WorkMessage] = _published(services, monkeypatch, wiring.WORK)
    _register(services, "claiming", workers=2)
    _arrive(services, "claiming", 0)
    fired = _arrive(services, "claiming", 1)
    services.store.replace(keys.update("claiming", 0, 0), _update(2)[0], _update(0)[1])
    put = services.table.table.put_item
    held = threading.Event()

    def late_put(**item: Any) -> Any:  # the claimant's record of the next attempt lands 0.5 s after its claim
        if "attempt" in item["Item"]:
            held.set()
            time.sleep(0.5)
        return put(**item)

    first = threading.Thread(target=lambda: reducer.reduce(fired[0], services))
    monkeypatch.setattr(services.table.table, "put_item", late_put)
    first.start()
    assert held.wait(10)
    monkeypatch.setattr(services.table.table, "put_item", put)
    assert reducer.reduce(fired[1], services) is None  # gave way
    first.join()
    assert services.table.get_run("claiming").status == "RUNNING"
    assert [(w.worker, w.attempt) for w in work] == [(0, 1)]
