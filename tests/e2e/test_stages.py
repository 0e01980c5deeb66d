"""A worker's round in pipeline stages across Worker invocations (``slsml.pipeline.staged``): the digits CNN cut
into three stages, in micro-batches, trains on the local cloud to the weights of single-process Keras on
the same global batches, as a run of one stage does (``test_equivalence``)."""

from __future__ import annotations

import numpy as np

from slsml.spec import keys
from slsml.spec.config import RunConfig, TrainingSpec

from .conftest import final_weights, finish, train
from .test_equivalence import BATCH, ITERATIONS, TOLERANCE, config_of, reference

STAGES, WORKERS, MICRO_BATCH = 3, 1, 20  # the worker's 96 samples in five micro-batches (20, 19, 19, 19, 19)


def test_a_run_in_three_stages_trains_to_the_weights_of_single_process_keras(services, local, digits):
    spec = TrainingSpec(
        workers=WORKERS,
        reducers=2,
        global_batch=BATCH,
        iterations=ITERATIONS,
        optimizer=config_of("sgd-momentum"),
        eval_every=0,
        micro_batch=MICRO_BATCH,
        pipeline_stages=STAGES,
    )
    train(services, spec, "staged")
    run = finish(services, "staged")
    assert run.status == "COMPLETED", run.reason
    config = RunConfig.model_validate(services.store.get_json(keys.run_config("staged")))
    assert config.stage_blocks is not None and len(config.stage_blocks) == STAGES
    # every stage of every worker's round computed in an invocation of its own, handing on through the bucket
    handed = services.store.list_keys(keys.stages_prefix("staged", 0, 0, 0))
    assert {key.split("/")[-3] for key in handed if key.endswith(".npy")} == {"00", "01", "02"}
    assert len([key for key in handed if key.endswith("/forward/000000.npy")]) == STAGES - 1
    got, _ = final_weights(services, "staged")
    expected, _ = reference("sgd-momentum")
    error = np.abs(got - expected).max() / np.abs(expected).max()
    print(f"\n{STAGES} stages, W={WORKERS}, micro-batch {MICRO_BATCH}: max|Δw|/max|w| = {error:.2e}")
    assert error <= TOLERANCE["sgd-momentum"]
