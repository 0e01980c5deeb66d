"""Keras models ↔ flat vectors, the compiled optimizer, model loading and the worker's update."""

from __future__ import annotations

import io
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from slsml.rounds.accumulate import Whole
from slsml.spec.config import OptimizerConfig
from slsml.spec.errors import BadInputError
from slsml.spec.shardplan import ShardPlan
from slsml.training import evaluation, modelio

# keras' own model.save converts tensors with np.array(x) (numpy 2 copy-keyword deprecation): not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")

NOT_A_MODEL = r"is not a Keras model|could not be loaded as a Keras model"


def bn_model(seed: int = 0, momentum: float = 0.99) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    hidden = keras.layers.BatchNormalization(momentum=momentum, name="bn")(inputs)
    hidden = keras.layers.Dense(5, activation="relu", name="hidden")(hidden)
    outputs = keras.layers.Dense(3, activation="softmax", name="out")(hidden)
    return keras.Model(inputs, outputs)


def dense_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(3, activation="softmax", name="out")(keras.layers.Dense(6, activation="tanh")(inputs))
    return keras.Model(inputs, outputs)


def plan_of(model: keras.Model, reducers: int = 3) -> ShardPlan:
    return ShardPlan.build(modelio.variable_specs(model), reducers)


def batch(seed: int, n: int = 16, loc: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(loc, 2.0, (n, 4)).astype(np.float32), rng.integers(0, 3, n).astype(np.int64)


# ---- specs and flat vectors ---------------------------------------------------------------------


def test_variable_specs_of_a_batchnorm_model() -> None:
    model = bn_model()
    specs = modelio.variable_specs(model)
    assert [s.name for s in specs] == [v.path for v in model.weights]
    assert [s.shape for s in specs] == [tuple(v.shape) for v in model.weights]
    flags = {s.name.rsplit("/", 1)[-1] if s.name.startswith("bn/") else s.name: s.trainable for s in specs}
    assert flags["gamma"] and flags["beta"]
    assert not flags["moving_mean"] and not flags["moving_variance"]
    assert [s.name for s in specs if not s.trainable] == ["bn/moving_mean", "bn/moving_variance"]
    assert sum(s.size for s in specs) == 4 * 4 + (4 * 5 + 5) + (5 * 3 + 3)


def test_variable_specs_refuse_unusable_models() -> None:
    inputs = keras.Input((4,))
    float64 = keras.Model(inputs, keras.layers.Dense(2, dtype="float64")(inputs))
    with pytest.raises(BadInputError, match="float64"):
        modelio.variable_specs(float64)
    frozen = bn_model()
    frozen.trainable = False
    with pytest.raises(BadInputError, match="no trainable weights"):
        modelio.variable_specs(frozen)


def test_get_set_flat_round_trip() -> None:
    model = bn_model()
    plan = plan_of(model)
    flat = modelio.get_flat(model, plan)
    np.testing.assert_array_equal(flat, np.concatenate([np.ravel(v.numpy()) for v in model.weights]))

    new = np.random.default_rng(1).standard_normal(plan.size).astype(np.float32)
    modelio.set_flat(model, plan, new)
    np.testing.assert_array_equal(modelio.get_flat(model, plan), new)
    offset = 0
    for spec in plan.variables:  # each Keras variable holds its own slice
        variable = next(v for v in model.weights if v.path == spec.name)
        np.testing.assert_array_equal(variable.numpy(), new[offset : offset + spec.size].reshape(spec.shape))
        offset += spec.size

    reloaded = modelio.load_model(modelio.save_model(model))
    np.testing.assert_array_equal(modelio.get_flat(reloaded, plan_of(reloaded)), new)


# ---- optimizer ----------------------------------------------------------------------------------


def compiled(optimizer: keras.optimizers.Optimizer) -> keras.Model:
    model = dense_model()
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


def test_optimizer_config_of_adam() -> None:
    model = compiled(keras.optimizers.Adam(learning_rate=0.0123, beta_1=0.8, beta_2=0.95, epsilon=1e-6, amsgrad=True))
    config = modelio.optimizer_config(model)
    assert config.name == "adam" and config.amsgrad is True
    assert config.learning_rate == pytest.approx(0.0123, rel=1e-6)
    assert (config.beta_1, config.beta_2, config.epsilon) == pytest.approx((0.8, 0.95, 1e-6))
    defaults = modelio.optimizer_config(compiled(keras.optimizers.Adam()))
    expected = OptimizerConfig(name="adam", learning_rate=0.001)
    assert defaults.exclude_from_weight_decay == expected.exclude_from_weight_decay == ()
    not_flat = {"exclude_from_weight_decay"}  # pytest.approx compares flat mappings only
    assert defaults.model_dump(exclude=not_flat) == pytest.approx(expected.model_dump(exclude=not_flat))


def test_optimizer_config_of_sgd() -> None:
    config = modelio.optimizer_config(compiled(keras.optimizers.SGD(learning_rate=0.05, momentum=0.9, nesterov=True)))
    assert config.name == "sgd" and config.nesterov is True
    assert (config.learning_rate, config.momentum) == pytest.approx((0.05, 0.9))
    plain = modelio.optimizer_config(compiled(keras.optimizers.SGD(learning_rate=0.2)))
    assert plain.name == "sgd" and plain.momentum == 0 and not plain.nesterov
    assert plain.learning_rate == pytest.approx(0.2)


def test_optimizer_config_with_schedule_and_weight_decay_survives_the_keras_file() -> None:
    schedule = keras.optimizers.schedules.CosineDecay(0.01, decay_steps=100, warmup_target=0.05, warmup_steps=10)
    optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=0.02, beta_2=0.99)
    model = modelio.load_model(modelio.save_model(compiled(optimizer)))
    config = modelio.optimizer_config(model)
    assert config.name == "adamw" and config.weight_decay == pytest.approx(0.02) and config.beta_2 == 0.99
    assert config.learning_rate.class_name == "CosineDecay"
    assert (config.learning_rate.warmup_target, config.learning_rate.warmup_steps) == (0.05, 10)


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        (keras.optimizers.Lamb(), "optimizer Lamb is not supported: its trust ratio"),
        (keras.optimizers.ScheduleFreeAdamW(), "ScheduleFreeAdamW is not supported; use one of"),
        (keras.optimizers.SGD(gradient_accumulation_steps=2), "gradient_accumulation_steps=2 is not supported"),
        (
            keras.optimizers.Adam(keras.optimizers.schedules.LearningRateSchedule()),
            "schedule 'LearningRateSchedule' must override",
        ),
    ],
    ids=["lamb", "unknown", "accumulation", "custom-schedule"],
)
def test_unsupported_optimizers_are_refused(optimizer: keras.optimizers.Optimizer, message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        modelio.optimizer_config(compiled(optimizer))


def test_optimizer_config_carries_clipping_through_the_keras_file() -> None:
    for optimizer, option in [
        (keras.optimizers.Adam(clipnorm=1.5), "clipnorm"),
        (keras.optimizers.SGD(global_clipnorm=2.0), "global_clipnorm"),
        (keras.optimizers.Ftrl(clipvalue=0.5), "clipvalue"),
    ]:
        config = modelio.optimizer_config(modelio.load_model(modelio.save_model(compiled(optimizer))))
        clipping = {o: getattr(config, o) for o in ("clipnorm", "global_clipnorm", "clipvalue")}
        assert clipping == {**dict.fromkeys(clipping), option: getattr(optimizer, option)}, option


def test_weight_decay_exclusions_by_name_are_carried_over() -> None:
    optimizer = keras.optimizers.AdamW(weight_decay=0.01)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma"])
    model = compiled(optimizer)
    config = modelio.optimizer_config(model)
    assert len(config.exclude_from_weight_decay) == 1  # Keras joins the names into one pattern
    decays = {v.path: config.decays(v.path) for v in model.trainable_weights}
    assert decays == {v.path: optimizer._use_weight_decay(v) for v in model.trainable_weights}
    assert sorted(decays.values()) == [False, False, True, True]
    assert "exclude_from_weight_decay" not in optimizer.get_config()  # a .keras file never carries them
    without_decay = keras.optimizers.Adam()
    without_decay.exclude_from_weight_decay(var_names=["bias"])  # Keras ignores them: so do we
    assert modelio.optimizer_config(compiled(without_decay)).exclude_from_weight_decay == ()


def test_weight_decay_exclusions_by_variable_are_refused() -> None:
    model = dense_model()
    optimizer = keras.optimizers.AdamW(weight_decay=0.01)
    optimizer.exclude_from_weight_decay(var_list=model.trainable_weights[1:2])
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    with pytest.raises(BadInputError, match=r"var_list=\.\.\.\) is not supported: .*give names.*--exclude-from"):
        modelio.optimizer_config(model)


def test_uncompiled_model_has_no_optimizer() -> None:
    with pytest.raises(BadInputError, match="not compiled"):
        modelio.optimizer_config(dense_model())


# ---- loading ------------------------------------------------------------------------------------


def test_load_model_refuses_random_bytes() -> None:
    junk = np.random.default_rng(0).bytes(4096)
    with pytest.raises(BadInputError, match=NOT_A_MODEL) as raised:
        modelio.load_model(junk, where="s3://bucket/incoming/x.keras")
    assert "s3://bucket/incoming/x.keras" in str(raised.value)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_load_model_refuses_a_truncated_model(keep: float) -> None:
    data = modelio.save_model(bn_model())
    assert isinstance(modelio.load_model(data), keras.Model)
    with pytest.raises(BadInputError, match=NOT_A_MODEL):
        modelio.load_model(data[: int(len(data) * keep)])


def test_load_model_refuses_a_zip_that_is_not_a_model() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("notes.txt", "hello")
    with pytest.raises(BadInputError, match="could not be loaded as a Keras model"):
        modelio.load_model(buffer.getvalue())


def test_load_model_names_a_numpy_archive_given_as_the_model() -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((2, 3)), y=np.zeros(2))
    with pytest.raises(BadInputError) as refused:
        modelio.load_model(buffer.getvalue(), where="data.npz")
    assert str(refused.value) == (
        "data.npz is a NumPy archive of arrays (x, y), not a Keras model: give it as the data, and the model's .keras"
        " file (model.save) as the model"
    )


