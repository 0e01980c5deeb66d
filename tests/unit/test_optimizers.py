"""The numpy optimizers against keras.optimizers, step for step."""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest

from slsml.spec.config import KERAS_OPTIMIZERS, LOSS_SCALE_OPTIMIZER_FIELDS, OPTIMIZER_NAMES, OptimizerConfig
from slsml.spec.errors import BadInputError
from slsml.spec.shardplan import ShardPlan
from slsml.training import modelio, optimizers

STEPS = 20
# (shape, weight scale, gradient scale): ordinary, large-magnitude, tiny, scalar.
VARIABLES = [((3, 4), 1.0, 1.0), ((257,), 1e3, 1e2), ((5, 2, 3), 1e-6, 1e-8), ((), 0.5, 0.1)]

S = keras.optimizers.schedules
# Keras optimizers; the numpy config of each is read from its get_config(), as from a compiled model.
KERAS = {
    "sgd": lambda: keras.optimizers.SGD(learning_rate=0.01),
    "sgd-momentum": lambda: keras.optimizers.SGD(learning_rate=0.02, momentum=0.9),
    "sgd-nesterov": lambda: keras.optimizers.SGD(learning_rate=0.005, momentum=0.75, nesterov=True),
    "sgd-decay-exponential": lambda: keras.optimizers.SGD(
        learning_rate=S.ExponentialDecay(0.05, decay_steps=4, decay_rate=0.6), momentum=0.5, weight_decay=0.1
    ),
    "adam": lambda: keras.optimizers.Adam(learning_rate=0.003),
    "adam-custom": lambda: keras.optimizers.Adam(learning_rate=0.01, beta_1=0.8, beta_2=0.95, epsilon=1e-6),
    "adam-amsgrad": lambda: keras.optimizers.Adam(learning_rate=0.004, amsgrad=True),
    "adam-amsgrad-fast": lambda: keras.optimizers.Adam(learning_rate=0.02, beta_2=0.6, amsgrad=True),
    "adam-piecewise": lambda: keras.optimizers.Adam(
        learning_rate=S.PiecewiseConstantDecay([4, 11], [0.02, 0.01, 1e-3])
    ),
    "adamw": lambda: keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.05),
    "adamw-cosine-warmup": lambda: keras.optimizers.AdamW(
        learning_rate=S.CosineDecay(0.001, decay_steps=12, alpha=0.1, warmup_target=0.02, warmup_steps=5),
        amsgrad=True,
    ),
    "rmsprop": lambda: keras.optimizers.RMSprop(learning_rate=0.003),
    "rmsprop-momentum-centered": lambda: keras.optimizers.RMSprop(
        learning_rate=S.InverseTimeDecay(0.004, decay_steps=3, decay_rate=0.5, staircase=True),
        rho=0.8,
        momentum=0.6,
        centered=True,
    ),
    "adagrad": lambda: keras.optimizers.Adagrad(learning_rate=0.05),
    "adagrad-polynomial": lambda: keras.optimizers.Adagrad(
        learning_rate=S.PolynomialDecay(0.1, decay_steps=6, end_learning_rate=0.01, power=0.5, cycle=True),
        initial_accumulator_value=0.3,
        epsilon=1e-5,
        weight_decay=0.02,
    ),
    "adamax": lambda: keras.optimizers.Adamax(learning_rate=0.01, beta_1=0.85),
    "nadam": lambda: keras.optimizers.Nadam(learning_rate=0.004),
    "nadam-restarts": lambda: keras.optimizers.Nadam(
        learning_rate=S.CosineDecayRestarts(0.01, first_decay_steps=3, t_mul=2.0, m_mul=0.8, alpha=0.05),
        beta_2=0.9,
    ),
    "lion": lambda: keras.optimizers.Lion(learning_rate=1e-3),
    "lion-cosine": lambda: keras.optimizers.Lion(
        learning_rate=S.CosineDecay(3e-3, decay_steps=15, alpha=0.2), beta_1=0.8, weight_decay=0.3
    ),
    "adadelta": lambda: keras.optimizers.Adadelta(learning_rate=1.0),
    "adadelta-polynomial": lambda: keras.optimizers.Adadelta(
        learning_rate=S.PolynomialDecay(0.5, decay_steps=8, end_learning_rate=0.05),
        rho=0.8,
        epsilon=1e-6,
        weight_decay=0.05,
    ),
    "ftrl": lambda: keras.optimizers.Ftrl(learning_rate=0.05),
    "adam-ema": lambda: keras.optimizers.Adam(learning_rate=0.01, use_ema=True, ema_momentum=0.9),
    "sgd-ema-overwrite": lambda: keras.optimizers.SGD(
        learning_rate=0.05, momentum=0.9, use_ema=True, ema_momentum=0.7, ema_overwrite_frequency=6
    ),
    "ftrl-regularized-exponential": lambda: keras.optimizers.Ftrl(
        learning_rate=S.ExponentialDecay(0.1, decay_steps=5, decay_rate=0.7),
        learning_rate_power=-0.3,
        initial_accumulator_value=0.2,
        l1_regularization_strength=1e-3,
        l2_regularization_strength=0.01,
        l2_shrinkage_regularization_strength=0.02,
        beta=0.5,
        weight_decay=0.05,
    ),
}
CONFIGS = {case: OptimizerConfig.from_keras(type(make()).__name__, make().get_config()) for case, make in KERAS.items()}
TOLERANCE = {"sgd": 1e-6}


