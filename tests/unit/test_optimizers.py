"""The numpy optimizers against keras.optimizers, step for step."""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest

from slsml import optimizers
from slsml.config import OptimizerConfig

STEPS = 20
# (shape, weight scale, gradient scale): ordinary, large-magnitude, tiny, scalar.
VARIABLES = [((3, 4), 1.0, 1.0), ((257,), 1e3, 1e2), ((5, 2, 3), 1e-6, 1e-8), ((), 0.5, 0.1)]

CONFIGS = {
    "sgd": OptimizerConfig(name="sgd", learning_rate=0.01),
    "sgd-momentum": OptimizerConfig(name="sgd", learning_rate=0.02, momentum=0.9),
    "sgd-nesterov": OptimizerConfig(name="sgd", learning_rate=0.005, momentum=0.75, nesterov=True),
    "adam": OptimizerConfig(name="adam", learning_rate=0.003),
    "adam-custom": OptimizerConfig(name="adam", learning_rate=0.01, beta_1=0.8, beta_2=0.95, epsilon=1e-6),
    "adam-amsgrad": OptimizerConfig(name="adam", learning_rate=0.004, amsgrad=True),
    "adam-amsgrad-fast": OptimizerConfig(name="adam", learning_rate=0.02, beta_2=0.6, amsgrad=True),
}
TOLERANCE = {"sgd": 1e-6, "adam": 1e-5}


def keras_optimizer(config: OptimizerConfig) -> keras.optimizers.Optimizer:
    if config.name == "sgd":
        return keras.optimizers.SGD(
            learning_rate=config.learning_rate, momentum=config.momentum, nesterov=config.nesterov
        )
    return keras.optimizers.Adam(
        learning_rate=config.learning_rate,
        beta_1=config.beta_1,
        beta_2=config.beta_2,
        epsilon=config.epsilon,
        amsgrad=config.amsgrad,
    )


def random_problem(seed: int) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Initial weights per variable and STEPS gradients per variable (float32)."""
    rng = np.random.default_rng(seed)
    weights = [(rng.standard_normal(shape) * scale).astype(np.float32) for shape, scale, _ in VARIABLES]
    # gradients shrink after the first half, so that Adam's second moment falls (and AMSGrad's max matters)
    decay = [1.0 if step < STEPS // 2 else 0.01 for step in range(STEPS)]
    gradients = [
        [(rng.standard_normal(shape) * scale * d).astype(np.float32) for shape, _, scale in VARIABLES] for d in decay
    ]
    return weights, gradients


def run_keras(
    config: OptimizerConfig, weights: list[np.ndarray], gradients: list[list[np.ndarray]]
) -> list[np.ndarray]:
    variables = [keras.Variable(w, dtype="float32") for w in weights]
    optimizer = keras_optimizer(config)
    for step in gradients:
        optimizer.apply_gradients(zip([keras.ops.convert_to_tensor(g) for g in step], variables, strict=True))
    return [np.asarray(v.numpy()) for v in variables]


def run_numpy(
    config: OptimizerConfig, weights: np.ndarray, gradients: list[np.ndarray]
) -> tuple[np.ndarray, optimizers.State]:
    state = optimizers.initial_state(config, weights.size)
    for gradient in gradients:
        weights, state = optimizers.apply(config, weights, gradient, state)
    return weights, state


def flat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.ravel() for a in arrays])


@pytest.mark.parametrize("case", list(CONFIGS))
def test_matches_keras_step_for_step(case: str) -> None:
    config = CONFIGS[case]
    weights, gradients = random_problem(seed=len(case))
    expected = run_keras(config, weights, gradients)
    got, state = run_numpy(config, flat(weights), [flat(g) for g in gradients])

    assert got.dtype == np.float32 and got.shape == (sum(w.size for w in weights),)
    assert int(state["step"]) == STEPS
    tolerance = TOLERANCE[config.name]
    offset = 0
    for (shape, _, _), start, final in zip(VARIABLES, weights, expected, strict=True):
        part = got[offset : offset + final.size].reshape(shape)
        offset += final.size
        assert not np.array_equal(final, start), "the optimizer did not move the weights: the test is vacuous"
        scale = float(np.max(np.abs(final)))
        difference = float(np.max(np.abs(part.astype(np.float64) - final.astype(np.float64))))
        assert difference <= tolerance * scale, (
            f"{case}, variable of shape {shape}: max|Δ| = {difference:.3e} "
            f"> {tolerance:g}·max|w| = {tolerance * scale:.3e}"
        )


@pytest.mark.parametrize("case", list(CONFIGS))
def test_shards_step_independently(case: str) -> None:
    """Element-wise: three reducers, each with its own shard and state, compute what one vector would."""
    config = CONFIGS[case]
    weights, gradients = random_problem(seed=100 + len(case))
    whole, whole_state = run_numpy(config, flat(weights), [flat(g) for g in gradients])

    bounds = [0, 17, 131, whole.size]
    parts, part_states = [], []
    for start, stop in itertools.pairwise(bounds):
        part, state = run_numpy(config, flat(weights)[start:stop], [flat(g)[start:stop] for g in gradients])
        parts.append(part)
        part_states.append(state)

    np.testing.assert_array_equal(np.concatenate(parts), whole)
    for name, value in whole_state.items():
        if name == "step":
            assert all(int(s["step"]) == int(value) == STEPS for s in part_states)
        else:
            np.testing.assert_array_equal(np.concatenate([s[name] for s in part_states]), value, err_msg=name)


@pytest.mark.parametrize("case", list(CONFIGS))
def test_apply_does_not_mutate_its_inputs(case: str) -> None:
    config = CONFIGS[case]
    rng = np.random.default_rng(7)
    weights = rng.standard_normal(50).astype(np.float32)
    gradient = rng.standard_normal(50).astype(np.float32)
    # a state that is not all zeros, as after a few steps
    _, state = run_numpy(config, weights, [rng.standard_normal(50).astype(np.float32) for _ in range(3)])
    before = (weights.copy(), gradient.copy(), {k: np.array(v, copy=True) for k, v in state.items()})

    new_weights, new_state = optimizers.apply(config, weights, gradient, state)

    np.testing.assert_array_equal(weights, before[0])
    np.testing.assert_array_equal(gradient, before[1])
    assert state.keys() == before[2].keys()
    for name, value in before[2].items():
        np.testing.assert_array_equal(state[name], value, err_msg=name)
    assert not np.shares_memory(new_weights, weights)
    assert not np.array_equal(new_weights, weights)
    assert int(new_state["step"]) == int(state["step"]) + 1
    for name in state:
        if name != "step":
            assert not np.shares_memory(new_state[name], state[name]), name


def test_initial_state_slots() -> None:
    assert set(optimizers.initial_state(CONFIGS["sgd"], 4)) == {"step"}
    assert set(optimizers.initial_state(CONFIGS["sgd-momentum"], 4)) == {"step", "momentum"}
    assert set(optimizers.initial_state(CONFIGS["adam"], 4)) == {"step", "m", "v"}
    state = optimizers.initial_state(CONFIGS["adam-amsgrad"], 4)
    assert set(state) == {"step", "m", "v", "v_hat"}
    assert all(state[k].shape == (4,) and state[k].dtype == np.float32 for k in ("m", "v", "v_hat"))


def test_shape_mismatch_is_refused() -> None:
    config = CONFIGS["adam"]
    with pytest.raises(ValueError, match="shape"):
        optimizers.apply(config, np.zeros(3, np.float32), np.zeros(4, np.float32), optimizers.initial_state(config, 3))
