"""Element-wise optimizers in numpy, step for step the arithmetic of ``keras.optimizers`` in float32,
so that reducers holding one shard each produce what one Keras optimizer would. Their state (slots
and step count) is a dict of arrays that the reducer keeps in S3 between iterations.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from slsml.spec.config import OptimizerConfig

State = dict[str, np.ndarray]
_F = np.float32
# the slot of second moments of each adaptive optimizer: frozen once a sparse compression starts (``freeze``)
SECOND_MOMENTS = {"adam": "v", "adamw": "v", "nadam": "v", "rmsprop": "velocity"}
# a frozen second moment is at least this share of its shard's mean: an entry the warm-up barely saw move would
# otherwise turn the first large update it gets into a step of any size
FROZEN_FLOOR = 0.1


def initial_state(config: OptimizerConfig, size: int) -> State:
    """Every slot of ``config``'s optimizer for a shard of ``size`` trainable weights, as Keras builds it."""
    state: State = {"step": np.zeros((), dtype=np.int64)}
    slots: tuple[str, ...] = ()
    if config.name == "sgd" and config.momentum:
        slots = ("momentum",)
    elif config.name in ("adam", "adamw"):
        slots = ("m", "v", "v_hat") if config.amsgrad else ("m", "v")
    elif config.name == "rmsprop":
        slots = ("velocity",) + ("momentum",) * (config.momentum > 0) + ("average_gradient",) * config.centered
    elif config.name == "adamax":
        slots = ("m", "u")
    elif config.name == "nadam":
        slots = ("m", "v")
        state["u_product"] = np.ones((), dtype=_F)
    elif config.name == "lion":
        slots = ("momentum",)
    elif config.name == "adadelta":
        slots = ("accumulated_grad", "accumulated_delta_var")
    elif config.name == "ftrl":
        slots = ("linear",)
    for slot in slots:
        state[slot] = np.zeros(size, dtype=_F)
    if config.name in ("adagrad", "ftrl"):
        state["accumulator"] = np.full(size, config.initial_accumulator_value, dtype=_F)
    if config.use_ema:
        state["average"] = np.zeros(size, dtype=_F)
    return state


def learning_rate(config: OptimizerConfig, step: int) -> np.float32:
    """The learning rate of the step that follows ``step`` completed steps (Keras: at ``iterations``)."""
    if isinstance(config.learning_rate, float):
        return _F(config.learning_rate)
    return _F(config.learning_rate.rate(step))


def adaptive(config: OptimizerConfig) -> bool:
    """Whether the optimizer scales each entry's step by its second moments (``SECOND_MOMENTS``)."""
    return config.name in SECOND_MOMENTS


def apply(
    config: OptimizerConfig,
    weights: np.ndarray,
    gradient: np.ndarray,
    state: State,
    decays: np.ndarray | None = None,
    frozen: bool = False,
) -> tuple[np.ndarray, State]:
    """One optimizer step on a clipped gradient; returns new weights and new state (inputs are not modified).
    ``decays``: which weights take the weight decay (default all). ``frozen``: the second moments of an adaptive
    optimizer stay as they were at the first frozen step (``freeze``), as 1-bit Adam keeps them once its updates are
    compressed: an entry that a sparse update sends now and then, with what it gathered meanwhile, then moves as far
    as the steps it stands for would have moved it, where moments that kept adapting would take the gathered update
    for one large gradient and shrink its step."""
    if weights.shape != gradient.shape:
        raise ValueError(f"weights {weights.shape} and gradient {gradient.shape} differ in shape")
    w, g = weights.astype(_F, copy=True), gradient.astype(_F, copy=False)
    state = {name: value.copy() for name, value in state.items()}
    if frozen and adaptive(config) and "frozen_step" not in state:
        _freeze(config, state)
    lr = learning_rate(config, int(state["step"]))
    if config.weight_decay:
        if decays is None:
            w -= w * _F(config.weight_decay) * lr
        else:
            w[decays] -= w[decays] * _F(config.weight_decay) * lr
    _STEPS[config.name](config, w, g, lr, state)
    if config.use_ema:
        _moving_average(config, w, state)
    state["step"] = state["step"] + 1
    return w, state


def _freeze(config: OptimizerConfig, state: State) -> None:
    """Keep the second moments from now on: each at least ``FROZEN_FLOOR`` of their mean, and the step they were
    taken at (which bias-corrects them)."""
    moments = state[SECOND_MOMENTS[config.name]]
    if moments.size:
        np.maximum(moments, _F(FROZEN_FLOOR) * moments.mean(dtype=np.float64), out=moments)
    state["frozen_step"] = np.array(state["step"], dtype=np.int64)


def finalize(config: OptimizerConfig, weights: np.ndarray, state: State) -> np.ndarray:
    """The weights training ends with: with ``use_ema`` their moving average (Keras' ``fit`` ends so)."""
    return state["average"].copy() if config.use_ema else weights


def _moving_average(config: OptimizerConfig, w: np.ndarray, state: State) -> None:
    """Keras: the average starts at the first step's weights; every ``ema_overwrite_frequency`` steps the
    weights take its value."""
    step = int(state["step"])
    momentum = _F(step != 0) * _F(config.ema_momentum)
    average = state["average"]
    average[...] = momentum * average + (_F(1) - momentum) * w
    if config.ema_overwrite_frequency and (step + 1) % config.ema_overwrite_frequency == 0:
        w[...] = average


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
    beta_2_power = np.power(_F(config.beta_2), _moments_step(state))
    alpha = lr * np.sqrt(_F(1) - beta_2_power) / (_F(1) - beta_1_power)
    m, v = state["m"], state["v"]
    m += (g - m) * _F(1 - config.beta_1)
    if "frozen_step" not in state:
        v += (np.square(g) - v) * _F(1 - config.beta_2)
    if config.amsgrad:
        np.maximum(state["v_hat"], v, out=state["v_hat"])
        v = state["v_hat"]
    w -= (m * alpha) / (np.sqrt(v) + _F(config.epsilon))


