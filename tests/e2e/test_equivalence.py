"""With quorum 1 the pipeline reproduces single-process Keras training on the same global batches, for
every optimizer, learning-rate schedule, weight decay (with exclusions), kind of gradient clipping, and
the moving average of the weights."""

from __future__ import annotations

import functools
from collections.abc import Callable

import keras
import numpy as np
import pytest
import tensorflow as tf

from slsml.accounting import usage
from slsml.client import demo
from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.rounds import accumulate
from slsml.spec import keys, schedules
from slsml.spec.config import OPTIMIZER_NAMES, OptimizerConfig, RunConfig, TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.spec.shardplan import ShardPlan
from slsml.training import modelio

from .conftest import final_weights, finish, train

ITERATIONS = 4
BATCH = 96
K, S = keras.optimizers, keras.optimizers.schedules
# Each case once, as a Keras optimizer: the reference trains with it, and the pipeline with the config
# read from its get_config(), as from a compiled model. The schedules change the rate within ITERATIONS
# steps; the clipping thresholds lie below the gradients' norms (global ≈ 0.3-0.5, the dense kernel's
# ≈ 0.16-0.23, max|g| ≈ 0.05-0.08), so that clipping acts in every step.
KERAS: dict[str, Callable[[], keras.optimizers.Optimizer]] = {
    "sgd-momentum": lambda: K.SGD(learning_rate=0.05, momentum=0.9),
    "sgd-nesterov": lambda: K.SGD(learning_rate=0.05, momentum=0.9, nesterov=True),
    "adam": lambda: K.Adam(learning_rate=3e-3),
    "adamw-cosine-warmup-globalclip": lambda: K.AdamW(
        learning_rate=S.CosineDecay(5e-4, decay_steps=2, alpha=0.1, warmup_target=4e-3, warmup_steps=2),
        weight_decay=0.25,
        global_clipnorm=0.2,
    ),
    "rmsprop-centered-exponential": lambda: K.RMSprop(
        learning_rate=S.ExponentialDecay(2e-3, decay_steps=1, decay_rate=0.6),
        rho=0.8,
        momentum=0.5,
        centered=True,
    ),
    "adagrad-inversetime-decay": lambda: K.Adagrad(
        learning_rate=S.InverseTimeDecay(0.05, decay_steps=1.5, decay_rate=1.0, staircase=True),
        weight_decay=0.1,
    ),
    "adamax-piecewise-clipvalue": lambda: K.Adamax(
        learning_rate=S.PiecewiseConstantDecay([1, 2], [4e-3, 2e-3, 1e-3]),
        clipvalue=0.005,
    ),
    "nadam-polynomial": lambda: K.Nadam(
        learning_rate=S.PolynomialDecay(4e-3, decay_steps=3, end_learning_rate=5e-4, power=2.0),
    ),
    "lion-restarts": lambda: K.Lion(
        learning_rate=S.CosineDecayRestarts(1e-3, first_decay_steps=1.5, t_mul=2.0, m_mul=0.7, alpha=0.1),
    ),
    "sgd-decay-exclude-clipnorm": lambda: K.SGD(learning_rate=0.1, momentum=0.9, weight_decay=0.2, clipnorm=0.1),
    "adadelta-decay": lambda: K.Adadelta(learning_rate=1.0, rho=0.8, epsilon=1e-5, weight_decay=0.01),
    "adam-ema-overwrite": lambda: K.Adam(learning_rate=3e-3, use_ema=True, ema_momentum=0.6, ema_overwrite_frequency=3),
    "ftrl-regularized": lambda: K.Ftrl(
        learning_rate=0.05,
        learning_rate_power=-0.4,
        l1_regularization_strength=1e-4,
        l2_regularization_strength=1e-3,
        l2_shrinkage_regularization_strength=1e-3,
        beta=0.2,
    ),
}
# exclude_from_weight_decay is no part of get_config(): set on both sides
EXCLUDE = {"sgd-decay-exclude-clipnorm": ("bias",)}
# Round-off: float32 sums in another order (each worker's mean, then their weighted mean in float64) and
# numpy's arithmetic for TensorFlow's change the averaged gradient and the step by ~1e-7 relative. Where
# an optimizer's step is a smooth function of g, the weights stay within ~1e-7 of their scale (measured:
# at most 2.6e-6, Ftrl): TOLERANCE 1e-5. Adam, Adamax and Nadam divide m by sqrt(v) (Adamax: max|g|) + eps,
# which is ~|g|: where g is tiny, cancelling to near 0, a relative error of ~1e-7 of its summands is a
# large one of g, and the step is ±lr whatever its size: 1e-4 (measured: up to 7.4e-6, Nadam with W=3).
# AdamW's case divides alike but measures 1.5e-7, so it keeps 1e-5. Lion steps by sign(...), which such a
# g could flip (a step of 2·lr, beyond any tolerance); measured: exact.
TOLERANCE = {name: 1e-5 for name in KERAS}
TOLERANCE |= {"adam": 1e-4, "adam-ema-overwrite": 1e-4, "adamax-piecewise-clipvalue": 1e-4, "nadam-polynomial": 1e-4}
# the shapes of the first cases trimmed to those the newer ones leave out (R=2, W=4)
CASES = [(name, w, r) for name in ("sgd-momentum", "adam") for w, r in ((1, 2), (4, 1), (4, 2), (4, 3))]
CASES += [("sgd-nesterov", 3, 2)]
# the others with one worker and one shard, and with three of each (several workers to average, shards that
# cut across variables: the exchange of norm clipping spans them)
CASES += [
    (name, w, r) for name in KERAS if name not in ("sgd-momentum", "sgd-nesterov", "adam") for w, r in ((1, 1), (3, 3))
]
# micro-batches forced: each worker's share (96 or 32 samples) in uneven micro-batches of at most 7 (7, 7, 6, 6, 6)
MICRO_BATCH = 7
MICRO_CASES = [("sgd-momentum", 1, 2), ("adam", 3, 2)]


