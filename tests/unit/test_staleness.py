"""Bounded staleness (SSP): a worker's update that comes after its iteration's reduce fired is folded into the
reduce of a later iteration, at most ``staleness`` iterations later, once, weighted by its samples (× the decay
per iteration of age); beyond the bound it is left out, as without staleness."""

from __future__ import annotations

import numpy as np
import pytest

from slsml.client import runs
from slsml.pipeline.services import Services
from slsml.pipeline.steps import reduce_launcher, reducer
from slsml.spec.config import TrainingSpec
from slsml.spec.messages import Participant, ReduceMessage
from slsml.training import optimizers

from . import test_reduce_steps
from .test_reduce_steps import PLAN, SAMPLES, SGD, VECTORS, _arrive, _done, _etag, _manifest, _register, _shard

services = test_reduce_steps.services  # the fixture: a run table, bucket, topics and queue in moto


def _launch(services: Services, run_id: str, iteration: int, fired: list[ReduceMessage]) -> None:
    """Finish ``iteration - 1``'s reduce (every shard) and launch ``iteration``."""
    for message in fired:
        reducer.reduce(message, services)
    _manifest(services, run_id, iteration)
    assert services.table.claim_launch(run_id, iteration, f"launch-{iteration}", 0, 3) is not None


def test_a_late_update_is_folded_into_the_next_reduce_once_and_weighted_by_its_samples(services: Services) -> None:
    _register(services, "ssp", workers=3, quorum=0.6, staleness=2)
    fired = _arrive(services, "ssp", 0, iteration=0) + _arrive(services, "ssp", 1, iteration=0)
    assert fired and not _arrive(services, "ssp", 2, iteration=0)  # quorum 2 of 3: worker 2 is late
    _launch(services, "ssp", 1, fired)
    assert not _arrive(services, "ssp", 0, iteration=1)
    fired = _arrive(services, "ssp", 1, iteration=1)
    late = Participant(worker=2, samples=SAMPLES[2], iteration=0, etag=_etag(2, iteration=0))
    assert all(late in message.participants for message in fired)
    assert services.table.get_iteration("ssp", 0).folded == {2}
    again = reduce_launcher.on_work_done(
        _done("ssp", 1, iteration=1),
        services,
    )  # a duplicate
    assert again == []  # its reduce went out with the late update the first time

    before = np.concatenate([_shard(services, "ssp", 1, r).weights for r in range(PLAN.reducers)])
    for message in fired:
        reducer.reduce(message, services)
    after = np.concatenate([_shard(services, "ssp", 2, r).weights for r in range(PLAN.reducers)])
    parts = [(VECTORS[0] + 1, SAMPLES[0]), (VECTORS[1] + 1, SAMPLES[1]), (VECTORS[2], SAMPLES[2])]
    mean = sum(v.astype(np.float64) * n for v, n in parts) / sum(n for _, n in parts)
    trainable = PLAN.trainable_mask()
    state = optimizers.initial_state(SGD, int(trainable.sum()))
    state["step"] = np.ones((), dtype=np.int64)
    expected = before.copy()
    expected[trainable] = optimizers.apply(SGD, before[trainable], mean.astype(np.float32)[trainable], state)[0]
    expected[~trainable] = mean.astype(np.float32)[~trainable]
    assert np.allclose(after, expected, rtol=1e-6, atol=1e-7)

    _launch(services, "ssp", 2, [])
    fired = _arrive(services, "ssp", 0, iteration=2) + _arrive(services, "ssp", 1, iteration=2)
    assert fired and all(p.iteration is None for p in fired[0].participants), "folded twice"


def test_beyond_the_bound_a_late_update_is_left_out_and_counted(services: Services) -> None:
    _register(services, "ssp-bound", workers=3, quorum=0.6, staleness=1)
    fired = _arrive(services, "ssp-bound", 0, iteration=0) + _arrive(services, "ssp-bound", 1, iteration=0)
    _launch(services, "ssp-bound", 1, fired)
    fired = _arrive(services, "ssp-bound", 0, iteration=1) + _arrive(services, "ssp-bound", 1, iteration=1)
    assert not _arrive(services, "ssp-bound", 2, iteration=1)  # late in iteration 1 too
    assert not _arrive(services, "ssp-bound", 2, iteration=0)  # iteration 0's worker 2 comes after iteration 1 fired
    _launch(services, "ssp-bound", 2, fired)
    fired = _arrive(services, "ssp-bound", 0, iteration=2) + _arrive(services, "ssp-bound", 1, iteration=2)
    folded = [p for p in fired[0].participants if p.iteration is not None]
    assert folded == [
        Participant(worker=2, samples=SAMPLES[2], iteration=1, etag=_etag(2, iteration=1))
    ]  # iteration 0's is beyond the bound
    iterations = services.table.list_iterations("ssp-bound")
    summary = runs.summarize(services.table.get_run("ssp-bound"), iterations, 1.0)
    assert (summary.late_workers, summary.late_folded) == (2, 1)


def test_without_staleness_a_late_update_is_left_out(services: Services) -> None:
    _register(services, "no-ssp", workers=3, quorum=0.6)
    fired = _arrive(services, "no-ssp", 0, iteration=0) + _arrive(services, "no-ssp", 1, iteration=0)
    assert not _arrive(services, "no-ssp", 2, iteration=0)
    _launch(services, "no-ssp", 1, fired)
    fired = _arrive(services, "no-ssp", 0, iteration=1) + _arrive(services, "no-ssp", 1, iteration=1)
    assert all(p.iteration is None for p in fired[0].participants)
    assert services.table.get_iteration("no-ssp", 0).folded == set()


def test_stale_weights_are_refused_for_a_rule_whose_workers_send_what_their_local_steps_moved() -> None:
    with pytest.raises(ValueError, match="stale_weights steps the model with gradients") as refused:
        TrainingSpec(workers=2, global_batch=8, algorithm="average", stale_weights=1)
    assert "use algorithm gradient, or stale_weights 0" in str(refused.value)
    assert TrainingSpec(workers=2, global_batch=8, stale_weights=1).stale_weights == 1