def keras_optimizer(case: str) -> keras.optimizers.Optimizer:
    return KERAS[case]()


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


def run_keras(case: str, weights: list[np.ndarray], gradients: list[list[np.ndarray]]) -> list[np.ndarray]:
    variables = [keras.Variable(w, dtype="float32") for w in weights]
    optimizer = keras_optimizer(case)
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
    expected = run_keras(case, weights, gradients)
    got, state = run_numpy(config, flat(weights), [flat(g) for g in gradients])

    assert got.dtype == np.float32 and got.shape == (sum(w.size for w in weights),)
    assert int(state["step"]) == STEPS
    tolerance = TOLERANCE.get(config.name, 1e-5)
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
    assert int(whole_state["step"]) == STEPS
    for name, value in whole_state.items():
        if value.ndim == 0:  # the step, Nadam's momentum-schedule product: one per optimizer
            assert all(s[name] == value for s in part_states), name
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
        if state[name].ndim:
            assert not np.shares_memory(new_state[name], state[name]), name


def test_initial_state_slots() -> None:
    assert set(optimizers.initial_state(CONFIGS["sgd"], 4)) == {"step"}
    assert set(optimizers.initial_state(CONFIGS["sgd-momentum"], 4)) == {"step", "momentum"}
    assert set(optimizers.initial_state(CONFIGS["adam"], 4)) == {"step", "m", "v"}
    state = optimizers.initial_state(CONFIGS["adam-amsgrad"], 4)
    assert set(state) == {"step", "m", "v", "v_hat"}
    assert all(state[k].shape == (4,) and state[k].dtype == np.float32 for k in ("m", "v", "v_hat"))


@pytest.mark.parametrize("case", list(CONFIGS))
def test_initial_state_has_every_keras_slot(case: str) -> None:
    """As many per-weight slots as Keras builds for a variable, with the same initial values."""
    optimizer = keras_optimizer(case)
    optimizer.build([keras.Variable(np.zeros(5, np.float32))])
    expected = sorted(float(np.asarray(v.numpy())[0]) for v in optimizer.variables if tuple(v.shape) == (5,))
    state = optimizers.initial_state(CONFIGS[case], 5)
    got = sorted(float(v[0]) for v in state.values() if v.shape == (5,))
    assert got == expected


def test_shape_mismatch_is_refused() -> None:
    config = CONFIGS["adam"]
    with pytest.raises(ValueError, match="shape"):
        optimizers.apply(config, np.zeros(3, np.float32), np.zeros(4, np.float32), optimizers.initial_state(config, 3))


