"""Fully asynchronous training (ASP, ``staleness unbounded``): the reduce of the model version the run is at applies
every update waiting when it fires (those that come while it is reduced wait for the next version, with no
barrier), and advances the version by their count; an update's staleness is the updates applied since the version
it read; a duplicate changes nothing; the updates take the synchronous run's slots in order, whichever workers are
free."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from slsml.cli import options
from slsml.client import runs
from slsml.data import datasets as data
from slsml.pipeline.services import Services
from slsml.pipeline.steps import reduce_launcher, reducer, watchdog, work_launcher
from slsml.pipeline.steps.common import run_config
from slsml.pipeline.steps.watchdog import Action
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.spec.messages import Deadline, ModelMerged, Participant, ReduceMessage
from slsml.state import barrier
from slsml.state.records import MERGER_OWNER, META
from slsml.training import optimizers

from . import test_reduce_steps
from .test_reduce_steps import PLAN, SAMPLES, SGD, VECTORS, _arrive, _done, _etag, _manifest, _register, _shard, _update

services = test_reduce_steps.services  # the fixture: a run table, bucket, topics and queue in moto


def _merge(services: Services, run_id: str, fired: list[ReduceMessage]) -> list[ReduceMessage]:
    """Reduce every shard of ``fired``, advance the run as the Merger does (by the updates applied) and launch the
    next version: the reduce of the updates waiting (``apply_next``, which the Merger calls) comes back."""
    for message in fired:
        reducer.reduce(message, services)
    version = fired[0].iteration + len(fired[0].participants)
    _manifest(services, run_id, version)
    assert services.table.advance(run_id, version, 0) is not None
    assert services.table.claim_launch(run_id, version, f"launch-{version}", 0, 3) is not None
    return reduce_launcher.apply_next(services, run_config(services, run_id), 0, MERGER_OWNER)


def _weights(services: Services, run_id: str, version: int) -> np.ndarray:
    return np.concatenate([_shard(services, run_id, version, r).weights for r in range(PLAN.reducers)])


def test_the_updates_that_came_while_a_version_was_reduced_are_applied_together_to_the_next(services) -> None:
    _register(services, "asp", workers=3, staleness="unbounded", iterations=9)
    fired = _arrive(services, "asp", 1, iteration=0)
    assert len(fired) == PLAN.reducers
    assert all(
        m.iteration == 0 and m.participants == (Participant(worker=1, samples=SAMPLES[1], etag=_etag(1, iteration=0)),)
        for m in fired
    )
    assert _arrive(services, "asp", 0, iteration=0) == []  # version 0's reduce is out: they wait, no barrier
    assert _arrive(services, "asp", 2, iteration=0) == []
    assert [p.worker for p in services.table.waiting("asp", 3, 0)] == [0, 2]

    following = _merge(services, "asp", fired)  # both, on version 1, each read version 0: stale by one update
    stale = tuple(Participant(worker=w, samples=SAMPLES[w], iteration=0, etag=_etag(w, iteration=0)) for w in (0, 2))
    assert [m.participants for m in following] == [stale] * PLAN.reducers
    assert services.table.waiting("asp", 3, 0) == []

    before = _weights(services, "asp", 1)
    for message in following:  # one step with their samples-weighted mean: the version after is 1 + 2
        assert reducer.reduce(message, services).updates == 2
    mean = (VECTORS[0] * SAMPLES[0] + VECTORS[2] * SAMPLES[2]) / (SAMPLES[0] + SAMPLES[2])
    trainable = PLAN.trainable_mask()
    state = optimizers.initial_state(SGD, int(trainable.sum()))
    state["step"] = np.ones((), dtype=np.int64)
    expected = before.copy()
    expected[trainable] = optimizers.apply(SGD, before[trainable], mean[trainable], state)[0]
    expected[~trainable] = mean[~trainable]
    assert np.allclose(_weights(services, "asp", 3), expected, rtol=1e-6, atol=1e-6)
    assert not any(services.store.exists(keys.shard("asp", 2, r)) for r in range(PLAN.reducers))

    # version 1 launched worker 1 with update 3; version 3 launches workers 0 and 2 with the next two
    assert work_launcher.asynchronous_launches(services, "asp", 1, 3, 9) == {1: 3}
    assert work_launcher.asynchronous_launches(services, "asp", 3, 3, 9) == {0: 4, 2: 5}
    assert work_launcher.asynchronous_launches(services, "asp", 3, 3, 5) == {0: 4}  # none past the budget


def test_a_duplicate_report_of_an_applied_update_is_applied_once_and_leaves_the_next_one_waiting(services) -> None:
    _register(services, "asp-dup", workers=3, staleness="unbounded", iterations=9)
    fired = _arrive(services, "asp-dup", 2, iteration=0)
    assert (
        reduce_launcher.on_work_done(_done("asp-dup", 2, iteration=0), services) == fired
    )  # its copy: the same reduce again
    assert _arrive(services, "asp-dup", 0, iteration=0) == []
    following = _merge(services, "asp-dup", fired)  # worker 0's update, on version 1
    assert [p.worker for p in following[0].participants] == [0]
    assert (
        _arrive(services, "asp-dup", 2, iteration=1) == []
    )  # worker 2, launched again on version 1, waits for version 2
    assert (
        reduce_launcher.on_work_done(_done("asp-dup", 2, iteration=0), services) == []
    )  # a late copy of its first update
    assert services.table.waiting("asp-dup", 3, 0) == [
        Participant(worker=2, samples=SAMPLES[2], iteration=1, etag=_etag(2, iteration=1))
    ]
    last = _merge(services, "asp-dup", following)
    assert next(m.participants for m in last) == (
        Participant(worker=2, samples=SAMPLES[2], iteration=1, etag=_etag(2, iteration=1)),
    )
    assert [sorted(p.worker for p in services.table.get_iteration("asp-dup", v).participants) for v in range(3)] == [
        [2],
        [0],
        [2],
    ]
    assert services.table.waiting("asp-dup", 3, 0) == []
    # a copy of that update's report, its version not merged yet: the Merger's step fired it, nothing goes again
    assert reduce_launcher.on_work_done(_done("asp-dup", 2, iteration=1), services) == []
    assert [p.worker for p in services.table.get_iteration("asp-dup", 2).participants] == [2]
    assert _merge(services, "asp-dup", last) == []  # the next version finds it applied: its entry goes, unapplied
    assert services.table.waiting("asp-dup", 3, 0) == []
    assert services.table.frozen_participants("asp-dup", 3) is None


def test_of_two_steps_that_find_the_same_updates_waiting_one_fires_the_version(services) -> None:
    config = _register(services, "asp-race", workers=3, staleness="unbounded", iterations=9)
    for worker in (1, 2):  # both reports stored and waiting before either step fires
        services.store.put_new(keys.update("asp-race", 0, worker), *_update(worker, iteration=0))
        services.table.record_worker(_done("asp-race", worker, iteration=0))
        services.table.wait(_done("asp-race", worker, iteration=0))
    fired = reduce_launcher.apply_next(services, config, 0, 2)
    assert [[p.worker for p in m.participants] for m in fired] == [[1, 2]] * PLAN.reducers
    assert reduce_launcher.apply_next(services, config, 0, 1) == []  # worker 1's step: the version fired
    assert services.table.get_counter("asp-race", 0).reduce_fired_by == 2
    assert services.table.waiting("asp-race", config.workers, 0) == []


def test_a_version_reads_its_waiting_updates_by_key_and_the_merger_its_run_as_it_advanced_it(services) -> None:
    """The chain's reads cost the same however much the table holds: no query, and no read of the run the Merger
    has just written."""
    config = _register(services, "asp-keys", workers=3, staleness="unbounded", iterations=9)
    for worker in (0, 2):
        services.store.put_new(keys.update("asp-keys", 0, worker), *_update(worker, iteration=0))
        services.table.record_worker(_done("asp-keys", worker, iteration=0))
        services.table.wait(_done("asp-keys", worker, iteration=0))
    sent: list[tuple[str, dict]] = []

    def record(model: Any, params: dict, **_: Any) -> None:
        sent.append((model.name, params))

    events = services.table.table.meta.client.meta.events
    events.register("before-parameter-build.dynamodb", record)
    try:
        advanced = services.table.get_run("asp-keys")
        sent.clear()
        fired = reduce_launcher.apply_next(services, config, 0, MERGER_OWNER, advanced)
    finally:
        events.unregister("before-parameter-build.dynamodb", record)
    assert [[p.worker for p in m.participants] for m in fired] == [[0, 2]] * PLAN.reducers
    assert "Query" not in {name for name, _ in sent}
    assert not any(name == "GetItem" and META in str(params["Key"]["sk"]) for name, params in sent)


def test_a_deadline_applies_an_update_whose_reduce_was_never_fired(services) -> None:
    config = _register(services, "asp-lost", workers=2, staleness="unbounded", iterations=4)
    services.store.put_new(keys.update("asp-lost", 0, 1), *_update(1, iteration=0))
    services.table.record_worker(_done("asp-lost", 1, iteration=0))
    services.table.wait(_done("asp-lost", 1, iteration=0))  # the report's step ended before it fired the reduce
    deadline = Deadline(run_id="asp-lost", iteration=0, generation=0, stage="work", round=0, due_at=0)
    action, following = watchdog._work_deadline(deadline, config, services.table.get_iteration("asp-lost", 0), services)
    assert action == Action.FIRED and following is not None and following.stage == "reduce"
    assert services.table.get_iteration("asp-lost", 0).participants == [
        Participant(worker=1, samples=SAMPLES[1], etag=_etag(1, iteration=0))
    ]


def test_a_deadline_sends_the_reduce_of_a_version_frozen_by_a_step_that_ended_before_sending_it(services) -> None:
    config = _register(services, "asp-frozen", workers=2, staleness="unbounded", iterations=4)
    services.store.put_new(keys.update("asp-frozen", 0, 1), *_update(1, iteration=0))
    services.table.record_worker(_done("asp-frozen", 1, iteration=0))
    services.table.wait(_done("asp-frozen", 1, iteration=0))
    (waiting,) = services.table.waiting("asp-frozen", config.workers, 0)
    assert services.table.fold("asp-frozen", waiting, 0)  # worker 1's step froze the version, then ended
    mine = waiting.model_copy(update={"iteration": None})
    assert services.table.freeze_participants("asp-frozen", 0, 1, [mine], 0) == (1, [mine])
    assert reduce_launcher.apply_next(services, config, 0, 0) == []  # another worker's step leaves it to its owner
    deadline = Deadline(run_id="asp-frozen", iteration=0, generation=0, stage="work", round=0, due_at=0)
    record = services.table.get_iteration("asp-frozen", 0)
    action, following = watchdog._work_deadline(deadline, config, record, services)
    assert action == Action.FIRED and following is not None and following.stage == "reduce"
    assert services.table.get_counter("asp-frozen", 0).reduce_fired_by == 1
    assert services.table.get_iteration("asp-frozen", 0).participants == [mine]
    assert services.table.waiting("asp-frozen", config.workers, 0) == []
    again = watchdog._work_deadline(deadline, config, services.table.get_iteration("asp-frozen", 0), services)
    assert again[0] != Action.FIRED  # sent once: a later deadline finds it fired


def test_a_worker_whose_update_never_came_is_relaunched_on_its_version_then_the_run_fails_naming_it(services) -> None:
    config = _register(services, "asp-dead", workers=3, staleness="unbounded", iterations=6)
    fired = _arrive(services, "asp-dead", 1, iteration=0)
    assert _arrive(services, "asp-dead", 2, iteration=0) == []  # waits for version 1
    following = _merge(services, "asp-dead", fired)  # worker 2's update made version 2's; worker 1 was launched on 1
    _merge(services, "asp-dead", following)  # version 2: worker 2 launched on it; worker 0 never reported on 0
    deadline = Deadline(run_id="asp-dead", iteration=2, generation=0, stage="work", round=0, due_at=0)
    action, following = watchdog._work_deadline(deadline, config, services.table.get_iteration("asp-dead", 2), services)
    assert action == Action.RELAUNCHED and following is not None and following.round == 1
    relaunched = {v: services.table.get_iteration("asp-dead", v).relaunched for v in range(3)}
    assert relaunched == {0: {0: 1}, 1: {1: 1}, 2: {2: 1}}  # each worker on the version it was last launched on
    last_launches = watchdog._last_launches(services, config, 2)
    assert {w: (record.iteration, update) for w, (record, update) in last_launches.items()} == {
        0: (0, 0),
        1: (1, 3),
        2: (2, 4),
    }  # with the number of the update it computes there

    retries = config.training.deadline_retries
    last = deadline.model_copy(update={"round": retries})
    action, following = watchdog._work_deadline(last, config, services.table.get_iteration("asp-dead", 2), services)
    run = services.table.get_run("asp-dead")
    assert (action, following, run.status) == (Action.FAILED, None, "FAILED")
    assert run.reason is not None and "model version 2: no worker's update arrived" in run.reason


@pytest.mark.parametrize("workers", [1, 3, 4])
def test_the_updates_take_each_slot_of_the_synchronous_rounds_once_in_order_however_they_are_batched(
    workers: int,
) -> None:
    budget, rng = 5 * workers, np.random.default_rng(workers)  # 5 synchronous rounds' worth of updates
    in_flight = barrier.asynchronous_updates(0, list(range(workers)), workers, budget)  # version 0 launches all
    launched, version = list(in_flight.values()), 0
    while in_flight:  # each version applies some of the updates in flight and launches their workers again
        applied = sorted(rng.choice(sorted(in_flight), size=rng.integers(1, len(in_flight) + 1), replace=False))
        version += len(applied)
        for worker in applied:
            del in_flight[worker]
        fresh = barrier.asynchronous_updates(version, [int(w) for w in applied], workers, budget)
        in_flight |= fresh
        launched += fresh.values()
    assert version == budget  # the final version is the run's iterations
    taken = [data.asynchronous_task(update, workers) for update in launched]
    assert taken == [(s, r) for r in range(5) for s in range(workers)]


def test_staleness_unbounded_is_one_setting_its_options_refused_with_the_reason() -> None:
    spec = TrainingSpec(workers=4, iterations=40, staleness="unbounded")
    assert spec.asynchronous and spec.staleness_bound == 0
    assert not TrainingSpec(workers=4, iterations=40, staleness=3).asynchronous
    parser = options.argparse.ArgumentParser()
    options.training_flags(parser, iterations=10, required=False)
    assert parser.parse_args(["--staleness", "unbounded"]).staleness == "unbounded"
    assert parser.parse_args(["--staleness", "2"]).staleness == 2
    for refused, named in [
        ({"quorum": 0.5}, "quorum does not apply with staleness unbounded"),
        ({"workers": "auto", "min_workers": 2, "max_workers": 4}, "staleness unbounded trains a fixed fleet"),
        ({"compress": "topk:0.1"}, "compress topk:0.1 does not apply with staleness unbounded .*error feedback"),
        ({"compress": "fp16"}, "compress fp16 does not apply with staleness unbounded .*or compress sparse"),
    ]:
        with pytest.raises(ValidationError, match=named):
            TrainingSpec.model_validate({"workers": 4, "iterations": 40, "staleness": "unbounded", **refused})
    # exact sparse updates keep no residual: ASP takes them
    assert TrainingSpec(workers=4, iterations=40, staleness="unbounded", compress="sparse").compression.kind == "sparse"


def test_an_asynchronous_epoch_is_the_workers_times_the_synchronous_one() -> None:
    synchronous = TrainingSpec(workers=4, iterations=40, global_batch=128)
    asynchronous = synchronous.model_copy(update={"staleness": "unbounded"})
    assert data.epoch_iterations(asynchronous, 1000) == 4 * data.epoch_iterations(synchronous, 1000) > 0


def test_an_asp_run_that_ended_cannot_resume_and_says_what_to_do_instead(services) -> None:
    _register(services, "asp-ended", workers=2, staleness="unbounded", iterations=4)
    services.table.fail("asp-ended", "stopped for the test")
    with pytest.raises(BadInputError, match="staleness unbounded, which cannot resume: fetch its last model"):
        runs.resume_run(services, "asp-ended")
    assert services.table.get_run("asp-ended").status == "FAILED"  # nothing changed


def test_a_version_the_run_moved_past_before_its_launch_came_still_launches_its_freed_worker(services) -> None:
    config = _register(services, "asp-behind", workers=3, staleness="unbounded", iterations=9)
    fired = _arrive(services, "asp-behind", 1, iteration=0)
    assert _arrive(services, "asp-behind", 0, iteration=0) == []
    for message in fired:
        reducer.reduce(message, services)
    assert services.table.advance("asp-behind", 1, 0) is not None  # version 1, worker 1 freed: its launch is late
    _manifest(services, "asp-behind", 1)
    following = reduce_launcher.apply_next(services, config, 0, MERGER_OWNER)  # worker 0's update, to version 1
    for message in following:
        reducer.reduce(message, services)
    assert services.table.advance("asp-behind", 2, 0) is not None
    outcome = work_launcher.on_merged(ModelMerged(run_id="asp-behind", iteration=1, generation=0), services)
    assert outcome == work_launcher.Outcome.LAUNCHED
    assert services.table.get_counter("asp-behind", 1).launched_by is not None


def test_the_merger_advances_the_run_by_the_updates_a_version_applied_and_checkpoints_past_a_multiple(
    services,
) -> None:
    from slsml.pipeline.steps import merger

    fired = test_reduce_steps._merge_run(
        services, "asp-merge", workers=3, staleness="unbounded", iterations=9, checkpoint_every=2
    )  # worker 0's update fired version 0 alone; workers 1 and 2 wait
    assert [p.worker for p in fired[0].participants] == [0]
    dones = [reducer.reduce(message, services) for message in fired]
    assert [merger.on_reduce_done(d, services) for d in dones] == [None, keys.manifest("asp-merge", 1)]
    frozen = services.table.frozen_participants("asp-merge", 1)  # the Merger applied both waiting to version 1
    assert frozen is not None and [p.worker for p in frozen[1]] == [1, 2]
    following = [
        ReduceMessage(run_id="asp-merge", iteration=1, shard=r, participants=tuple(frozen[1])) for r in range(2)
    ]
    dones = [reducer.reduce(message, services) for message in following]
    assert [merger.on_reduce_done(d, services) for d in dones] == [None, keys.manifest("asp-merge", 3)]
    assert services.table.get_run("asp-merge").iteration == 3  # 1 + the 2 updates: version 2 never exists
    assert not services.store.exists(keys.manifest("asp-merge", 2))
    assert services.store.exists(keys.model("asp-merge", 3))  # the first version past 2, a multiple of checkpoint_every
    assert services.table.get_counter("asp-merge", 1).launched_by is None  # merged before its launch came
