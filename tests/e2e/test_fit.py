"""What ``model.fit`` takes, slsml trains: labels of shape (n,) against one sigmoid output, one-hot labels,
compiled metrics evaluated by the workers on their slices of the test split, summed into Keras's result."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import keras
import numpy as np
import pytest

import slsml
from slsml.client import runs
from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.training import modelio

from .conftest import finish


@pytest.fixture(scope="module")
def cancer(services) -> tuple[np.ndarray, ...]:
    """scikit-learn's breast cancer data, standardized, labels of shape (n,), in the cloud as ``cancer``."""
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    arrays = data.split_train_test(x, y.astype(np.int64), 0.25, seed=0)
    data.put_dataset(services.store, "cancer", *arrays)
    return arrays


def _logistic(metrics: list) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=metrics)
    return model


def test_binary_labels_of_rank_one_train_and_the_workers_metrics_equal_keras_evaluate(services, cancer) -> None:
    model = _logistic([keras.metrics.AUC(name="auc"), "accuracy", keras.metrics.Precision(name="precision")])
    spec = TrainingSpec(workers=3, reducers=2, global_batch=64, iterations=6, eval_every=3)
    config = launch.start_run(services, modelio.save_model(model), "cancer", spec, run_id="fit-cancer")
    assert [m if isinstance(m, str) else m["class_name"] for m in json.loads(config.metrics)] == [
        "AUC",
        "accuracy",
        "Precision",
    ]
    run = finish(services, "fit-cancer")
    assert run.status == "COMPLETED", run.reason
    final = modelio.load_model(services.store.get(keys.final_model("fit-cancer")))  # compiled as it was given
    expected = final.evaluate(cancer[2], cancer[3], return_dict=True, verbose=0)
    assert set(run.test) == {"loss", "auc", "accuracy", "precision"}
    for name, value in expected.items():
        assert run.test[name] == pytest.approx(value, abs=1e-3), name
    assert (run.test_loss, run.test_accuracy) == (run.test["loss"], run.test["accuracy"])
    summary = runs.summarize(run, services.table.list_iterations("fit-cancer"), 1.0)
    dumped = json.loads(summary.model_dump_json())
    assert dumped["test_auc"] == run.test["auc"] and dumped["test_loss"] == run.test["loss"]
    # the model entering iteration 3 was evaluated by iteration 3's workers, onto iteration 2's counter
    counters = {c.iteration: c for c in services.table.list_iterations("fit-cancer")}
    assert set(counters[2].test) == {"loss", "auc", "accuracy", "precision"} and counters[1].test is None
    stored = services.store.list_keys(keys.evaluations_prefix("fit-cancer", 6, "test"))
    assert len(stored) == 3  # the final evaluation: one state per worker


def test_test_figures_of_a_weighted_dataset_equal_keras_evaluate_with_its_test_weights(services, cancer) -> None:
    rng = np.random.default_rng(5)
    w, w_test = rng.uniform(0.2, 3.0, len(cancer[1])), rng.uniform(0.2, 3.0, len(cancer[3]))
    data.put_dataset(services.store, "cancer-test-weights", *cancer, w=w.astype(np.float32), w_test=w_test)
    model = _logistic([keras.metrics.AUC(name="auc"), "accuracy"])
    spec = TrainingSpec(workers=3, reducers=2, global_batch=64, iterations=2, eval_every=0)
    launch.start_run(services, modelio.save_model(model), "cancer-test-weights", spec, run_id="fit-weighted")
    run = finish(services, "fit-weighted")
    assert run.status == "COMPLETED", run.reason
    final = modelio.load_model(services.store.get(keys.final_model("fit-weighted")))
    weighted = final.evaluate(cancer[2], cancer[3], sample_weight=w_test, return_dict=True, verbose=0)
    for name, value in weighted.items():
        assert run.test[name] == pytest.approx(value, abs=1e-5), name
    unweighted = final.evaluate(cancer[2], cancer[3], return_dict=True, verbose=0)
    assert run.test["loss"] != pytest.approx(unweighted["loss"], abs=1e-3)  # the weights counted