SCHEDULES = {
    "exponential": S.ExponentialDecay(0.1, decay_steps=7, decay_rate=0.5),
    "exponential-staircase": S.ExponentialDecay(0.1, decay_steps=3, decay_rate=0.9, staircase=True),
    "inverse-time": S.InverseTimeDecay(0.1, decay_steps=5, decay_rate=0.7),
    "inverse-time-staircase": S.InverseTimeDecay(0.1, decay_steps=4, decay_rate=1.3, staircase=True),
    "piecewise": S.PiecewiseConstantDecay([3, 8, 20], [0.1, 0.05, 0.01, 0.002]),
    "polynomial": S.PolynomialDecay(0.1, decay_steps=10, end_learning_rate=0.01, power=2.0),
    "polynomial-cycle": S.PolynomialDecay(0.1, decay_steps=7, power=0.5, cycle=True),
    "cosine": S.CosineDecay(0.1, decay_steps=12, alpha=0.1),
    "cosine-warmup": S.CosineDecay(0.01, decay_steps=9, warmup_target=0.3, warmup_steps=6),
    "restarts": S.CosineDecayRestarts(0.1, first_decay_steps=4, t_mul=2.0, m_mul=0.8, alpha=0.05),
    "restarts-constant-period": S.CosineDecayRestarts(0.1, first_decay_steps=5, t_mul=1.0, m_mul=0.5),
}


@pytest.mark.parametrize("case", list(SCHEDULES))
def test_schedule_matches_keras(case: str) -> None:
    schedule = SCHEDULES[case]
    config = OptimizerConfig.from_keras("SGD", {"learning_rate": S.serialize(schedule)})
    steps = range(60)
    expected = np.array([float(schedule(keras.ops.convert_to_tensor(s, dtype="int64"))) for s in steps])
    got = np.array([optimizers.learning_rate(config, s) for s in steps])
    assert len(set(expected.tolist())) > 3, "the schedule does not vary: the test is vacuous"
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9)


class Halving(S.LearningRateSchedule):
    def __call__(self, step: object) -> object:
        return 0.1 * 0.5 ** keras.ops.cast(step, "float32")

    def get_config(self) -> dict[str, object]:
        return {}


class ExponentialDecay(S.ExponentialDecay):
    """A custom schedule with a built-in's name."""


