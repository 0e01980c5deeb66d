"""Mixed precision through the pipeline equals Keras's own ``fit`` under the same policy on the same global batches
(CPU both): a model saved in float32 trained with ``mixed_precision`` mixed_float16, whose float16 gradients flush to
zero without loss scaling, against ``fit`` of the model built under the policy (its optimizer wrapped in a
``LossScaleOptimizer`` by ``compile``); a model built under mixed_float16 and compiled with a ``LossScaleOptimizer``,
one of whose workers' gradient overflows, so that every shard skips the step and the scale moves as ``fit`` moves it;
and ``mixed_bfloat16``, without loss scaling."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest

from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.training import modelio

from .conftest import final_weights, finish

SAMPLES, BATCH, ITERATIONS = 192, 48, 4
CLEAN, OVERFLOWING = "mixed-clean", "mixed-big"
# a loss weighted by 1e-7, stepped at rate 1e5 (the steps of weight 1 at rate 0.01): its gradient into the float16
# layers, ~1e-9 a sample, is below float16's smallest subnormal (6e-8) and flushes to zero unless the loss is scaled
WEIGHT, RATE = 1e-7, 1e5
BIG_AT = (1, 30)  # (iteration, position in its global batch): a sample past float16's range, worker 1 of 3's
# max|Δw| / max|w| against fit. Measured: 3.5e-6 (float16, SGD, 2 workers), 3.2e-5 (float16, Adam, 3 workers), 3.5e-4
# (bfloat16, Adam, 2 workers): each worker's sums over its share, rounded to float16's 11 bits (bfloat16's 8), differ
# from one process's over the global batch, and Adam divides by ~|g|, which amplifies them where g is near zero.
TOLERANCE = {"mp-option": 2e-5, "mp-overflow": 2e-4, "mp-bfloat16": 3e-3}


def _dataset(big: bool) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((SAMPLES + 32, 8)).astype(np.float32), rng.standard_normal((SAMPLES + 32, 4))
    if big:
        iteration, position = BIG_AT
        x[data.global_batch_indices(SAMPLES, BATCH, seed=0, iteration=iteration)[position], 0] = 1e5
    return x[:SAMPLES], y[:SAMPLES].astype(np.float32), x[SAMPLES:], y[SAMPLES:].astype(np.float32)


def _model(policy: str | None, optimizer: Callable[[], Any], **compiled: Any) -> keras.Model:
    """The model built under ``policy`` (None: in float32), compiled with ``optimizer()``."""
    keras.utils.set_random_seed(7)
    keras.config.set_dtype_policy(policy or "float32")
    try:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(4)])
    finally:
        keras.config.set_dtype_policy("float32")
    model.compile(optimizer=optimizer(), loss="mse", **compiled)
    return model


# each run: its model's policy (None: saved in float32), optimizer and compile options, whether its data overflows,
# its workers and its mixed_precision option
RUNS: dict[str, tuple[str | None, Callable[[], Any], dict[str, Any], bool, int, str | None]] = {
    "mp-option": (None, lambda: keras.optimizers.SGD(RATE), {"loss_weights": [WEIGHT]}, False, 2, "mixed_float16"),
    "mp-overflow": (
        "mixed_float16",
        lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01), dynamic_growth_steps=2),
        {},
        True,
        3,
        None,
    ),
    "mp-bfloat16": ("mixed_bfloat16", lambda: keras.optimizers.Adam(0.01), {}, False, 2, None),
}


@pytest.fixture(scope="module")
def mixed_runs(services):
    for name, big in ((CLEAN, False), (OVERFLOWING, True)):
        data.put_dataset(services.store, name, *_dataset(big))
    for run_id, (policy, optimizer, compiled, big, workers, option) in RUNS.items():
        spec = TrainingSpec(
            workers=workers,
            reducers=2,
            global_batch=BATCH,
            iterations=ITERATIONS,
            eval_every=0,
            mixed_precision=option,
        )
        model = modelio.save_model(_model(policy, optimizer, **compiled))
        launch.start_run(services, model, OVERFLOWING if big else CLEAN, spec, run_id=run_id)
    return {run_id: finish(services, run_id) for run_id in RUNS}


def _flat(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])


@functools.cache
def _fit(run_id: str, scaled: bool = True) -> tuple[np.ndarray, keras.Model]:
    """Keras's ``fit`` of the run's model (built under its policy, or the option's) on the pipeline's global
    batches, in one process: its final weights, and the model. ``scaled``: compiled as ``compile`` wraps it (a
    mixed_float16 model's optimizer in a LossScaleOptimizer), else without loss scaling."""
    policy, optimizer, compiled, big, _, option = RUNS[run_id]
    model = _model(policy or option, optimizer, auto_scale_loss=scaled, **compiled)
    x, y, _, _ = _dataset(big)
    order = np.concatenate([data.global_batch_indices(SAMPLES, BATCH, 0, i) for i in range(ITERATIONS)])
    model.fit(x[order], y[order], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return _flat(model), model


def _error(run_id: str, services) -> float:
    got, _ = final_weights(services, run_id)
    expected, _ = _fit(run_id)
    error = float(np.abs(got - expected).max() / np.abs(expected).max())
    print(f"\n{run_id}: max|Δw|/max|w| against fit = {error:.2e} (tolerance {TOLERANCE[run_id]:g})")
    return error


def test_the_option_trains_a_float32_model_whose_float16_gradients_flush_to_zero_as_fit_under_the_policy(
    mixed_runs, services
):
    run = mixed_runs["mp-option"]
    assert run.status == "COMPLETED", run.reason
    assert run.training.mixed_precision == "mixed_float16"  # the option, on the run's record
    initial = _flat(_model(None, lambda: keras.optimizers.SGD(RATE)))
    expected, model = _fit("mp-option")
    unscaled, _ = _fit("mp-option", scaled=False)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert np.array_equal(unscaled, initial)  # without loss scaling every gradient flushed to zero: nothing moved
    moved = np.abs(expected - unscaled).max() / np.abs(expected).max()
    assert moved > 100 * TOLERANCE["mp-option"], f"loss scaling moved the weights by {moved:.2e} only"
    assert _error("mp-option", services) <= TOLERANCE["mp-option"]
    final = modelio.load_model(services.store.get(keys.final_model("mp-option")))
    assert {layer.dtype_policy.name for layer in final.layers} == {"float32"}  # the model as it was given
    assert isinstance(final.optimizer, keras.optimizers.LossScaleOptimizer)  # holding the scale it ended with
    assert float(final.optimizer.dynamic_scale) == float(model.optimizer.dynamic_scale) == 2.0**15


def test_one_workers_overflow_skips_the_step_on_every_shard_and_the_scale_moves_as_fit_moves_it(mixed_runs, services):
    run = mixed_runs["mp-overflow"]
    assert run.status == "COMPLETED", run.reason
    _, model = _fit("mp-overflow")
    # fit: the step of the BIG sample skipped and the scale halved, then two finite steps doubled it back
    assert (float(model.optimizer.dynamic_scale), int(model.optimizer.step_counter)) == (2.0**15, 0)
    assert int(model.optimizer.iterations) == ITERATIONS - 1
    final = modelio.load_model(services.store.get(keys.final_model("mp-overflow")))
    assert isinstance(final.optimizer, keras.optimizers.LossScaleOptimizer)
    assert (float(final.optimizer.dynamic_scale), int(final.optimizer.step_counter)) == (2.0**15, 0)
    assert int(final.optimizer.iterations) == ITERATIONS - 1  # the skipped step did not step Adam, on any shard
    assert _error("mp-overflow", services) <= TOLERANCE["mp-overflow"]


def test_bfloat16_trains_as_fit_does_without_loss_scaling(mixed_runs, services):
    run = mixed_runs["mp-bfloat16"]
    assert run.status == "COMPLETED", run.reason
    final = modelio.load_model(services.store.get(keys.final_model("mp-bfloat16")))
    assert not isinstance(final.optimizer, keras.optimizers.LossScaleOptimizer)
    assert {layer.dtype_policy.name for layer in final.layers} == {"mixed_bfloat16"}
    assert _error("mp-bfloat16", services) <= TOLERANCE["mp-bfloat16"]


def test_a_model_built_under_another_policy_is_refused_at_start_and_nothing_is_stored(mixed_runs, services):
    from slsml.spec.errors import BadInputError

    spec = TrainingSpec(workers=2, reducers=2, global_batch=BATCH, iterations=1, mixed_precision="mixed_float16")
    model = modelio.save_model(_model("mixed_bfloat16", lambda: keras.optimizers.Adam(0.01)))
    with pytest.raises(
        BadInputError, match="computes under mixed_bfloat16: it cannot train under mixed_precision mixed_float16"
    ):
        launch.start_run(services, model, CLEAN, spec, run_id="mp-other-policy")
    assert not services.store.list_keys(keys.run_prefix("mp-other-policy"))