def config_of(name: str) -> OptimizerConfig:
    """The pipeline's optimizer: read from the Keras optimizer's config, as from a compiled model."""
    optimizer = KERAS[name]()
    config = OptimizerConfig.from_keras(type(optimizer).__name__, optimizer.get_config())
    if name in EXCLUDE:
        config = OptimizerConfig.model_validate({**config.model_dump(), "exclude_from_weight_decay": EXCLUDE[name]})
    return config


def keras_optimizer(name: str, drop: tuple[str, ...] = (), exclude: bool = True) -> keras.optimizers.Optimizer:
    """The case's Keras optimizer; ``drop``: without these options (to see that they matter), ``exclude``:
    with the case's exclusions from weight decay."""
    optimizer = KERAS[name]()
    if drop:
        unset = {option: {"weight_decay": 0.0, "use_ema": False}.get(option) for option in drop}  # AdamW: a number
        optimizer = type(optimizer).from_config({**optimizer.get_config(), **unset})
    if exclude and name in EXCLUDE:
        optimizer.exclude_from_weight_decay(var_names=list(EXCLUDE[name]))
    return optimizer


def _run_id(name: str, workers: int, reducers: int, micro_batch: int | None = None) -> str:
    return f"eq-{name}-w{workers}-r{reducers}" + (f"-m{micro_batch}" if micro_batch else "")


@pytest.fixture(scope="module")
def pipeline_runs(services, digits):
    """All cases at once through the shared pipeline, the weighted runs beside them (runs also must not disturb each
    other)."""
    cases = [(*case, None) for case in CASES] + [(*case, MICRO_BATCH) for case in MICRO_CASES]
    for name, workers, reducers, micro_batch in cases:
        spec = TrainingSpec(
            workers=workers,
            reducers=reducers,
            global_batch=BATCH,
            iterations=ITERATIONS,
            optimizer=config_of(name),
            eval_every=0,
            micro_batch=micro_batch,
        )
        train(services, spec, _run_id(name, workers, reducers, micro_batch))
    start_weighted(services, digits)
    return {case: finish(services, _run_id(*case)) for case in cases}