def _moments_step(state: State) -> np.float32:
    """The step of the second moments, for their bias correction: the next one, or the one they froze at."""
    return _F(state["frozen_step"] if "frozen_step" in state else state["step"] + 1)


def _rmsprop(config: OptimizerConfig, w: np.ndarray, g: np.ndarray, lr: np.float32, state: State) -> None:
    rho, velocity = _F(config.rho), state["velocity"]
    if "frozen_step" not in state:
        velocity[...] = rho * velocity + _F(1 - config.rho) * np.square(g)
    if config.centered:
        average = state["average_gradient"]
        average[...] = rho * average + _F(1 - config.rho) * g
        denominator = velocity - np.square(average) + _F(config.epsilon)
    else:
        denominator = velocity + _F(config.epsilon)
    increment = (lr * g) / np.sqrt(denominator)
    if config.momentum > 0:
        momentum = state["momentum"]
        momentum[...] = _F(config.momentum) * momentum + increment
        w -= momentum
    else:
        w -= increment


def _adagrad(config: OptimizerConfig, w: np.ndarray, g: np.ndarray, lr: np.float32, state: State) -> None:
    accumulator = state["accumulator"]
    accumulator += np.square(g)
    w -= (lr * g) / np.sqrt(accumulator + _F(config.epsilon))


def _adamax(config: OptimizerConfig, w: np.ndarray, g: np.ndarray, lr: np.float32, state: State) -> None:
    beta_1_power = np.power(_F(config.beta_1), _F(state["step"] + 1))
    m, u = state["m"], state["u"]
    m += (g - m) * _F(1 - config.beta_1)
    u[...] = np.maximum(_F(config.beta_2) * u, np.abs(g))
    w -= (lr * m) / ((_F(1) - beta_1_power) * (u + _F(config.epsilon)))


def _nadam(config: OptimizerConfig, w: np.ndarray, g: np.ndarray, lr: np.float32, state: State) -> None:
    local_step, next_step = _F(state["step"] + 1), _F(state["step"] + 2)
    beta_1, beta_2, decay, half = _F(config.beta_1), _F(config.beta_2), _F(0.96), _F(0.5)
    # Keras advances the product once per step, before the update, with its own association
    state["u_product"] = state["u_product"] * beta_1 * (_F(1) - half * np.power(decay, local_step))
    u_t = beta_1 * (_F(1) - half * np.power(decay, local_step))
    u_t_1 = beta_1 * (_F(1) - half * np.power(decay, next_step))
    u_product_t = _F(state["u_product"])
    u_product_t_1 = u_product_t * u_t_1
    beta_2_power = np.power(beta_2, _moments_step(state))
    m, v = state["m"], state["v"]
    m += (g - m) * (_F(1) - beta_1)
    if "frozen_step" not in state:
        v += (np.square(g) - v) * (_F(1) - beta_2)
    m_hat = (u_t_1 * m) / (_F(1) - u_product_t_1) + ((_F(1) - u_t) * g) / (_F(1) - u_product_t)
    v_hat = v / (_F(1) - beta_2_power)
    w -= (m_hat * lr) / (np.sqrt(v_hat) + _F(config.epsilon))


def _lion(config: OptimizerConfig, w: np.ndarray, g: np.ndarray, lr: np.float32, state: State) -> None:
    beta_1, beta_2, m = _F(config.beta_1), _F(config.beta_2), state["momentum"]
    w -= lr * np.sign(m * beta_1 + g * (_F(1) - beta_1))
    m[...] = m * beta_2 + g * (_F(1) - beta_2)


def _adadelta(config: OptimizerConfig, w: np.ndarray, g: np.ndarray, lr: np.float32, state: State) -> None:
    rho, epsilon = _F(config.rho), _F(config.epsilon)
    accumulated_grad, accumulated_delta = state["accumulated_grad"], state["accumulated_delta_var"]
    accumulated_grad[...] = rho * accumulated_grad + _F(1 - config.rho) * np.square(g)
    delta = -(np.sqrt(accumulated_delta + epsilon) * g) / np.sqrt(accumulated_grad + epsilon)
    accumulated_delta[...] = rho * accumulated_delta + _F(1 - config.rho) * np.square(delta)
    w += lr * delta


def _ftrl(config: OptimizerConfig, w: np.ndarray, g: np.ndarray, lr: np.float32, state: State) -> None:
    power, l1 = _F(-config.learning_rate_power), _F(config.l1_regularization_strength)
    l2 = _F(config.l2_regularization_strength) + _F(config.beta) / (_F(2) * lr)
    accumulator, linear = state["accumulator"], state["linear"]
    new_accumulator = accumulator + np.square(g)
    powered = np.power(new_accumulator, power)
    shrunk = g + _F(2 * config.l2_shrinkage_regularization_strength) * w
    linear += shrunk - (powered - np.power(accumulator, power)) / lr * w
    quadratic = powered / lr + _F(2) * l2
    w[...] = (np.clip(linear, -l1, l1) - linear) / quadratic
    accumulator[...] = new_accumulator


_STEPS: dict[str, Callable[[OptimizerConfig, np.ndarray, np.ndarray, np.float32, State], None]] = {
    "sgd": _sgd,
    "adam": _adam,
    "adamw": _adam,
    "rmsprop": _rmsprop,
    "adagrad": _adagrad,
    "adamax": _adamax,
    "nadam": _nadam,
    "lion": _lion,
    "adadelta": _adadelta,
    "ftrl": _ftrl,
}
