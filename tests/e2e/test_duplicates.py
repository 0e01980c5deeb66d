"""SNS delivers at least once: delivering every message twice must change nothing."""

from __future__ import annotations

import numpy as np

from slsml.spec.config import OptimizerConfig, TrainingSpec

from .conftest import final_weights, finish, train

SPEC = TrainingSpec(
    workers=4,
    reducers=2,
    global_batch=128,
    iterations=4,
    eval_every=0,
    optimizer=OptimizerConfig(name="adam", learning_rate=3e-3),
)


def test_duplicated_deliveries_give_bit_identical_weights(local, services, digits):
    invocations_at_start = sum(local.host.invocations.values())
    train(services, SPEC, "dup-clean")
    assert finish(services, "dup-clean").status == "COMPLETED"
    invocations_before = sum(local.host.invocations.values())
    messages_per_run = invocations_before - invocations_at_start

    local.host.duplicate_deliveries = True
    try:
        train(services, SPEC, "dup-twice")
        run = finish(services, "dup-twice")
    finally:
        local.host.duplicate_deliveries = False
    assert run.status == "COMPLETED", run.reason
    assert run.iteration == SPEC.iterations
    assert sum(local.host.invocations.values()) - invocations_before >= 1.9 * messages_per_run - 5, (
        "the duplicate switch did not deliver messages twice"
    )
    clean, _ = final_weights(services, "dup-clean")
    twice, _ = final_weights(services, "dup-twice")
    assert np.array_equal(clean, twice)
    iterations = services.table.list_iterations("dup-twice")
    assert len(iterations) == SPEC.iterations
    for iteration in iterations:  # the counts are hints a duplicate inflates; the reduce took every worker once
        assert [p.worker for p in iteration.participants] == list(range(SPEC.workers))
        assert iteration.participant_count == SPEC.workers and iteration.arrived >= SPEC.workers
        assert iteration.shards_in >= SPEC.reducers and not iteration.stale_shards