def flat(model: keras.Model) -> np.ndarray:
    return np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])


@functools.cache
def reference(name: str, drop: tuple[str, ...] = (), exclude: bool = True) -> tuple[np.ndarray, tuple[bool, ...]]:
    """Single-process Keras on the same model, global batches, loss and optimizer: the final weights, and
    for each step whether the case's clipping changed the gradient (for ``clipnorm``: of a variable that
    three shards cut across)."""
    x, y, _, _ = demo.digits()
    model = demo.digits_cnn(seed=1)
    optimizer = keras_optimizer(name, drop, exclude)
    loss_fn = modelio.deserialize_loss(modelio.loss_config(model, None))
    plan = ShardPlan.build(modelio.variable_specs(model), 3)
    cut = {p.number for r in range(3) for p in plan.pieces(r) if not p.whole}
    clipped = []
    for iteration in range(ITERATIONS):
        batch = data.global_batch_indices(len(x), BATCH, seed=0, iteration=iteration)
        with tf.GradientTape() as tape:
            loss = loss_fn(y[batch], model(x[batch], training=True))
        gradients = tape.gradient(loss, model.trainable_weights)
        norms = [float(np.linalg.norm(np.asarray(g, dtype=np.float64))) for g in gradients]
        if optimizer.global_clipnorm:
            clipped.append(float(np.linalg.norm(norms)) > optimizer.global_clipnorm)
        elif optimizer.clipnorm:
            clipped.append(any(norms[i] > optimizer.clipnorm for i in cut))
        elif optimizer.clipvalue:
            clipped.append(any(float(np.abs(g).max()) > optimizer.clipvalue for g in gradients))
        optimizer.apply_gradients(zip(gradients, model.trainable_weights, strict=True))
    optimizer.finalize_variable_values(model.trainable_weights)  # as fit ends: with use_ema, the average
    return flat(model), tuple(clipped)


def test_the_cases_cover_every_optimizer_schedule_decay_and_clipping():
    configs = [config_of(name) for name in KERAS]
    assert {c.name for c in configs} == set(OPTIMIZER_NAMES)
    rates = [c.learning_rate for c in configs if not isinstance(c.learning_rate, float)]
    assert {r.class_name for r in rates} == set(schedules.NAMES)
    assert any(r.class_name == "CosineDecay" and r.warmup_target is not None for r in rates)
    assert all(len({float(r.rate(step)) for step in range(ITERATIONS)}) > 2 for r in rates), "a rate barely changes"
    assert any(c.weight_decay and c.exclude_from_weight_decay for c in configs)
    assert any(c.use_ema and c.ema_overwrite_frequency for c in configs)
    assert all(any(getattr(c, option) for c in configs) for option in ("clipnorm", "global_clipnorm", "clipvalue"))