def test_one_hot_labels_with_categorical_crossentropy_get_accuracy(services, cancer) -> None:
    x, y, x_test, y_test = cancer
    one_hot = [x, np.eye(2, dtype=np.float32)[y], x_test, np.eye(2, dtype=np.float32)[y_test]]
    data.put_dataset(services.store, "cancer-one-hot", *one_hot)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="categorical_crossentropy")
    spec = TrainingSpec(workers=2, reducers=1, global_batch=64, iterations=3, eval_every=0)
    launch.start_run(services, modelio.save_model(model), "cancer-one-hot", spec, run_id="fit-one-hot")
    run = finish(services, "fit-one-hot")
    assert run.status == "COMPLETED", run.reason
    final = modelio.load_model(services.store.get(keys.final_model("fit-one-hot")))
    final.compile(loss="categorical_crossentropy", metrics=["accuracy"])
    expected = final.evaluate(one_hot[2], one_hot[3], return_dict=True, verbose=0)
    assert run.test == pytest.approx(expected, abs=1e-4)


def test_an_uncompiled_models_missing_pieces_are_named_in_one_message(services, cancer) -> None:
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(1, activation="sigmoid")])
    with pytest.raises(BadInputError, match=r"not compiled: give a loss \(.*\) and an optimizer \(e.g. --optimizer"):
        launch.prepare_run(services, modelio.save_model(model), "cancer", TrainingSpec(iterations=1), "fit-bare")
    spec = TrainingSpec(iterations=1, loss="binary_crossentropy", optimizer=OptimizerConfig(name="sgd"))
    config = launch.prepare_run(services, modelio.save_model(model), "cancer", spec, "fit-given")
    assert config.optimizer.learning_rate == 0.01  # Keras's default for SGD
    assert not services.store.exists(keys.run_config("fit-bare"))


def test_labels_all_beyond_the_outputs_are_refused_in_slsmls_words(services) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4)).astype(np.float32)
    data.put_dataset(services.store, "high-labels", x, np.full(40, 7), x[:8], np.full(8, 7))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.raises(BadInputError) as error:
        launch.prepare_run(
            services, modelio.save_model(model), "high-labels", TrainingSpec(iterations=1, global_batch=8), "fit-high"
        )
    assert str(error.value) == "labels go up to 7 but the model has only 3 outputs (classes 0 to 2)"


@keras.saving.register_keras_serializable("slsml_fit_tests")
class LastLoss(keras.metrics.Metric):
    """The last batch's mean error: a state that does not add up."""

    def __init__(self, name: str = "last_error", **kwargs: object) -> None:
        super().__init__(name=name, **kwargs)
        self.last = self.add_variable(shape=(), initializer="zeros", name="last")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.last.assign(keras.ops.mean(keras.ops.abs(keras.ops.cast(y_true, "float32") - y_pred[:, 0])))

    def result(self):
        return self.last


@keras.saving.register_keras_serializable("slsml_fit_tests")
class Unlearning(keras.Model):
    """A model of its own training step (which slsml's workers would not run: they compute Keras's)."""

    def train_step(self, data):
        return {"loss": 0.0}


def _lambda() -> keras.Model:
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(1), keras.layers.Lambda(lambda z: z * 2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _own_loss() -> keras.Model:
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss=lambda y, p: keras.ops.mean((y - p) ** 2))
    return model


def _subclassed() -> keras.Model:
    inputs = keras.Input((30,))
    model = Unlearning(inputs, keras.layers.Dense(1, "sigmoid")(inputs))
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    return model


def test_a_model_carrying_code_of_its_own_is_refused_naming_it_before_anything_is_stored(services, cancer) -> None:
    """A metric, a model class, a loss function or a Lambda layer of the caller's own, which the functions cannot
    import (Keras's safe mode), is named before anything is stored or started: by the run's start (the command's
    path), by ``fit``, and by any loader of the archive."""
    model = _logistic([keras.metrics.AUC(), LastLoss()])
    with pytest.raises(BadInputError, match=r"code of its own, .* class 'LastLoss' \(slsml_fit_tests>LastLoss\); they"):
        launch.prepare_run(services, modelio.save_model(model), "cancer", TrainingSpec(iterations=1), "fit-last")
    assert services.store.list_keys(keys.run_prefix("fit-last")) == []
    x, y, *_ = cancer
    for build, named in [
        (_subclassed, r"class 'Unlearning' \(slsml_fit_tests>Unlearning\)"),
        (_lambda, r"Lambda layer 'lambda(_\d+)?' \(Python code\)"),
        (_own_loss, r"loss \(a Python lambda\)"),
    ]:
        with pytest.raises(BadInputError, match=rf"^the model carries code of its own, .*: {named}; they hold Keras"):
            slsml.fit(build(), x, y, verbose=0)
        with pytest.raises(BadInputError, match=rf"^model\.keras carries code of its own, .*: {named}; they"):
            modelio.load_model(modelio.save_model(build()), "model.keras")
    # Keras's own functions, given as functions, are Keras's: taken
    own = keras.Sequential([keras.Input((30,)), keras.layers.Dense(1), keras.layers.Lambda(keras.ops.sigmoid)])
    own.compile(optimizer="sgd", loss=keras.losses.binary_crossentropy, metrics=[keras.metrics.binary_accuracy])
    modelio.check_portable(keras.saving.serialize_keras_object(own))
    assert len(modelio.load_model(modelio.save_model(own)).weights) == 2