@pytest.mark.parametrize(
    ("learning_rate", "message"),
    [
        (Halving(), "schedule Halving is not supported"),
        (ExponentialDecay(0.1, 10, 0.5), "schedule ExponentialDecay is not supported"),
        (
            {"class_name": "CosineDecay", "config": {"initial_learning_rate": 0.1}},
            "CosineDecay: decay_steps: Field required",
        ),
        (
            {"class_name": "CosineDecay", "config": {"initial_learning_rate": 0.1, "decay_steps": 10, "beta": 1}},
            "CosineDecay: beta: Extra inputs",
        ),
        (
            {"class_name": "PiecewiseConstantDecay", "config": {"boundaries": [5, 2], "values": [1.0, 0.5, 0.1]}},
            "PiecewiseConstantDecay: .*must increase",
        ),
        ({"class_name": "ExponentialDecay", "config": None}, "ExponentialDecay has no config"),
        (
            {"class_name": "PolynomialDecay", "config": {"initial_learning_rate": 0.1, "decay_steps": 0}},
            "PolynomialDecay: decay_steps: Input should be greater than 0",
        ),
    ],
    ids=["custom", "custom-named-as-builtin", "missing-field", "unknown-field", "boundaries", "no-config", "zero"],
)
def test_bad_schedule_is_refused_by_name(learning_rate: object, message: str) -> None:
    if isinstance(learning_rate, S.LearningRateSchedule):
        learning_rate = keras.optimizers.Adam(learning_rate=learning_rate).get_config()["learning_rate"]
    with pytest.raises(BadInputError, match=message):
        OptimizerConfig.from_keras("Adam", {"learning_rate": learning_rate})


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        (
            keras.optimizers.Nadam(gradient_accumulation_steps=4),
            "gradient_accumulation_steps=4 is not supported: the global batch already adds up",
        ),
        (keras.optimizers.ScheduleFreeAdamW(), "optimizer ScheduleFreeAdamW is not supported; use one of SGD, Adam"),
        (keras.optimizers.RMSprop(rho=1.5), "optimizer RMSprop: rho: Input should be less than 1"),
        (keras.optimizers.Ftrl(beta=-1.0), "optimizer Ftrl: beta: Input should be greater than or equal to 0"),
    ],
    ids=["accumulation", "unknown", "bad-value", "bad-ftrl-value"],
)
def test_unsupported_optimizer_option_is_refused_by_name(optimizer: keras.optimizers.Optimizer, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        OptimizerConfig.from_keras(type(optimizer).__name__, optimizer.get_config())


@pytest.mark.parametrize(
    ("optimizer", "reason"),
    [
        (keras.optimizers.Adafactor(), "factors its second moment over the rows and columns of each variable"),
        (keras.optimizers.Lamb(), "trust ratio scales each variable's update by the norms of the whole variable"),
        (keras.optimizers.Muon(), "orthogonalizes the momentum of each matrix as a whole"),
        (
            keras.optimizers.MultiOptimizer(keras.optimizers.OptimizerMap(keras.optimizers.Adam())),
            "applies different optimizers to different variables",
        ),
    ],
    ids=["Adafactor", "Lamb", "Muon", "MultiOptimizer"],
)
def test_optimizer_that_is_not_element_wise_is_refused_with_the_reason(
    optimizer: keras.optimizers.Optimizer, reason: str
) -> None:
    with pytest.raises(BadInputError, match=f"optimizer {type(optimizer).__name__} is not supported: .*{reason}"):
        OptimizerConfig.from_keras(type(optimizer).__name__, optimizer.get_config())


def test_gradient_accumulation_of_one_step_is_accepted() -> None:
    """Keras 3.15 refuses 1 itself, but a config written elsewhere may hold it: it accumulates nothing."""
    config = {**keras.optimizers.Adam().get_config(), "gradient_accumulation_steps": 1}
    assert OptimizerConfig.from_keras("Adam", config).name == "adam"


@pytest.mark.parametrize(
    ("optimizer", "clipping"),
    [
        (keras.optimizers.Adam(clipnorm=1.0), {"clipnorm": 1.0, "global_clipnorm": None, "clipvalue": None}),
        (keras.optimizers.SGD(global_clipnorm=2.0), {"clipnorm": None, "global_clipnorm": 2.0, "clipvalue": None}),
        (keras.optimizers.RMSprop(clipvalue=0.5), {"clipnorm": None, "global_clipnorm": None, "clipvalue": 0.5}),
    ],
    ids=["clipnorm", "global_clipnorm", "clipvalue"],
)
def test_clipping_options_map_onto_the_config(optimizer: keras.optimizers.Optimizer, clipping: dict) -> None:
    config = OptimizerConfig.from_keras(type(optimizer).__name__, optimizer.get_config())
    assert {option: getattr(config, option) for option in clipping} == clipping


def test_exclude_from_weight_decay_matches_keras() -> None:
    """AdamW that decays a Dense layer's kernel and not its bias, by name as Keras matches it."""
    layer = keras.layers.Dense(3, name="dense")
    layer.build((4,))
    rng = np.random.default_rng(3)
    for variable in layer.trainable_variables:
        variable.assign(rng.standard_normal(variable.shape).astype(np.float32))
    weights = [np.asarray(v.numpy()) for v in layer.trainable_variables]
    gradients = [[rng.standard_normal(w.shape).astype(np.float32) for w in weights] for _ in range(10)]
    optimizer = keras.optimizers.AdamW(learning_rate=0.05, weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    for step in gradients:
        optimizer.apply_gradients(zip(step, layer.trainable_variables, strict=True))
    expected = flat([np.asarray(v.numpy()) for v in layer.trainable_variables])

    config = OptimizerConfig.from_keras("AdamW", {**optimizer.get_config(), "exclude_from_weight_decay": ["bias"]})
    names = [v.path for v in layer.trainable_variables]
    assert names == ["dense/kernel", "dense/bias"] and [config.decays(n) for n in names] == [True, False]
    mask = np.concatenate([np.full(w.size, config.decays(n)) for n, w in zip(names, weights, strict=True)])
    got, state = flat(weights), optimizers.initial_state(config, mask.size)
    for step in gradients:
        got, state = optimizers.apply(config, got, flat(step), state, decays=mask)
    decayed_everywhere, state = flat(weights), optimizers.initial_state(config, mask.size)
    for step in gradients:
        decayed_everywhere, state = optimizers.apply(config, decayed_everywhere, flat(step), state)

    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert not np.allclose(got[~mask], decayed_everywhere[~mask], rtol=1e-3), "the exclusion had no effect"
    np.testing.assert_array_equal(got[mask], decayed_everywhere[mask])


def test_every_optimizer_name_has_a_keras_class_and_a_step() -> None:
    assert set(OPTIMIZER_NAMES) == set(KERAS_OPTIMIZERS) == set(optimizers._STEPS)
    assert {name.lower() for name in KERAS_OPTIMIZERS.values()} == set(OPTIMIZER_NAMES)
    assert all(hasattr(keras.optimizers, name) for name in KERAS_OPTIMIZERS.values())


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_each_field_applies_to_the_optimizers_whose_keras_config_has_it(name: str) -> None:
    """The declaration in OptimizerConfig against Keras: a field applies to an optimizer iff its get_config() has
    it (exclude_from_weight_decay, which Keras does not serialize, and LossScaleOptimizer's, which wraps any, apply to
    every one)."""
    keras_config = getattr(keras.optimizers, KERAS_OPTIMIZERS[name])().get_config()
    fields = [f for f in OptimizerConfig.model_fields if f not in {"name", "learning_rate"}]
    applies = {f for f in fields if OptimizerConfig.applies(f, name)}
    every = {"exclude_from_weight_decay", *LOSS_SCALE_OPTIMIZER_FIELDS}
    assert applies == {f for f in fields if f in keras_config} | every
    for field in applies:
        assert name in OptimizerConfig.optimizers_of(field)
    # what Keras's defaults are for this optimizer never trips the check
    assert OptimizerConfig.from_keras(KERAS_OPTIMIZERS[name], keras_config).foreign() == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"name": "adam", "momentum": 0.9},
            r"Value error, momentum does not apply to Adam \(only to SGD, RMSprop\) \[type",
        ),
        ({"name": "adam", "nesterov": True}, r"Value error, nesterov does not apply to Adam \(only to SGD\) \[type"),
        (
            {"name": "sgd", "amsgrad": True, "rho": 0.95},
            r"Value error, amsgrad does not apply to SGD \(only to Adam, AdamW\); rho does not apply to SGD"
            r" \(only to RMSprop, Adadelta\) \[type",
        ),
        (
            {"name": "ftrl", "beta_2": 0.99},
            r"Value error, beta_2 does not apply to Ftrl \(only to Adam, AdamW, Adamax, Nadam, Lion\) \[type",
        ),
    ],
)
def test_a_value_for_a_field_of_another_optimizer_is_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OptimizerConfig.model_validate(fields)
    assert OptimizerConfig(name="sgd", momentum=0.0, beta_1=0.9).foreign() == []  # defaults are no values
    assert OptimizerConfig(name="lion", rho=0.9).name == "lion"  # the field's default, not Adadelta's


