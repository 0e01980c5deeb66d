"""Element-wise optimizers in numpy, step for step the arithmetic of ``keras.optimizers`` in float32,
so that reducers holding one shard each produce what one Keras optimizer would. Their state (slots
and step count) is a dict of arrays that the reducer keeps in S3 between iterations.
"""

from __future__ import annotations

import numpy as np

from slsml.config import OptimizerConfig

State = dict[str, np.ndarray]
_F = np.float32


def initial_state(config: OptimizerConfig, size: int) -> State:
    state: State = {"step": np.zeros((), dtype=np.int64)}
    if config.name == "sgd" and config.momentum:
        state["momentum"] = np.zeros(size, dtype=_F)
    if config.name == "adam":
        state["m"] = np.zeros(size, dtype=_F)
        state["v"] = np.zeros(size, dtype=_F)
        if config.amsgrad:
            state["v_hat"] = np.zeros(size, dtype=_F)
    return state


def apply(config: OptimizerConfig, weights: np.ndarray, gradient: np.ndarray, state: State) -> tuple[np.ndarray, State]:
    """One optimizer step; returns new weights and new state (inputs are not modified)."""
    if weights.shape != gradient.shape:
        raise ValueError(f"weights {weights.shape} and gradient {gradient.shape} differ in shape")
    w, g = weights.astype(_F, copy=True), gradient.astype(_F, copy=False)
    state = {name: value.copy() for name, value in state.items()}
    lr = _F(config.learning_rate)
    if config.name == "sgd":
        _sgd(config, w, g, lr, state)
    else:
        _adam(config, w, g, lr, state)
    state["step"] = state["step"] + 1
    return w, state


def _sgd(config: OptimizerConfig, w: np.ndarray, g: np.ndarray, lr: np.float32, state: State) -> None:
    if not config.momentum:
        w -= g * lr
        return
    momentum = _F(config.momentum)
    m = state["momentum"]
    m[...] = m * momentum - g * lr
    if config.nesterov:
        w += m * momentum - g * lr
    else:
        w += m


def _adam(config: OptimizerConfig, w: np.ndarray, g: np.ndarray, lr: np.float32, state: State) -> None:
    local_step = _F(state["step"] + 1)
    beta_1_power = np.power(_F(config.beta_1), local_step)
    beta_2_power = np.power(_F(config.beta_2), local_step)
    alpha = lr * np.sqrt(_F(1) - beta_2_power) / (_F(1) - beta_1_power)
    m, v = state["m"], state["v"]
    m += (g - m) * _F(1 - config.beta_1)
    v += (np.square(g) - v) * _F(1 - config.beta_2)
    if config.amsgrad:
        np.maximum(state["v_hat"], v, out=state["v_hat"])
        v = state["v_hat"]
    w -= (m * alpha) / (np.sqrt(v) + _F(config.epsilon))
