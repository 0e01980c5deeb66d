"""ReduceLauncher, Reducer and Watchdog against moto: non-finite updates left out (or failing the run
when all are), parts dropped by the reducer's read quorum, and what the watchdog does at a deadline."""

from __future__ import annotations

import time
from decimal import Decimal

import boto3
import numpy as np
import pytest
from moto import mock_aws

from slsml import faults, keys, optimizers, updates, wiring
from slsml.config import OptimizerConfig, RunConfig, TrainingSpec
from slsml.faults import Delay, InvocationFaults
from slsml.messages import Deadline, ReduceMessage, WorkDone
from slsml.plan import ShardPlan, VariableSpec
from slsml.reliability import READ_QUORUM_ENV, READ_TIMEOUT_ENV
from slsml.services import Services
from slsml.steps import reduce_launcher, reducer, watchdog
from slsml.steps.watchdog import Action

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
        boto3.client("dynamodb", region_name="us-east-1").create_table(
            TableName="runs",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        sns = boto3.client("sns", region_name="us-east-1")
        arns = {t.name: sns.create_topic(Name=t.name)["TopicArn"] for t in wiring.TOPICS}
        deadlines = boto3.client("sqs", region_name="us-east-1").create_queue(QueueName="deadlines")["QueueUrl"]
        yield Services.from_names("bucket", "runs", arns, deadline_queue_url=deadlines)


def _register(services: Services, run_id: str, workers: int, quorum: float = 1.0, **training: object) -> RunConfig:
    spec = TrainingSpec(workers=workers, reducers=PLAN.reducers, global_batch=8 * workers, quorum=quorum, **training)
    config = RunConfig(
        run_id=run_id, dataset="d", training=spec, optimizer=SGD, loss="mse", classification=False, plan=PLAN
    )
    services.store.put_json_new(keys.run_config(run_id), config.model_dump(mode="json"))
    for shard in range(PLAN.reducers):
        layout = PLAN.shard(shard)
        services.store.put_array_new(keys.weights(run_id, 0, shard), WEIGHTS[layout.start : layout.stop])
    services.table.table.put_item(
        Item={
            "pk": f"RUN#{run_id}", "sk": "META", "run_id": run_id, "status": "RUNNING", "iterations": 1,
            "iteration": 0, "workers": workers, "reducers": PLAN.reducers, "quorum": Decimal(str(quorum)),
            "dataset": "d", "created_at": 0, "updated_at": 0,
        }
    )
    return config


def _arrive(
    services: Services, run_id: str, worker: int, finite: bool = True, attempt: int = 0
) -> list[ReduceMessage]:
    """What a worker does (store the update, announce it), then the ReduceLauncher."""
    vector = VECTORS[worker] if finite else np.full(PLAN.size, np.nan, dtype=np.float32)
    services.store.put_new(keys.update(run_id, 0, worker, attempt), updates.encode(vector, SAMPLES[worker]))
    done = WorkDone(
        run_id=run_id, iteration=0, worker=worker, attempt=attempt, samples=SAMPLES[worker],
        loss=0.5 if finite else 0.0, compute_s=0.01, finite=finite,
    )
    return reduce_launcher.on_work_done(done, services)


def _expected_weights(workers: list[int]) -> np.ndarray:
    """One SGD step on the sample-weighted mean of these workers' vectors (float64 sums in worker order)."""
    mean = np.zeros(PLAN.size, dtype=np.float64)
    for w in workers:
        mean += VECTORS[w].astype(np.float64) * SAMPLES[w]
    mean = (mean / sum(SAMPLES[w] for w in workers)).astype(np.float32)
    trainable = PLAN.trainable_mask()
    stepped, _ = optimizers.apply(SGD, WEIGHTS[trainable], mean[trainable],
                                  optimizers.initial_state(SGD, int(trainable.sum())))
    expected = WEIGHTS.copy()
    expected[trainable], expected[~trainable] = stepped, mean[~trainable]
    return expected


def _new_weights(services: Services, run_id: str) -> np.ndarray:
    return np.concatenate([services.store.get_array(keys.weights(run_id, 1, r)) for r in range(PLAN.reducers)])


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
    for message in fired:
        reducer.reduce(message, services)
    assert np.array_equal(_new_weights(services, "one-nan"), _expected_weights([0, 2]))  # bit for bit
    assert services.table.get_iteration("one-nan", 0).dropped_parts == set()
    assert services.table.get_run("one-nan").status == "RUNNING"


def test_the_quorum_counts_finite_updates_only(services: Services) -> None:
    _register(services, "half-nan", workers=4, quorum=0.5)
    assert _arrive(services, "half-nan", 0, finite=False) == []
    assert _arrive(services, "half-nan", 1) == []  # two in, but one finite: below ⌈0.5·4⌉
    fired = _arrive(services, "half-nan", 2)
    assert [p.worker for p in fired[0].participants] == [1, 2]
    assert _arrive(services, "half-nan", 3) == []  # late
    assert services.table.get_iteration("half-nan", 0).nonfinite == {0}


def test_all_updates_non_finite_fails_the_run(services: Services) -> None:
    _register(services, "all-nan", workers=2)
    assert _arrive(services, "all-nan", 0, finite=False) == []
    assert _arrive(services, "all-nan", 1, finite=False) == []
    run = services.table.get_run("all-nan")
    assert run.status == "FAILED"
    assert run.reason == "all 2 workers produced non-finite updates at iteration 0"
    record = services.table.get_iteration("all-nan", 0)
    assert record.nonfinite == {0, 1} and record.reduce_fired_by is None


def test_the_reducer_drops_a_part_whose_read_times_out(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    _register(services, "slow-part", workers=3)
    fired = []
    for worker in range(3):
        fired += _arrive(services, "slow-part", worker)
    monkeypatch.setenv(READ_TIMEOUT_ENV, "0.2")
    monkeypatch.setenv(READ_QUORUM_ENV, "0.5")
    faults.install(services.store.s3, services.bus.sns)
    slow = InvocationFaults(s3_get_delay=Delay(probability=1, seconds=1.5), s3_get_delay_match="/updates/00001")
    started = time.perf_counter()
    for message in fired:
        with faults.invocation(slow) as injected:
            done = reducer.reduce(message, services)
        assert injected == {"s3_get_delay": 1}
        assert done.bytes_read > 0
    assert time.perf_counter() - started < 2.5  # neither reducer waited for the slow part
    assert services.table.get_iteration("slow-part", 0).dropped_parts == {"0:1", "1:1"}
    assert np.array_equal(_new_weights(services, "slow-part"), _expected_weights([0, 2]))


def test_with_a_read_quorum_nothing_is_dropped_from_reads_within_the_timeout(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(services, "all-parts", workers=3)
    fired = []
    for worker in range(3):
        fired += _arrive(services, "all-parts", worker)
    monkeypatch.setenv(READ_TIMEOUT_ENV, "5")
    monkeypatch.setenv(READ_QUORUM_ENV, "0.5")
    for message in fired:
        reducer.reduce(message, services)
    assert services.table.get_iteration("all-parts", 0).dropped_parts == set()
    assert np.array_equal(_new_weights(services, "all-parts"), _expected_weights([0, 1, 2]))


def _deadline(run_id: str, stage: str = "work", round_: int = 0, due_in: float = 0.0) -> Deadline:
    return Deadline(run_id=run_id, iteration=0, stage=stage, round=round_, due_at=time.time() + due_in)


def _delayed(services: Services) -> int:
    """Deadline messages waiting in the queue for their delay to pass."""
    attributes = services.deadlines.sqs.get_queue_attributes(
        QueueUrl=services.deadlines.queue_url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessagesDelayed"])


def test_a_deadline_that_comes_early_is_sent_on(services: Services) -> None:
    _register(services, "early", workers=2)
    assert watchdog.on_deadline(_deadline("early", due_in=3600), services) == Action.NOT_DUE
    assert _delayed(services) == 1
    assert services.table.get_iteration("early", 0).relaunched == {}


def test_a_report_of_a_superseded_attempt_is_ignored(services: Services) -> None:
    _register(services, "superseded", workers=2)
    assert services.table.relaunch_workers("superseded", 0, {1: 1})
    assert _arrive(services, "superseded", 0) == []
    assert _arrive(services, "superseded", 1, attempt=0) == []  # its first attempt, late: ignored
    record = services.table.get_iteration("superseded", 0)
    assert (record.done, record.stale_attempts) == ({0}, 1)
    fired = _arrive(services, "superseded", 1, attempt=1)
    assert [(p.worker, p.attempt) for p in fired[0].participants] == [(0, 0), (1, 1)]
    for message in fired:
        reducer.reduce(message, services)
    assert np.array_equal(_new_weights(services, "superseded"), _expected_weights([0, 1]))


def test_a_superseded_attempt_that_was_not_finite_leaves_its_worker_in(services: Services) -> None:
    _register(services, "superseded-nan", workers=2)
    assert services.table.relaunch_workers("superseded-nan", 0, {1: 1})
    assert _arrive(services, "superseded-nan", 1, finite=False, attempt=0) == []  # stale: not counted at all
    assert _arrive(services, "superseded-nan", 0) == []
    fired = _arrive(services, "superseded-nan", 1, attempt=1)
    assert [(p.worker, p.attempt) for p in fired[0].participants] == [(0, 0), (1, 1)]
    record = services.table.get_iteration("superseded-nan", 0)
    assert (record.nonfinite, record.stale_attempts) == (set(), 1)


def test_at_a_deadline_the_reduce_fires_with_the_workers_in_if_they_reach_the_floor(services: Services) -> None:
    _register(services, "floor", workers=4, deadline_floor=0.5)
    assert _arrive(services, "floor", 0) == [] and _arrive(services, "floor", 1) == []  # quorum 1: waiting
    assert watchdog.on_deadline(_deadline("floor"), services) == Action.FIRED
    record = services.table.get_iteration("floor", 0)
    assert record.fired_at_deadline and [p.worker for p in record.participants] == [0, 1]
    assert _delayed(services) == 1  # the reducers' deadline
    assert _arrive(services, "floor", 2) == []
    assert services.table.get_iteration("floor", 0).late == {2}


def test_below_the_floor_missing_workers_are_relaunched_then_the_run_fails(services: Services) -> None:
    _register(services, "below", workers=4, deadline_floor=0.5, deadline_retries=1, deadline_s=30)
    _arrive(services, "below", 0)
    assert watchdog.on_deadline(_deadline("below"), services) == Action.RELAUNCHED
    assert services.table.get_iteration("below", 0).relaunched == {1: 1, 2: 1, 3: 1}
    assert watchdog.on_deadline(_deadline("below", round_=1), services) == Action.FAILED
    run = services.table.get_run("below")
    assert run.status == "FAILED"
    assert run.reason == (
        "work stage of iteration 0: 1 of 4 workers delivered an update within 2 deadlines of 30 s, fewer than the"
        " floor of 2; workers [1, 2, 3] were re-launched 1 times"
    )


def test_a_shard_whose_reducer_never_finishes_keeps_its_weights(services: Services) -> None:
    _register(services, "stale", workers=2, deadline_retries=1)
    fired = _arrive(services, "stale", 0) + _arrive(services, "stale", 1)
    reducer.reduce(fired[0], services)
    services.table.record_shard("stale", 0, 0, (0, 0))  # the Merger has shard 0 only
    assert watchdog.on_deadline(_deadline("stale", "reduce"), services) == Action.RELAUNCHED
    assert services.table.get_iteration("stale", 0).reduce_relaunches == 1
    assert watchdog.on_deadline(_deadline("stale", "reduce", round_=1), services) == Action.STALE_SHARDS
    assert services.table.get_iteration("stale", 0).stale_shards == {1}
    assert np.array_equal(services.store.get_array(keys.weights("stale", 1, 1)),
                          services.store.get_array(keys.weights("stale", 0, 1)))
    assert int(services.store.get_arrays(keys.optimizer_state("stale", 1, 1))["step"]) == 0


class Crash(Exception):
    """A reducer that stops between writing its shard's optimizer state and its weights."""


def _crash_before_weights(services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
    def put_array_new(key: str, array: np.ndarray) -> bool:
        raise Crash(key)

    monkeypatch.setattr(services.store, "put_array_new", put_array_new)


def _slow_reads_drop_worker_1(fired: list[ReduceMessage], services: Services,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reducer's first try leaves worker 1 out (its read is slow), then stops before its weights."""
    monkeypatch.setenv(READ_TIMEOUT_ENV, "0.2")
    monkeypatch.setenv(READ_QUORUM_ENV, "0.5")
    faults.install(services.store.s3, services.bus.sns)
    slow = InvocationFaults(s3_get_delay=Delay(probability=1, seconds=1), s3_get_delay_match="/updates/00001")
    with monkeypatch.context() as crashing:
        _crash_before_weights(services, crashing)
        for message in fired:
            with faults.invocation(slow), pytest.raises(Crash):
                reducer.reduce(message, services)
    assert services.store.exists(keys.optimizer_state(fired[0].run_id, 0, 1))
    assert not services.store.exists(keys.weights(fired[0].run_id, 1, 0))


def test_a_retried_reducer_averages_what_its_first_try_averaged(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its retry reads every part in time, yet averages workers 0 and 2 again, as the stored state did."""
    _register(services, "retried", workers=3)
    fired = [m for w in range(3) for m in _arrive(services, "retried", w)]
    _slow_reads_drop_worker_1(fired, services, monkeypatch)
    for message in fired:  # the retries: no slow reads now
        reducer.reduce(message, services)
    assert np.array_equal(_new_weights(services, "retried"), _expected_weights([0, 2]))


def test_the_watchdog_finishes_a_reducer_that_stepped_its_shard_before_stopping(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the last reduce deadline a shard whose state is stepped takes that state's average, not the old weights."""
    _register(services, "half-done", workers=3, deadline_retries=0)
    fired = [m for w in range(3) for m in _arrive(services, "half-done", w)]
    _slow_reads_drop_worker_1(fired, services, monkeypatch)
    assert watchdog.on_deadline(_deadline("half-done", "reduce"), services) == Action.STALE_SHARDS
    assert services.table.get_iteration("half-done", 0).stale_shards == set()
    assert np.array_equal(_new_weights(services, "half-done"), _expected_weights([0, 2]))


def test_a_late_reducer_keeps_the_weights_the_watchdog_kept(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog stopped between keeping shard 0's state and its weights; the late reducer keeps both."""
    _register(services, "kept", workers=2, deadline_retries=0)
    fired = _arrive(services, "kept", 0) + _arrive(services, "kept", 1)
    with monkeypatch.context() as crashing:
        _crash_before_weights(services, crashing)
        with pytest.raises(Crash):
            watchdog.on_deadline(_deadline("kept", "reduce"), services)
    for message in fired:
        reducer.reduce(message, services)
    assert np.array_equal(services.store.get_array(keys.weights("kept", 1, 0)),
                          services.store.get_array(keys.weights("kept", 0, 0)))
    assert int(services.store.get_arrays(keys.optimizer_state("kept", 0, 1))["step"]) == 0
    assert np.array_equal(services.store.get_array(keys.weights("kept", 1, 1)),
                          _expected_weights([0, 1])[PLAN.shard(1).start:PLAN.shard(1).stop])


def test_bytes_moved_are_counted_once_per_step_however_often_it_reports(services: Services) -> None:
    _register(services, "bytes", workers=2)
    done = WorkDone(run_id="bytes", iteration=0, worker=0, samples=4, loss=0.5, compute_s=0.01)
    for _ in range(2):  # a duplicate, then a retry that found its update stored (and read less)
        services.table.record_worker(done, (100, 10))
    services.table.record_worker(done, (1, 0))
    services.table.record_worker(done.model_copy(update={"worker": 1}), (200, 20))
    for moved in ((1000, 100), (5, 0)):
        services.table.record_shard("bytes", 0, 0, moved)
    services.table.record_shard("bytes", 0, 1, (2000, 200))
    for moved in ((7, 70), (3, 0)):
        services.table.record_merge("bytes", 0, moved, None)
    record = services.table.get_iteration("bytes", 0)
    assert (record.bytes_read, record.bytes_written) == (100 + 200 + 1000 + 2000 + 7, 10 + 20 + 100 + 200 + 70)


def test_a_reducer_overtaken_by_the_watchdog_keeps_the_weights_it_kept(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While reducer 0 reads, the watchdog stores shard 0's kept state (its weights not yet): the reducer
    then writes the kept weights, not its own average, so weights and state agree."""
    _register(services, "overtaken", workers=2)
    fired = _arrive(services, "overtaken", 0) + _arrive(services, "overtaken", 1)
    read = services.store.get_quorum

    def overtaken(*args, **kwargs):
        kept = optimizers.initial_state(SGD, int(PLAN.shard(0).trainable.sum()))
        services.store.put_arrays_new(keys.optimizer_state("overtaken", 0, 1), kept,
                                      {reducer.AVERAGED_METADATA: reducer.KEPT})
        return read(*args, **kwargs)

    monkeypatch.setattr(services.store, "get_quorum", overtaken)
    reducer.reduce(fired[0], services)
    assert np.array_equal(services.store.get_array(keys.weights("overtaken", 1, 0)),
                          services.store.get_array(keys.weights("overtaken", 0, 0)))