# ---- the worker's update ------------------------------------------------------------------------


def tape_gradient(model: keras.Model, x: np.ndarray, y: np.ndarray) -> tuple[dict[str, np.ndarray], float]:
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    gradients = tape.gradient(loss, model.trainable_weights)
    return {v.path: np.asarray(g) for v, g in zip(model.trainable_weights, gradients, strict=True)}, float(loss)


def parts(plan: ShardPlan, vector: np.ndarray) -> dict[str, np.ndarray]:
    return {spec.name: array for spec, array in zip(plan.variables, plan.unflatten(vector), strict=True)}


def test_compute_update_is_the_gradient() -> None:
    model = dense_model(seed=3)
    plan = plan_of(model, reducers=2)
    loss = modelio.loss_config(model, "sparse_categorical_crossentropy")
    trainer = modelio.Trainer(model, plan, loss)
    x, y = batch(4)
    trainer.meter = evaluation.Evaluator(model, loss, '["accuracy"]', (x[:2], y[:2])).batch_state

    update = trainer.compute_update(x, y)
    expected, expected_loss = tape_gradient(model, x, y)

    assert update.vector.shape == (plan.size,) and update.vector.dtype == np.float32
    got = parts(plan, update.vector)
    assert got.keys() == expected.keys()
    for name, gradient in expected.items():
        assert np.abs(gradient).max() > 1e-4, f"{name}: vanishing gradient makes the test vacuous"
        np.testing.assert_allclose(got[name], gradient, rtol=1e-5, atol=1e-7, err_msg=name)
    assert update.loss == pytest.approx(expected_loss, rel=1e-6)
    predicted = np.argmax(np.asarray(model(x, training=False)), axis=-1)
    assert update.metrics is not None  # the loss's sum and samples, then the accuracy's correct and samples
    n = len(y)
    np.testing.assert_allclose(update.metrics, [n * expected_loss, n, np.sum(predicted == y), n], rtol=1e-6)