def test_epochs_set_the_length_and_held_out_samples_are_evaluated_at_each_epochs_end(services, cancer) -> None:
    model = _logistic([keras.metrics.AUC(name="auc")])
    spec = TrainingSpec(workers=2, reducers=1, global_batch=64, epochs=2, validation_split=0.2, eval_every=0)
    config = launch.start_run(services, modelio.save_model(model), "cancer", spec, run_id="fit-epochs")
    trained, held = data.held_out(spec, len(cancer[0]))
    assert held.tolist() == list(range(math.floor(0.8 * len(cancer[0])), len(cancer[0])))  # Keras's: the last ones
    assert trained.tolist() == list(range(held[0]))
    per_epoch = -(-len(trained) // 64)  # as Keras counts: the last batch the samples left
    assert config.training.iterations == 2 * per_epoch
    run = finish(services, "fit-epochs")
    assert run.status == "COMPLETED", run.reason
    counters = {c.iteration: c for c in services.table.list_iterations("fit-epochs")}
    assert [i for i, c in sorted(counters.items()) if c.val] == [per_epoch - 1, 2 * per_epoch - 1]
    final = modelio.load_model(services.store.get(keys.final_model("fit-epochs")))
    expected = final.evaluate(cancer[0][held], cancer[1][held], return_dict=True, verbose=0)
    assert run.val == pytest.approx(expected, abs=1e-4)
    dumped = json.loads(runs.summarize(run, [], 1.0).model_dump_json())
    assert dumped["val_auc"] == run.val["auc"] and dumped["val_loss"] == run.val["loss"]
    # no sample of the held-out ones was trained on: every update's samples came from the others
    assert sum(r.samples for c in counters.values() for r in c.reports.values()) == 2 * len(trained)


@pytest.mark.parametrize("split", [0.0, 1.0])
def test_a_validation_split_of_none_or_all_is_refused(split: float) -> None:
    with pytest.raises(ValueError, match="validation_split"):
        TrainingSpec(validation_split=split)


def test_class_weights_for_classes_the_labels_do_not_have_are_refused_before_anything_is_stored(services, cancer):
    model = _logistic(["accuracy"])
    spec = TrainingSpec(iterations=1, class_weight={0: 1.0, 1: 2.0, 5: 3.0})
    with pytest.raises(BadInputError) as error:
        launch.prepare_run(services, modelio.save_model(model), "cancer", spec, "fit-class-five")
    assert str(error.value) == (
        "class_weight names class 5 that the labels do not have (the training labels are classes 0, 1)"
    )
    assert services.store.list_keys(keys.run_prefix("fit-class-five")) == []
    config = launch.prepare_run(
        services,
        modelio.save_model(model),
        "cancer",
        spec.model_copy(update={"class_weight": "balanced"}),
        "fit-balanced",
    )
    counts = np.bincount(cancer[1])
    assert config.class_weights == pytest.approx(tuple(len(cancer[1]) / (2 * counts)))
    data.put_dataset(services.store, "cancer-weighted", *cancer, w=np.linspace(0.5, 2, len(cancer[0])))
    with pytest.raises(
        BadInputError,
        match=r"holds sample weights and the run gives class_weight: Keras's fit takes"
        " one or the other",
    ):
        launch.prepare_run(services, modelio.save_model(model), "cancer-weighted", spec, "fit-both-weights")
    assert services.store.list_keys(keys.run_prefix("fit-both-weights")) == []
    # float labels (0./1.) record no classes: each label is rounded to its class, as Keras's fit rounds it
    x, y, x_test, y_test = cancer
    data.put_dataset(services.store, "cancer-floats", x, y.astype(np.float32), x_test, y_test.astype(np.float32))
    floats = spec.model_copy(update={"class_weight": TrainingSpec(class_weight={1: 2.0}).class_weight})
    config = launch.prepare_run(services, modelio.save_model(model), "cancer-floats", floats, "fit-float-classes")
    assert config.class_weights == (1.0, 2.0)
    # labels of several outputs: Keras weighs the classes of one output only
    named, named_test = ({k: labels.astype(np.float32) for k in "ab"} for labels in (y, y_test))
    data.put_dataset(services.store, "cancer-two", x, named, x_test, named_test)
    inputs = keras.Input((x.shape[1],))
    two = keras.Model(inputs, {k: keras.layers.Dense(1, activation="sigmoid", name=k)(inputs) for k in named})
    two.compile(optimizer="adam", loss={k: "binary_crossentropy" for k in named})
    with pytest.raises(BadInputError, match="has the labels of several outputs and the run gives class_weight"):
        launch.prepare_run(services, modelio.save_model(two), "cancer-two", floats, "fit-two-classes")


def test_early_stopping_ends_the_run_completed_and_keep_best_keeps_the_best_evaluated_model(services, cancer):
    """--early-stopping val_loss:1 and --keep-best val_loss, the declarative EarlyStopping and ModelCheckpoint: at a
    rate where the validation loss jumps about, the run ends COMPLETED with the reason once it has not improved for
    one epoch, before its budget, and its final model is the best evaluated one, with its optimizer's state."""
    from slsml.training import stopping

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.SGD(6.0), loss="binary_crossentropy", metrics=["accuracy"])
    spec = TrainingSpec(
        workers=2,
        reducers=1,
        global_batch=64,
        epochs=12,
        validation_split=0.25,
        validation_samples="seeded",  # a draw whose loss jumps about at this rate
        eval_every=0,
        early_stopping="val_loss:1",
        keep_best="val_loss",
    )
    config = launch.start_run(services, modelio.save_model(model), "cancer", spec, run_id="fit-stop")
    assert config.modes == {"loss": "min"}
    run = finish(services, "fit-stop")
    assert run.status == "COMPLETED", run.reason
    per_epoch = config.training.iterations // 12
    counters = sorted(services.table.list_iterations("fit-stop"), key=lambda c: c.iteration)
    series = [(c.iteration, c.val["loss"]) for c in counters if c.val]
    values = [value for _, value in series]
    stopped = stopping.stopped_at(values, "min", 1, 0.0)
    assert stopped is not None and stopped < 11, f"the validation loss never stalled: {values}"
    assert run.iteration == (stopped + 1) * per_epoch < config.training.iterations
    assert run.reason.startswith("early stopping: val_loss did not improve by more than 0 for 1 evaluation")
    best, _ = series[stopping.best_at(values, "min")]
    print(
        f"\nval_loss per epoch {[round(v, 4) for v in values]}: stopped after epoch {stopped + 1} of 12, final model"
        f" entering iteration {best + 1} of {run.iteration}"
    )
    assert best + 1 < run.iteration, f"the best model is the last: {values}"  # else keep-best changed nothing
    final = modelio.load_model(services.store.get(keys.final_model("fit-stop")))
    kept = modelio.load_model(services.store.get(keys.model("fit-stop", best + 1)))
    for got, expected in zip(final.weights, kept.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    assert int(final.optimizer.iterations) == best + 1  # the optimizer's state as fit left it there
    best_counter = next(c for c in counters if c.iteration == best)
    assert run.val == best_counter.val and run.test == best_counter.test is not None
    held = data.held_out(config.training, len(cancer[0]))[1]
    assert final.evaluate(cancer[0][held], cancer[1][held], return_dict=True, verbose=0)["loss"] == pytest.approx(
        run.val["loss"], abs=1e-4
    )


def test_early_stopping_on_a_figure_the_model_does_not_compute_is_refused_at_start(services, cancer):
    model = _logistic(["accuracy"])
    spec = TrainingSpec(iterations=4, validation_split=0.2, early_stopping="val_auc:2")
    with pytest.raises(BadInputError) as error:
        launch.prepare_run(services, modelio.save_model(model), "cancer", spec, "fit-stop-auc")
    assert str(error.value) == (
        "--early-stopping val_auc: the model does not compute 'auc' (it computes val_loss, val_accuracy)"
    )
    assert services.store.list_keys(keys.run_prefix("fit-stop-auc")) == []


def test_slsml_fit_takes_dicts_of_arrays_by_input_and_output_name() -> None:
    """slsml.fit of a two-input, two-output model on dicts, and x as a list in the order of its inputs, as model.fit
    takes them: the History holds each output's validation loss and metrics under Keras's names, equal to the trained
    model's own evaluate."""
    import slsml

    from .test_equivalence import multi_arrays, multi_model

    x, y, x_val, y_val = multi_arrays()
    model = multi_model()
    order = modelio.input_names(model)
    listed, listed_val = [x[name] for name in order], [x_val[name] for name in order]
    with pytest.raises(BadInputError, match=r"x is a list of 1 arrays and the model has 2 \("):
        slsml.fit(model, listed[:1], y, batch_size=256, workers=2, verbose=0)
    history = slsml.fit(
        model, listed, y, batch_size=256, epochs=2, validation_data=(listed_val, y_val), workers=2, verbose=0
    )
    assert len(history.history["loss"]) == 2
    expected = model.evaluate(x_val, y_val, batch_size=len(y_val["digit"]), return_dict=True, verbose=0)
    for name, value in expected.items():
        assert history.history[f"val_{name}"][-1] == pytest.approx(value, rel=1e-4, abs=1e-5), name


def test_slsml_fit_refuses_inputs_whose_names_do_not_match_before_anything_starts() -> None:
    import slsml

    from .test_equivalence import multi_arrays, multi_model

    x, y, _, _ = multi_arrays()
    x["image"] = x.pop("pixels")
    with pytest.raises(BadInputError, match=r"'image' is no input of it; 'pixels' has no array"):
        slsml.fit(multi_model(), x, y, batch_size=64, workers=2, verbose=0)


def test_a_keras_users_fit_trains_an_uncompiled_model_and_its_val_loss_is_evaluate_on_the_last_fifth(
    tmp_path: Path,
) -> None:
    """A Keras user's script as it stands: the model not compiled, fit given compile's loss=, optimizer= and metrics=,
    and validation_split=0.2; the History's val_ figures are the trained model's evaluate on the last 20 % of the
    samples, the ones Keras's own fit holds out (before it shuffles). Its CSVLogger and LambdaCallback are told each
    epoch's figures as it ends, as Keras tells them; a LambdaCallback of a batch hook is refused."""
    from sklearn.datasets import load_breast_cancer

    import slsml

    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(1, activation="sigmoid")])
    told: list[tuple] = []
    watching = [
        keras.callbacks.CSVLogger(str(tmp_path / "epochs.csv")),
        keras.callbacks.LambdaCallback(
            on_train_begin=lambda logs: told.append(("train_begin",)),
            on_epoch_begin=lambda epoch, logs: told.append(("epoch_begin", epoch)),
            on_epoch_end=lambda epoch, logs: told.append(("epoch_end", epoch, dict(logs))),
            on_train_end=lambda logs: told.append(("train_end",)),
        ),
    ]
    arguments = {"batch_size": 64, "epochs": 3, "validation_split": 0.2, "loss": "binary_crossentropy"}
    arguments |= {"optimizer": "adam", "metrics": ["accuracy"], "workers": 2, "reducers": 1, "verbose": 0}
    batched = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None)
    with pytest.raises(BadInputError, match=r"callback LambdaCallback defines on_train_batch_end: slsml\.fit tells"):
        slsml.fit(model, x, y, callbacks=[batched], **arguments)
    history = slsml.fit(model, x, y, callbacks=watching, **arguments)
    per_epoch = [{name: values[e] for name, values in history.history.items()} for e in range(3)]
    assert told == [
        ("train_begin",),
        *[event for e in range(3) for event in (("epoch_begin", e), ("epoch_end", e, per_epoch[e]))],
        ("train_end",),
    ]
    with open(tmp_path / "epochs.csv") as logged:
        rows = list(csv.DictReader(logged))
    assert [int(row.pop("epoch")) for row in rows] == [0, 1, 2]
    assert [{name: float(value) for name, value in row.items()} for row in rows] == per_epoch
    assert {name: len(values) for name, values in history.history.items()} == dict.fromkeys(
        ["loss", "accuracy", "val_loss", "val_accuracy"], 3
    )
    split_at = math.floor(len(x) * 0.8)  # Keras's: the samples from here on are held out
    assert history.params["steps"] == -(-split_at // 64)  # an epoch trains the others only
    held = model.evaluate(x[split_at:], y[split_at:], return_dict=True, verbose=0)
    print(f"\nval_loss {history.history['val_loss'][-1]:.6f}, evaluate on the last 20 % {held['loss']:.6f}")
    assert round(history.history["val_loss"][-1], 4) == round(held["loss"], 4)
    assert round(history.history["val_accuracy"][-1], 4) == round(held["accuracy"], 4)
    assert type(model.optimizer).__name__ == "Adam" and int(model.optimizer.iterations) == 3 * history.params["steps"]