@pytest.mark.parametrize(("name", "workers", "reducers"), CASES)
def test_pipeline_matches_single_process_keras(pipeline_runs, services, digits, name, workers, reducers):
    run = pipeline_runs[(name, workers, reducers, None)]
    assert run.status == "COMPLETED", run.reason
    assert run.iteration == ITERATIONS
    config = RunConfig.model_validate(services.store.get_json(keys.run_config(run.run_id)))
    assert config.optimizer == config_of(name)
    if reducers == 3:  # the shards cut across variables (the exchange of norm clipping spans them)
        assert any(not p.whole and p.variable.trainable for r in range(3) for p in config.plan.pieces(r))
    counters = [services.table.get_counter(run.run_id, i) for i in range(ITERATIONS)]
    if config.optimizer.clips_by_norm and reducers > 1:  # every shard's squares in, once, bar relaunched shards'
        assert all(reducers <= c.squares_in <= reducers + c.reduce_relaunches for c in counters), counters
    else:
        assert all(c.squares_in == 0 for c in counters)

    got, _ = final_weights(services, run.run_id)
    expected, clipped = reference(name)
    tolerance = TOLERANCE[name]
    scale = np.abs(expected).max()
    initial = flat(demo.digits_cnn(seed=1))
    assert np.abs(expected - initial).max() > 100 * tolerance * scale, "training moved nothing"
    # each feature of the case changes the result by far more than the tolerance: the test can see it fail
    features = {
        "clipping": ("clipnorm", "global_clipnorm", "clipvalue"),
        "weight decay": ("weight_decay",),
        "the moving average": ("use_ema",),
    }
    for feature, options in features.items():
        if any(getattr(config.optimizer, option) for option in options):
            without, _ = reference(name, drop=options)
            assert np.abs(expected - without).max() > 10 * tolerance * scale, f"{feature} changed nothing"
    if name in EXCLUDE:
        included, _ = reference(name, exclude=False)
        assert np.abs(expected - included).max() > 10 * tolerance * scale, "the exclusion changed nothing"
    if clipped:
        assert sum(clipped) > len(clipped) / 2, f"clipping acted in {sum(clipped)} of {len(clipped)} steps"

    error = np.abs(got - expected).max() / scale
    print(f"\n{name} W={workers} R={reducers}: max|Δw|/max|w| = {error:.2e} (tolerance {tolerance:g})")
    assert error <= tolerance, f"{name} W={workers} R={reducers}: max|Δw|/max|w| = {error:.2e}"


@pytest.mark.parametrize(("name", "workers", "reducers"), MICRO_CASES)
def test_micro_batched_workers_match_single_process_keras_on_the_full_batch(
    pipeline_runs, services, local, name, workers, reducers
):
    run = pipeline_runs[(name, workers, reducers, MICRO_BATCH)]
    assert run.status == "COMPLETED", run.reason
    share = BATCH // workers
    streamed = [r.streamed for r in usage.read_local(local.log_dir, run.run_id) if r.streamed is not None]
    assert len(streamed) == workers * ITERATIONS
    assert {s.micro_batches for s in streamed} == {len(accumulate.sizes(share, MICRO_BATCH))}
    assert {s.micro_batch for s in streamed} == {MICRO_BATCH} and share % MICRO_BATCH  # uneven micro-batches
    got, _ = final_weights(services, run.run_id)
    expected, _ = reference(name)
    error = np.abs(got - expected).max() / np.abs(expected).max()
    print(f"\n{name} W={workers} R={reducers} micro-batch {MICRO_BATCH}: max|Δw|/max|w| = {error:.2e}")
    assert error <= TOLERANCE[name]


CONTINUED = ("adam", 4, 3, None)  # one of the cases: shards that cut across variables
CONTINUE_STEPS = 4


@pytest.fixture(scope="module")
def continued_run(pipeline_runs):
    """The Adam case whose final.keras fit continues."""
    return pipeline_runs[CONTINUED]