def test_compute_update_of_a_batchnorm_model() -> None:
    """Non-trainable part: the moving statistics after one training-mode forward pass on the batch."""
    momentum = 0.9
    model = bn_model(seed=5, momentum=momentum)
    plan = plan_of(model)
    rng = np.random.default_rng(6)
    bn = model.get_layer("bn")
    old_mean = rng.normal(0, 1, 4).astype(np.float32)
    old_variance = rng.uniform(0.5, 2, 4).astype(np.float32)
    bn.moving_mean.assign(old_mean)
    bn.moving_variance.assign(old_variance)
    trainer = modelio.Trainer(model, plan, modelio.loss_config(model, "sparse_categorical_crossentropy"))
    x, y = batch(7, n=32, loc=3.0)

    update = trainer.compute_update(x, y)
    got = parts(plan, update.vector)

    expected_mean = old_mean * momentum + x.mean(axis=0) * (1 - momentum)
    expected_variance = old_variance * momentum + x.var(axis=0) * (1 - momentum)
    np.testing.assert_allclose(got["bn/moving_mean"], expected_mean, rtol=1e-5)
    np.testing.assert_allclose(got["bn/moving_variance"], expected_variance, rtol=1e-5)
    assert not np.allclose(got["bn/moving_mean"], old_mean)
    assert update.metrics is None  # no meter: no metrics tracked

    expected, _ = tape_gradient(model, x, y)  # gradients do not depend on the moving statistics
    for name, gradient in expected.items():
        np.testing.assert_allclose(got[name], gradient, rtol=1e-5, atol=1e-7, err_msg=name)