def test_keras_defaults_fill_fields_not_given() -> None:
    assert OptimizerConfig(name="adamw").weight_decay == keras.optimizers.AdamW().weight_decay
    assert OptimizerConfig(name="lion").beta_2 == keras.optimizers.Lion().beta_2
    assert OptimizerConfig(name="adadelta").rho == keras.optimizers.Adadelta().rho
    assert OptimizerConfig(name="rmsprop").rho == keras.optimizers.RMSprop().rho
    ftrl, keras_ftrl = OptimizerConfig(name="ftrl"), keras.optimizers.Ftrl()
    for option in (
        "initial_accumulator_value",
        "learning_rate_power",
        "l1_regularization_strength",
        "l2_regularization_strength",
        "l2_shrinkage_regularization_strength",
        "beta",
    ):
        assert getattr(ftrl, option) == getattr(keras_ftrl, option), option
    adagrad = keras.optimizers.Adagrad()
    assert OptimizerConfig(name="adagrad").initial_accumulator_value == adagrad.initial_accumulator_value
    assert OptimizerConfig(name="lion", beta_2=0.5).beta_2 == 0.5
    assert OptimizerConfig(name="adam").weight_decay is None


@pytest.mark.parametrize("case", list(CONFIGS))
def test_config_survives_run_json(case: str) -> None:
    config = CONFIGS[case]
    assert OptimizerConfig.model_validate_json(config.model_dump_json()) == config