def _continue(model: keras.Model) -> np.ndarray:
    """``fit`` continued on ``model`` for CONTINUE_STEPS batches; its weights after."""
    x, y, _, _ = demo.digits()
    model.fit(
        x[: CONTINUE_STEPS * BATCH], y[: CONTINUE_STEPS * BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0
    )
    return flat(model)


def test_fit_continued_on_final_keras_equals_fit_continued_on_the_single_process_model(continued_run, services):
    """fit continued on final.keras equals fit continued on the model of an uninterrupted single-process run (the
    optimizer's moments and step count carried)."""
    run = continued_run
    assert run.status == "COMPLETED", run.reason
    x, y, _, _ = demo.digits()
    reference = demo.digits_cnn(seed=1)
    reference.compile(optimizer=keras_optimizer(CONTINUED[0]), loss="sparse_categorical_crossentropy")
    for iteration in range(ITERATIONS):  # fit's own steps, on the pipeline's global batches
        batch = data.global_batch_indices(len(x), BATCH, seed=0, iteration=iteration)
        reference.train_on_batch(x[batch], y[batch])
    final = modelio.load_model(services.store.get(keys.final_model(run.run_id)))
    assert int(final.optimizer.iterations) == int(reference.optimizer.iterations) == ITERATIONS
    moments = [np.asarray(v) for v in final.optimizer._momentums]
    assert all(np.abs(m).max() > 0 for m in moments), "the moments were not carried"
    fresh = modelio.load_model(services.store.get(keys.final_model(run.run_id)))
    fresh.compile(optimizer=keras_optimizer(CONTINUED[0]), loss="sparse_categorical_crossentropy")

    expected, got, restarted = _continue(reference), _continue(final), _continue(fresh)

    assert int(final.optimizer.iterations) == ITERATIONS + CONTINUE_STEPS
    tolerance, scale = TOLERANCE[CONTINUED[0]], np.abs(expected).max()
    assert np.abs(restarted - expected).max() > 10 * tolerance * scale, "a fresh optimizer continues alike: vacuous"
    error = np.abs(got - expected).max() / scale
    print(
        f"\nfit continued on final.keras vs the single-process model: max|Δw|/max|w| = {error:.2e}"
        f" (tolerance {tolerance:g}; a fresh optimizer: {np.abs(restarted - expected).max() / scale:.2e})"
    )
    assert error <= tolerance


# class weights: a mapping that leaves classes out (weight 1) and balanced (over the training labels' counts); and
# per-sample weights stored with the dataset
CLASS_WEIGHTS = {"mapping": {0: 4.0, 3: 0.25, 7: 2.5}, "balanced": "balanced"}
WEIGHTED = ("sgd-momentum", 3, 2)
SAMPLE_WEIGHTS = "digits-weighted"


def sample_weights() -> np.ndarray:
    return np.random.default_rng(11).uniform(0.0, 3.0, len(demo.digits()[0])).astype(np.float32)


def start_weighted(services, digits) -> None:
    """Start the class-weighted runs and the sample-weighted one."""
    name, workers, reducers = WEIGHTED
    spec = TrainingSpec(
        workers=workers,
        reducers=reducers,
        global_batch=BATCH,
        iterations=ITERATIONS,
        optimizer=config_of(name),
        eval_every=0,
    )
    for case, class_weight in CLASS_WEIGHTS.items():
        train(
            services,
            spec.model_copy(update={"class_weight": TrainingSpec(class_weight=class_weight).class_weight}),
            f"eq-class-weight-{case}",
        )
    data.put_dataset(services.store, SAMPLE_WEIGHTS, *digits, w=sample_weights())
    launch.start_run(
        services, modelio.save_model(demo.digits_cnn(seed=1)), SAMPLE_WEIGHTS, spec, run_id="eq-sample-weight"
    )


@pytest.fixture(scope="module")
def weighted_runs(pipeline_runs, services):
    """The weighted runs (started with the cases), once ended."""
    return {
        **{case: finish(services, f"eq-class-weight-{case}") for case in CLASS_WEIGHTS},
        "sample": finish(services, "eq-sample-weight"),
    }


def weighted_reference(class_weight: dict[int, float] | None = None, weights: np.ndarray | None = None) -> np.ndarray:
    """Keras's own training step (fit's) on the same global batches, with ``class_weight`` or sample ``weights``."""
    x, y, _, _ = demo.digits()
    model = demo.digits_cnn(seed=1)
    model.compile(optimizer=keras_optimizer(WEIGHTED[0]), loss="sparse_categorical_crossentropy")
    for iteration in range(ITERATIONS):
        batch = data.global_batch_indices(len(x), BATCH, seed=0, iteration=iteration)
        model.train_on_batch(
            x[batch], y[batch], class_weight=class_weight, sample_weight=None if weights is None else weights[batch]
        )
    return flat(model)


@pytest.mark.parametrize("case", [*CLASS_WEIGHTS, "sample"])
def test_weighted_runs_equal_keras_fit_with_the_same_weights(weighted_runs, services, case):
    """class_weight and sample_weight runs equal single-process fit with the same weights, within 1e-5 × max|w|."""
    from sklearn.utils.class_weight import compute_class_weight

    run = weighted_runs[case]
    assert run.status == "COMPLETED", run.reason
    _, y, _, _ = demo.digits()
    if case == "sample":
        weights = sample_weights()
        expected, bound = weighted_reference(weights=weights), float(np.abs(weights).max())
    else:
        class_weight = CLASS_WEIGHTS[case]
        assert run.training.class_weights == class_weight
        if class_weight == "balanced":  # scikit-learn's balanced weights, as a Keras user computes them
            classes = np.unique(y)
            class_weight = dict(
                zip(classes.tolist(), compute_class_weight("balanced", classes=classes, y=y), strict=True)
            )
            assert max(class_weight.values()) / min(class_weight.values()) > 1.05, "the classes are balanced: vacuous"
        expected, bound = weighted_reference(class_weight=class_weight), max(class_weight.values())
    unweighted = weighted_reference()
    got, _ = final_weights(services, run.run_id)
    tolerance, scale = 1e-5 * bound, np.abs(expected).max()
    assert np.abs(unweighted - expected).max() > 10 * tolerance * scale, "the weights changed nothing"
    error = np.abs(got - expected).max() / scale
    print(f"\n{case} weights: max|Δw|/max|w| = {error:.2e} (tolerance 1e-5 × max|weight| = {tolerance:.1e})")
    assert error <= tolerance


# several inputs and outputs: a functional model of two named inputs (the digits' pixels and a feature of their own)
# and two outputs (the digit, and a regression on the feature), its losses weighted as compiled; x and y are named
# arrays stored in the dataset's records, matched to the model by name
MULTI = "digits-multi"
MULTI_CASE = ("sgd-momentum", 3, 2)


def multi_arrays() -> tuple[dict[str, np.ndarray], ...]:
    """(x, y, x_test, y_test): x by input name ("pixels", "extra"), y by output name ("digit", "size")."""
    x, y, x_test, y_test = demo.digits()
    rng = np.random.default_rng(5)

    def named(pixels: np.ndarray, labels: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        extra = rng.normal(size=(len(pixels), 3)).astype(np.float32)
        size = (pixels.mean(axis=(1, 2, 3)) + extra[:, 0]).astype(np.float32)  # shape (n,) against (n, 1)
        return {"pixels": pixels, "extra": extra}, {"digit": labels, "size": size}

    return (*named(x, y), *named(x_test, y_test))


def multi_model(loss_weights: dict[str, float] | None = None, image: str = "pixels") -> keras.Model:
    keras.utils.set_random_seed(3)
    pixels, extra = keras.Input((8, 8, 1), name=image), keras.Input((3,), name="extra")
    hidden = keras.layers.Dense(16, activation="relu")(
        keras.layers.Concatenate()([keras.layers.Flatten()(pixels), extra])
    )
    digit = keras.layers.Dense(10, activation="softmax", name="digit")(hidden)
    size = keras.layers.Dense(1, name="size")(keras.layers.Concatenate()([hidden, extra]))
    model = keras.Model({image: pixels, "extra": extra}, [digit, size])
    model.compile(
        optimizer=keras_optimizer(MULTI_CASE[0]),
        loss={"digit": "sparse_categorical_crossentropy", "size": "mse"},
        loss_weights=loss_weights or {"digit": 1.0, "size": 0.3},
        metrics={"digit": ["accuracy"], "size": ["mae"]},
    )
    return model


@pytest.fixture(scope="module")
def multi_run(services):
    _, workers, reducers = MULTI_CASE
    data.put_dataset(services.store, MULTI, *multi_arrays())
    spec = TrainingSpec(workers=workers, reducers=reducers, global_batch=BATCH, iterations=ITERATIONS, eval_every=0)
    launch.start_run(services, modelio.save_model(multi_model()), MULTI, spec, run_id="eq-multi")
    return finish(services, "eq-multi")


def multi_reference(loss_weights: dict[str, float] | None = None) -> tuple[keras.Model, list[dict[str, float]]]:
    """Keras's own training step (fit's) on the same global batches of the named arrays; the model, and each step's
    figures over its batch."""
    x, y, _, _ = multi_arrays()
    model = multi_model(loss_weights)
    figures = []
    for iteration in range(ITERATIONS):
        batch = data.global_batch_indices(len(y["digit"]), BATCH, seed=0, iteration=iteration)
        logs = model.train_on_batch(
            {k: v[batch] for k, v in x.items()}, {k: v[batch] for k, v in y.items()}, return_dict=True
        )
        figures.append({name: float(value) for name, value in logs.items()})
    return model, figures


def test_a_two_input_two_output_model_equals_keras_fit_and_its_figures_keras_evaluate(multi_run, services):
    """Named arrays matched to the model by name, each output's loss times its weight, trained as fit trains it;
    the workers' evaluation gives Keras's figures, each output's loss and metrics named as Keras names them, and so
    does each iteration's training on its batch."""
    run = multi_run
    assert run.status == "COMPLETED", run.reason
    manifest = data.load_manifest(services.store, MULTI)
    assert [(a.name, a.shape, a.dtype) for a in manifest.x_arrays] == [
        ("pixels", (8, 8, 1), "float32"),
        ("extra", (3,), "float32"),
    ]
    expected_model, train_figures = multi_reference()
    expected, got = flat(expected_model), final_weights(services, run.run_id)[0]
    scale = np.abs(expected).max()
    reweighted = flat(multi_reference({"digit": 1.0, "size": 1.0})[0])
    assert np.abs(expected - reweighted).max() > 100 * 1e-5 * scale, "the loss weights changed nothing: vacuous"
    error = np.abs(got - expected).max() / scale
    print(f"\ntwo inputs, two outputs: max|Δw|/max|w| = {error:.2e} (tolerance 1e-5)")
    assert error <= 1e-5

    _, _, x_test, y_test = multi_arrays()
    final = modelio.load_model(services.store.get(keys.final_model(run.run_id)))
    # in one batch: over batches of unequal sizes Keras's per-output losses are the plain mean of the batches' means
    keras_figures = final.evaluate(x_test, y_test, batch_size=len(y_test["digit"]), return_dict=True, verbose=0)
    assert set(run.test) == set(keras_figures) == {"loss", "digit_loss", "size_loss", "digit_accuracy", "size_mae"}
    for name, value in keras_figures.items():
        assert run.test[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    # each iteration's figures over its batch, each output's loss and metrics too, as Keras's train step gives them
    for iteration, figures in enumerate(train_figures):
        train = services.table.get_counter(run.run_id, iteration).train
        assert train is not None and set(train) == set(keras_figures)
        for name, value in figures.items():
            assert train[name] == pytest.approx(value, rel=1e-5, abs=1e-6), (iteration, name)


def test_inputs_whose_names_do_not_match_the_models_are_refused_in_one_line_with_nothing_stored(services, multi_run):
    renamed = multi_model(image="image")  # one input named otherwise than the data's array
    with pytest.raises(BadInputError, match=r"^the data does not fit the model: the data's inputs do not") as caught:
        launch.start_run(services, modelio.save_model(renamed), MULTI, TrainingSpec(workers=2), run_id="eq-renamed")
    assert "\n" not in str(caught.value) and "'pixels'" in str(caught.value)
    assert not services.store.list_keys(keys.run_prefix("eq-renamed"))