# ---- data against the model's input ---------------------------------------------------------------


def tokens(width: int = 12, dtype: str = "int32") -> list[modelio.InputSpec]:
    return [modelio.InputSpec("tokens", (None, width), dtype)]


def test_float_features_of_the_wrong_count_for_an_integer_input_are_named() -> None:
    problem = modelio.input_mismatch(tokens(), (30,), "float32", (0.0, 1.0))
    assert problem == (
        "samples of shape (30,) float32 vs model input 'tokens' of shape (12,) int32: 30 features"
        " where the model takes 12; float32 data for an integer input: the cast would truncate it;"
        " give integers"
    )


@pytest.mark.parametrize(
    ("shape", "dtype", "x_range"),
    [
        ((12,), "int64", (0.0, 49.0)),  # values int32 holds
        ((12,), "uint8", None),  # by its dtype
        ((12,), "bool", (0.0, 1.0)),
    ],
)
def test_integer_data_that_fits_an_integer_input(shape, dtype, x_range) -> None:
    assert modelio.input_mismatch(tokens(), shape, dtype, x_range) is None


@pytest.mark.parametrize(
    ("spec", "shape", "dtype", "x_range", "says"),
    [
        (tokens(), (12,), "float64", (0.0, 3.0), "float64 data for an integer input"),
        (tokens(dtype="int16"), (12,), "int64", (0.0, 70000.0), "values from 0 to 70000 do not fit int16"),
        (tokens(dtype="uint8"), (12,), "int64", (-1.0, 5.0), "values from -1 to 5 do not fit uint8"),
        (tokens(dtype="int16"), (12,), "int64", None, "int64 values do not fit int16"),
        (tokens(), (12, 1), "int32", None, "samples of 2 dimensions where the model takes 1"),
        ([modelio.InputSpec("image", (None, 8, 8, 1), "float32")], (8, 9, 1), "float32", None, "dimension 2: 9 vs 8"),
        ([modelio.InputSpec("flag", (None, 3), "bool")], (3,), "float32", None, "float32 data for a boolean input"),
        (
            [modelio.InputSpec("text", (None,), "string")],
            (),
            "float32",
            None,
            "inputs of dtype string are not supported",
        ),
    ],
)
def test_data_the_input_cannot_take_is_named(spec, shape, dtype, x_range, says) -> None:
    problem = modelio.input_mismatch(spec, shape, dtype, x_range)
    assert problem is not None and says in problem
    assert f"samples of shape {modelio._shape(shape)} {dtype} vs model input" in problem


def test_free_dimensions_and_any_numbers_for_a_float_input() -> None:
    sequence = [modelio.InputSpec("seq", (None, None, 4), "float32")]
    assert modelio.input_mismatch(sequence, (17, 4), "float64", None) is None
    assert modelio.input_mismatch(sequence, (17, 4), "int64", None) is None
    assert modelio.input_mismatch(sequence, (17, 5), "float32", None) == (
        "samples of shape (17, 5) float32 vs model input 'seq' of shape (None, 4) float32: dimension 2: 5 vs 4"
    )


