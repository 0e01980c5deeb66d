"""Gradient clipping on shards against keras.optimizers clipping the whole gradient, with shards that
cut across variables: clipvalue element-wise, clipnorm per variable and global_clipnorm over everything
need the sums of squares exchanged between shards."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from slsml.spec.config import OptimizerConfig
from slsml.spec.shardplan import ShardPlan, VariableSpec
from slsml.training import clipping, optimizers

STEPS = 12
VARIABLES = [
    VariableSpec(name="dense/kernel", shape=(6, 5), trainable=True),
    VariableSpec(name="dense/bias", shape=(5,), trainable=True),
    VariableSpec(name="norm/moving_mean", shape=(5,), trainable=False),
    VariableSpec(name="head/kernel", shape=(5, 3), trainable=True),
    VariableSpec(name="head/bias", shape=(3,), trainable=True),
]
PLAN = ShardPlan.build(VARIABLES, reducers=3)
TRAINABLE = [v for v in VARIABLES if v.trainable]
KERAS = {
    "sgd-clipnorm": lambda: keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, clipnorm=0.5),
    "adam-global-clipnorm": lambda: keras.optimizers.Adam(learning_rate=0.01, global_clipnorm=1.0),
    "adamw-clipvalue": lambda: keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.1, clipvalue=0.2),
}


def _gradients(rng: np.random.Generator) -> list[np.ndarray]:
    """Per trainable variable; variables differ in scale so that clipping bites on some, not all."""
    return [
        (rng.standard_normal(v.shape) * scale).astype(np.float32)
        for v, scale in zip(TRAINABLE, (0.6, 0.05, 0.4, 2.0), strict=True)
    ]


def _flat(trainable: list[np.ndarray], frozen: np.ndarray) -> np.ndarray:
    arrays, parts = [], iter(trainable)
    for v in VARIABLES:
        arrays.append(next(parts) if v.trainable else frozen)
    return PLAN.flatten(arrays)


def _keras_weights(case: str, initial: list[np.ndarray], gradients: list[list[np.ndarray]]) -> list[np.ndarray]:
    optimizer = KERAS[case]()
    variables = [keras.Variable(w, name=v.name.rsplit("/", 1)[-1]) for w, v in zip(initial, TRAINABLE, strict=True)]
    for step in gradients:
        optimizer.apply_gradients(zip(step, variables, strict=True))
    return [np.asarray(v) for v in variables]


def _sharded_weights(config: OptimizerConfig, initial: np.ndarray, gradients: list[np.ndarray], exchange) -> np.ndarray:
    """Each shard steps on its own, with the sums of squares ``exchange`` gives it."""
    states = [optimizers.initial_state(config, int(PLAN.shard(r).trainable.sum())) for r in range(PLAN.reducers)]
    weights = initial.copy()
    for gradient in gradients:
        parts = [gradient[PLAN.shard(r).start : PLAN.shard(r).stop] for r in range(PLAN.reducers)]
        shares = [clipping.shared_squares(config, PLAN, r, part) for r, part in enumerate(parts)]
        for r, part in enumerate(parts):
            layout = PLAN.shard(r)
            clipped = clipping.clip(config, PLAN, r, part, exchange(shares, r))
            decays = PLAN.mask(r, lambda v: config.decays(v.name))[layout.trainable]
            current = weights[layout.start : layout.stop]
            stepped, states[r] = optimizers.apply(
                config, current[layout.trainable], clipped[layout.trainable], states[r], decays
            )
            current[layout.trainable] = stepped
    return weights


def test_the_plan_cuts_clipped_variables() -> None:
    assert clipping.needs_exchange(OptimizerConfig(clipnorm=1.0), PLAN)
    assert not clipping.needs_exchange(OptimizerConfig(clipvalue=1.0), PLAN)
    assert not clipping.needs_exchange(OptimizerConfig(global_clipnorm=1.0), ShardPlan.build(VARIABLES, reducers=1))
    cut = [p for r in range(PLAN.reducers) for p in PLAN.pieces(r) if not p.whole and p.variable.trainable]
    assert cut, "every variable whole in one shard: the exchange would not be exercised"


@pytest.mark.parametrize("case", list(KERAS))
def test_sharded_clipping_matches_keras(case: str) -> None:
    rng = np.random.default_rng(7)
    initial = [rng.standard_normal(v.shape).astype(np.float32) for v in TRAINABLE]
    gradients = [_gradients(rng) for _ in range(STEPS)]
    optimizer = KERAS[case]()
    config = OptimizerConfig.from_keras(type(optimizer).__name__, optimizer.get_config())
    frozen = np.zeros(5, dtype=np.float32)
    flat_gradients = [_flat(step, frozen) for step in gradients]
    trained = _keras_weights(case, initial, gradients)
    expected = _flat(trained, frozen)
    got = _sharded_weights(config, _flat(initial, frozen), flat_gradients, lambda shares, r: clipping.totals(shares))
    scale = np.abs(expected).max()
    assert np.abs(got - expected).max() <= 1e-6 * scale
    clipped = [
        np.abs(clipping.clip(config, ShardPlan.build(VARIABLES, 1), 0, g, None) - g).max() > 0 for g in flat_gradients
    ]
    assert sum(clipped) > STEPS // 2, "clipping must be active in most steps"
    if clipping.needs_exchange(config, PLAN):  # the test fails if a shard takes the norm of its own slice
        alone = _sharded_weights(
            config, _flat(initial, frozen), flat_gradients, lambda shares, r: clipping.totals([shares[r]])
        )
        assert np.abs(alone - expected).max() > 100 * 1e-6 * scale


def test_clipping_by_norm_without_the_exchange_is_refused() -> None:
    with pytest.raises(ValueError, match="norms span shards"):
        clipping.clip(OptimizerConfig(global_clipnorm=1.0), PLAN, 0, np.ones(PLAN.shard(0).size, np.float32), None)