@pytest.mark.parametrize("case", ["adam-ema", "sgd-ema-overwrite"])
def test_ema_final_weights_match_keras_fit(case: str) -> None:
    """Training ends with the moving average in the weights, as Keras' fit leaves it."""
    config = CONFIGS[case]
    weights, gradients = random_problem(seed=3)
    variables = [keras.Variable(w, dtype="float32") for w in weights]
    optimizer = keras_optimizer(case)
    for step in gradients:
        optimizer.apply_gradients(zip([keras.ops.convert_to_tensor(g) for g in step], variables, strict=True))
    raw = flat([np.asarray(v.numpy()) for v in variables])
    optimizer.finalize_variable_values(variables)
    expected = flat([np.asarray(v.numpy()) for v in variables])
    got, state = run_numpy(config, flat(weights), [flat(g) for g in gradients])
    final = optimizers.finalize(config, got, state)
    assert not np.allclose(expected, raw, rtol=1e-3, atol=0), "the average equals the weights: vacuous"
    np.testing.assert_allclose(final, expected, rtol=1e-5, atol=1e-12)
    assert optimizers.finalize(CONFIGS["adam"], got, state) is got


@pytest.mark.parametrize("case", list(CONFIGS))
def test_keras_optimizer_is_the_config_turned_back(case: str) -> None:
    """The Keras optimizer a run's final model is compiled with reads back as the run's optimizer."""
    config = CONFIGS[case]
    optimizer = modelio.keras_optimizer(config)
    assert type(optimizer).__name__ == KERAS_OPTIMIZERS[config.name]
    assert OptimizerConfig.from_keras(type(optimizer).__name__, optimizer.get_config()) == config


def _small_model() -> keras.Model:
    """Trainable variables with a non-trainable one between them (BatchNormalization's statistics)."""
    keras.utils.set_random_seed(5)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(7), keras.layers.BatchNormalization(), keras.layers.Dense(3)]
    )


@pytest.mark.parametrize("case", list(CONFIGS))
def test_reducers_state_set_into_keras_equals_keras_own_state(case: str) -> None:
    """Each shard's numpy state (three shards that cut across variables), set into a Keras optimizer, is the state
    Keras's own optimizer holds after the same steps: every slot, the step count and Nadam's product."""
    config = CONFIGS[case]
    model, reference = _small_model(), _small_model()
    plan = ShardPlan.build(modelio.variable_specs(model), 3)
    assert any(not p.whole and p.variable.trainable for r in range(3) for p in plan.pieces(r))
    rng = np.random.default_rng(len(case))
    gradients = [
        [rng.standard_normal(v.shape).astype(np.float32) for v in model.trainable_variables] for _ in range(STEPS)
    ]
    optimizer = keras_optimizer(case)
    for step in gradients:
        optimizer.apply_gradients(
            zip([keras.ops.convert_to_tensor(g) for g in step], reference.trainable_variables, strict=True)
        )
    trainable = plan.trainable_mask()
    whole = modelio.get_flat(model, plan)[trainable]
    full = [np.zeros(plan.size, np.float32) for _ in gradients]
    per_step = []
    for vector, step in zip(full, gradients, strict=True):
        arrays = iter(step)
        vector[:] = plan.flatten(
            [next(arrays) if s.trainable else np.zeros(s.shape, np.float32) for s in plan.variables]
        )
        per_step.append(vector[trainable])
    states, offset = [], 0
    for shard in range(3):
        count = int(plan.shard(shard).trainable.sum())
        _, state = run_numpy(config, whole[offset : offset + count], [g[offset : offset + count] for g in per_step])
        states.append(state)
        offset += count

    carried = modelio.keras_optimizer(config)
    modelio.set_optimizer_state(carried, model, config, plan, iter(states))

    assert int(carried.iterations) == STEPS
    assert len(carried.variables) == len(optimizer.variables)
    moved = 0
    for got, expected in zip(carried.variables, optimizer.variables, strict=True):
        got, expected = np.asarray(got.numpy(), np.float64), np.asarray(expected.numpy(), np.float64)
        scale = max(float(np.abs(expected).max()), 1e-12)
        assert np.abs(got - expected).max() <= 1e-5 * scale, f"{case}: {expected.shape} differs"
        moved += int(expected.ndim > 0 and not np.allclose(expected, expected.flat[0]))
    assert moved or (config.name == "sgd" and not config.momentum and not config.use_ema), "no slot moved: vacuous"