def _two_inputs() -> keras.Model:
    first, second = keras.Input((3,), name="a"), keras.Input((4,), name="b", dtype="int32")
    joined = keras.layers.Concatenate()([first, keras.layers.Flatten()(keras.layers.Embedding(9, 2)(second))])
    return keras.Model({"a": first, "b": second}, keras.layers.Dense(1)(joined))


def test_a_model_of_several_inputs_given_one_array_is_told_to_give_named_arrays() -> None:
    problem = modelio.input_mismatch(modelio.model_inputs(_two_inputs()), (7,), "float32", None)
    assert problem.startswith(
        "the model takes 2 inputs ('a' (3,) float32; 'b' (4,) int32) and the dataset holds one array x:"
        " give x as named arrays, one per input"
    )


def test_named_arrays_are_matched_to_the_inputs_by_name_and_each_input_is_checked() -> None:
    """As fit matches a dict: the names that do not match are named in one line; then each input's shape and dtype
    (and an integer input's range) is checked."""
    model = _two_inputs()
    inputs = modelio.model_inputs(model)
    good = {"a": ((3,), "float32", None), "b": ((4,), "int64", (0.0, 8.0))}
    assert modelio.named_inputs_mismatch(inputs, good) is None
    renamed = {"a": good["a"], "c": good["b"]}
    assert modelio.named_inputs_mismatch(inputs, renamed) == (
        "the data's inputs do not match the model's by name: 'c' is no input of it; 'b' has no array"
        " (the model takes 'a', 'b'; the data has 'a', 'c')"
    )
    wrong = {"a": ((5,), "float32", None), "b": ((4,), "float32", None)}
    problem = modelio.named_inputs_mismatch(inputs, wrong)
    assert "'a' of shape (3,) float32: 5 features where the model takes 3" in problem
    assert "'b' of shape (4,) int32: float32 data for an integer input" in problem
    x = {"a": np.zeros((4, 3), np.float32), "c": np.zeros((4, 4), np.int32)}
    with pytest.raises(BadInputError, match=r"^the data does not fit the model: the data's inputs do not match"):
        modelio.check_fits(model, modelio.loss_config(model, "mse"), x, np.zeros((4, 1), np.float32), None)


