"""A sparse compression feeding an adaptive optimizer: a warm-up of dense rounds (one epoch by default), then the
reducers' second moments frozen (1-bit Adam), so that an entry sent now and then with what it gathered moves as
far as the steps it stands for."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from pydantic import ValidationError

from slsml.pipeline import launch
from slsml.spec.compression import Compression
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import modelio, optimizers

ADAM = OptimizerConfig(name="adam", learning_rate=1e-3)


def _moved(config: OptimizerConfig, gradients: np.ndarray, frozen_from: int | None) -> np.ndarray:
    """The weights (from 0) after a step on each row of ``gradients``, the second moments frozen from step
    ``frozen_from`` on (None: never)."""
    weights, state = np.zeros(gradients.shape[1], np.float32), optimizers.initial_state(config, gradients.shape[1])
    for step, gradient in enumerate(gradients):
        frozen = frozen_from is not None and step >= frozen_from
        weights, state = optimizers.apply(config, weights, gradient, state, frozen=frozen)
    return weights


@pytest.mark.parametrize("name", sorted(optimizers.SECOND_MOMENTS))
def test_an_entry_sent_every_tenth_step_with_what_it_gathered_moves_as_far_as_dense_steps_once_frozen(name):
    config = OptimizerConfig(name=name, learning_rate=1e-3)
    rng = np.random.default_rng(0)
    warmup, steps, every = 20, 400, 10
    gradient = rng.uniform(0.5, 1.5, 8).astype(np.float32)  # an entry's gradient, the same each step
    dense = np.tile(gradient, (steps, 1))
    sparse = dense.copy()
    later = np.arange(warmup, steps)
    sparse[later] = 0  # after the warm-up, each entry goes once every tenth step, with the ten steps gathered
    sparse[later[later % every == every - 1]] = every * gradient
    reach = _moved(config, dense, warmup)
    frozen = _moved(config, sparse, warmup)
    adapting = _moved(config, sparse, None)
    np.testing.assert_allclose(frozen, reach, rtol=0.05)
    assert np.all(np.abs(adapting) < 0.6 * np.abs(reach)), "moments that adapt shrink a gathered update's step"


def test_frozen_moments_are_kept_floored_and_their_bias_corrected_at_the_step_they_froze():
    rng = np.random.default_rng(1)
    weights, state = rng.standard_normal(6).astype(np.float32), optimizers.initial_state(ADAM, 6)
    for _ in range(3):
        weights, state = optimizers.apply(ADAM, weights, rng.standard_normal(6).astype(np.float32), state)
    state["v"][0] = 0  # an entry the warm-up never saw move
    before = state["v"].copy()
    weights, frozen = optimizers.apply(ADAM, weights, rng.standard_normal(6).astype(np.float32), state, frozen=True)
    floor = optimizers.FROZEN_FLOOR * before.mean(dtype=np.float64)
    np.testing.assert_allclose(frozen["v"], np.maximum(before, floor), rtol=1e-6)
    assert int(frozen["frozen_step"]) == 3 and int(frozen["step"]) == 4
    gradient = rng.standard_normal(6).astype(np.float32)
    stepped, after = optimizers.apply(ADAM, weights, gradient, frozen, frozen=True)
    np.testing.assert_array_equal(after["v"], frozen["v"])
    m = frozen["m"] + (gradient - frozen["m"]) * np.float32(0.1)
    alpha = 1e-3 * np.sqrt(1 - 0.999**3) / (1 - 0.9**5)
    np.testing.assert_allclose(stepped, weights - alpha * m / (np.sqrt(frozen["v"]) + 1e-7), rtol=1e-5)


def test_sgd_has_no_moments_to_freeze():
    sgd = OptimizerConfig(name="sgd", learning_rate=0.1, momentum=0.9)
    gradient = np.ones(4, np.float32)
    state = optimizers.initial_state(sgd, 4)
    assert not optimizers.adaptive(sgd)
    frozen = optimizers.apply(sgd, np.zeros(4, np.float32), gradient, state, frozen=True)
    plain = optimizers.apply(sgd, np.zeros(4, np.float32), gradient, state)
    np.testing.assert_array_equal(frozen[0], plain[0])
    assert "frozen_step" not in frozen[1]


def test_a_warmup_is_refused_where_nothing_is_sparse():
    with pytest.raises(ValidationError, match="compress_warmup 3: a warm-up precedes a sparse compression"):
        TrainingSpec(workers=2, reducers=1, global_batch=8, iterations=4, compress="fp16", compress_warmup=3)


def _model(optimizer: keras.optimizers.Optimizer) -> bytes:
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return modelio.save_model(model)


@pytest.mark.parametrize(
    ("optimizer", "compress", "given", "warmup"),
    [
        (keras.optimizers.Adam(1e-3), "topk:0.1", None, 4),  # one epoch: 64 samples less 8 held out, batches of 16
        (keras.optimizers.Adam(1e-3), "significance:0.01", None, 4),
        (keras.optimizers.Adam(1e-3), "topk:0.1", 2, 2),
        (keras.optimizers.Adam(1e-3), "topk:0.1", 0, 0),
        (keras.optimizers.SGD(0.1), "topk:0.1", None, 0),  # no second moments: compressed from the first round
        (keras.optimizers.Adam(1e-3), "fp16", None, 0),
    ],
)
def test_a_run_warms_up_one_epoch_where_a_sparse_compression_feeds_an_adaptive_optimizer(
    services, optimizer, compress, given, warmup
):
    spec = TrainingSpec(
        workers=2,
        reducers=1,
        global_batch=16,
        iterations=10,
        validation_split=0.125,
        compress=compress,
        compress_warmup=given,
    )
    config = launch.prepare_run(services, _model(optimizer), "d", spec, run_id="warm")
    assert config.dense_warmup == warmup
    sent = [config.compression_at(i) for i in range(10)]
    assert sent[:warmup] == [Compression()] * warmup
    assert sent[warmup:] == [Compression.parse(compress)] * (10 - warmup)
    assert [config.moments_frozen(i) for i in range(10)] == [0 < warmup <= i for i in range(10)]