def test_check_fits_refuses_what_keras_would_run_on() -> None:
    """A Sequential model only warns when called on samples of another shape (and casts floats to its int
    input): the check refuses them before any forward pass."""
    model = keras.Sequential(
        [
            keras.Input((12,), dtype="int32"),
            keras.layers.Embedding(50, 8),
            keras.layers.GRU(4),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    loss = modelio.loss_config(model, "sparse_categorical_crossentropy")
    floats = np.random.default_rng(0).random((2, 30)).astype(np.float32)
    model(floats)  # what made such a run train on garbage
    with pytest.raises(
        BadInputError,
        match=r"^the data does not fit the model: samples of shape \(30,\) float32 vs"
        r" model input '\w+' of shape \(12,\) int32: 30 features where the model takes 12",
    ):
        modelio.check_fits(model, loss, floats, np.array([0, 1]), 3)
    with pytest.raises(BadInputError, match=r"values from 0 to 3e\+09 do not fit int32"):
        modelio.check_fits(model, loss, np.zeros((2, 12), np.int64), np.array([0, 1]), 3, x_range=(0, 3e9))
    modelio.check_fits(model, loss, np.arange(24).reshape(2, 12), np.array([0, 1]), 3)  # int64 ids: fine


def test_an_archive_writer_writes_what_keras_saves() -> None:
    model = compiled(keras.optimizers.Adam(1e-3))
    plan = plan_of(model)
    model.optimizer.build(model.trainable_variables)
    model.optimizer.variables[-1].assign(np.ones(model.optimizer.variables[-1].shape))  # state the writer keeps
    writer = modelio.ArchiveWriter(model)
    rng = np.random.default_rng(0)
    for _ in range(3):  # the first save finds the datasets, the later ones rewrite them
        weights = rng.standard_normal(plan.size).astype(np.float32)
        modelio.set_flat(model, plan, weights)
        ours, theirs = writer.save(), modelio.save_model(model)
        np.testing.assert_array_equal(modelio.get_flat(model, plan), weights)  # the markers are gone
        with zipfile.ZipFile(io.BytesIO(ours)) as a, zipfile.ZipFile(io.BytesIO(theirs)) as b:
            assert a.namelist() == b.namelist()
            assert a.read("model.weights.h5") == b.read("model.weights.h5")
            assert a.read("config.json") == b.read("config.json")
        loaded = modelio.load_model(ours)
        np.testing.assert_array_equal(modelio.get_flat(loaded, plan), weights)
        for mine, keras_own in zip(loaded.optimizer.variables, model.optimizer.variables, strict=True):
            np.testing.assert_array_equal(mine.numpy(), keras_own.numpy())


def test_an_archive_writer_of_weights_it_cannot_tell_apart_saves_with_keras(monkeypatch: pytest.MonkeyPatch) -> None:
    model = dense_model()
    writer = modelio.ArchiveWriter(model)
    monkeypatch.setattr(modelio, "_WEIGHTS_ENTRY", "elsewhere.h5")  # no dataset found
    keras_save, saved = modelio.save_model, []
    monkeypatch.setattr(modelio, "save_model", lambda m: saved.append(m) or keras_save(m))
    plan = plan_of(model)
    weights = modelio.get_flat(model, plan)
    for _ in range(2):
        np.testing.assert_array_equal(modelio.get_flat(modelio.load_model(writer.save()), plan), weights)
    assert len(saved) == 3  # the marked save, then Keras' own every time


def test_local_steps_on_named_arrays_equal_keras_fit_steps_of_a_two_output_model() -> None:
    """Model averaging's local steps (and so ADMM's) take x and y as named arrays: each output's loss times its
    loss weight, as Keras's compiled loss trains it."""
    from slsml.rules import averaging

    def build() -> keras.Model:
        keras.utils.set_random_seed(2)
        first, second = keras.Input((4,), name="first"), keras.Input((2,), name="second")
        hidden = keras.layers.Dense(6, activation="tanh")(keras.layers.Concatenate()([first, second]))
        outputs = [
            keras.layers.Dense(3, activation="softmax", name="kind")(hidden),
            keras.layers.Dense(1, name="r")(hidden),
        ]
        model = keras.Model({"first": first, "second": second}, outputs)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss={"kind": "sparse_categorical_crossentropy", "r": "mse"},
            loss_weights={"kind": 1.0, "r": 0.5},
        )
        return model

    rng = np.random.default_rng(0)
    batches = [
        (
            {
                "first": rng.normal(size=(16, 4)).astype(np.float32),
                "second": rng.normal(size=(16, 2)).astype(np.float32),
            },
            {"kind": rng.integers(0, 3, 16), "r": rng.normal(size=16).astype(np.float32)},
            None,
        )
        for _ in range(3)
    ]
    model, reference = build(), build()
    plan = ShardPlan.build(modelio.variable_specs(model), 1)
    trainer = modelio.Trainer(model, plan, modelio.loss_config(model, None))
    start = modelio.get_flat(model, plan)
    progress, finished = averaging.local_steps(
        trainer, start, [Whole(batch) for batch in batches], OptimizerConfig(name="sgd", learning_rate=0.1), None
    )
    for x, y, _ in batches:
        reference.train_on_batch(x, y)
    expected = modelio.get_flat(reference, plan)
    assert finished and np.abs(expected - start).max() > 1e-3
    np.testing.assert_allclose(progress.weights, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("loss", "labels", "said"),
    [
        ("categorical_crossentropy", np.array([0, 2]), r"class ids .* loss='sparse_categorical_crossentropy', or give"),
        (keras.losses.CategoricalCrossentropy(), np.array([[1], [2]]), r"class ids .*\.to_categorical\(y, 3\)\)$"),
        ("sparse_categorical_crossentropy", np.eye(3)[[0, 2]], r"one-hot \(3 columns\) .* class ids \(y\.argmax"),
    ],
)
def test_a_cross_entropy_given_labels_of_the_other_form_says_which_loss_or_labels_to_give(loss, labels, said) -> None:
    """Keras fails deep in the loss (ranks or shapes that differ); the check names the mix-up and both ways out, and
    takes each loss with its own form of labels."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(BadInputError, match=said):
        modelio.check_fits(model, modelio.loss_config(model, loss), x, labels, None)
    right = np.eye(3)[[0, 2]] if labels.ndim == 1 or labels.shape[1] == 1 else np.array([0, 2])
    modelio.check_fits(model, modelio.loss_config(model, loss), x, right, None)
