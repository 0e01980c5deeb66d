"""``slsml.fit`` takes what ``model.fit`` takes (a ``tf.data.Dataset``, a generator) and shows what it shows: an
``Epoch k/N`` line and a bar per epoch, the ``val_`` figures at its end, each final line once and equal to History;
an epoch trains its last, smaller batch, as Keras's ⌈n/batch⌉ steps do, to Keras's weights."""

from __future__ import annotations

import math
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import slsml
from slsml.data import datasets as data
from slsml.spec.errors import BadInputError

BATCH = 64


def _cancer() -> tuple[np.ndarray, ...]:
    """Breast cancer, standardized: 455 training samples (7 batches of 64 and one of 7), 114 for validation."""
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    return x[114:], y[114:].astype(np.float32), x[:114], y[:114].astype(np.float32)


def _model() -> keras.Model:
    """The same initial weights at each call, drawn from the initializer's own seed: not from the process's global
    random state, which a thread still ending in the process may draw from meanwhile (a reference model made right
    after a ``fit`` once started from other weights)."""
    initializer = keras.initializers.GlorotUniform(seed=0)
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(1, "sigmoid", kernel_initializer=initializer)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc"), "accuracy"],
    )
    return model


def test_a_batched_dataset_trains_epochs_of_keras_steps_shows_keras_progress_and_equals_keras(capsys) -> None:
    x, y, x_val, y_val = _cancer()
    model = _model()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    history = slsml.fit(model, dataset, epochs=3, validation_data=(x_val, y_val), workers=2, reducers=1)
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # the bar's colours
    steps = math.ceil(len(x) / BATCH)  # 8: the last of 7 samples
    assert history.epoch == [0, 1, 2] and history.params["steps"] == steps == 8
    assert set(history.history) == {"loss", "auc", "accuracy", "val_loss", "val_auc", "val_accuracy"}
    assert re.findall(r"Epoch (\d)/3", out) == ["1", "2", "3"]
    finals = re.findall(rf"{steps}/{steps} .*? - (loss: .*)", out)
    assert len(finals) == 3, out  # each epoch's final line once
    for epoch, line in enumerate(finals):
        shown = dict(re.findall(r"(\w+): ([-\d.]+)", line))
        assert set(shown) == set(history.history)
        for name, value in shown.items():
            assert float(value) == pytest.approx(history.history[name][epoch], abs=6e-5), (epoch, name)
    # single-process Keras on the same global batches, the last of each epoch smaller: the same weights and figures
    reference = _model()
    for epoch in range(3):
        batches = [data.global_batch_indices(len(x), BATCH, 0, epoch * steps + i, 2) for i in range(steps)]
        assert [len(b) for b in batches] == [BATCH] * 7 + [7]
        order = np.concatenate(batches)
        fitted = reference.fit(x[order], y[order], batch_size=BATCH, shuffle=False, epochs=1, verbose=0)
        assert fitted.history["loss"][0] == pytest.approx(history.history["loss"][epoch], rel=1e-4)
    for got, expected in zip(model.weights, reference.weights, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-4, atol=1e-5)
    evaluated = reference.evaluate(x_val, y_val, return_dict=True, verbose=0)
    assert history.history["val_auc"][-1] == pytest.approx(evaluated["auc"], abs=1e-4)


class _Watch(keras.callbacks.Callback):
    """A callback of a user's own: keeps the model's weights and the figures at each epoch's end and the weights at
    the training's end, and stops the training after ``stop_after`` epochs (``model.stop_training``)."""

    def __init__(self, stop_after: int) -> None:
        super().__init__()
        self.stop_after, self.began, self.ended, self.logs = stop_after, [], [], []
        self.final: list[np.ndarray] = []

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.began.append(epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.ended.append([np.array(w) for w in self.model.get_weights()])
        self.logs.append(dict(logs or {}))
        if epoch + 1 == self.stop_after:
            self.model.stop_training = True

    def on_train_end(self, logs: dict | None = None) -> None:
        self.final = [np.array(w) for w in self.model.get_weights()]


class _Decay(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.model.optimizer.learning_rate = 0.05


def test_a_callback_of_the_users_own_sees_each_epochs_weights_and_stops_the_training_as_in_keras(tmp_path) -> None:
    """At each epoch's end the model holds that epoch's weights, those single-process Keras has there (and Keras's
    ModelCheckpoint saves them); a callback that sets ``model.stop_training`` ends the training after that epoch with
    its weights, as Keras's fit does. One that changes the learning rate (which the run's reducers never see) fails
    the fit naming it; one of batch hooks, or a Keras callback that changes the training, is refused before anything
    starts."""
    x, y, _, _ = _cancer()
    model, watch = _model(), _Watch(stop_after=2)
    saving = keras.callbacks.ModelCheckpoint(str(tmp_path / "epoch-{epoch}.keras"))  # Keras's default: each epoch
    best = keras.callbacks.ModelCheckpoint(tmp_path / "best.keras", monitor="accuracy", mode="max", save_best_only=True)
    history = slsml.fit(
        model, x, y, batch_size=BATCH, epochs=4, callbacks=[watch, saving, best], workers=2, reducers=1, verbose=0
    )
    assert history.epoch == [0, 1] and watch.began == [0, 1]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best.keras", "epoch-1.keras", "epoch-2.keras"]
    kept = int(np.argmax(history.history["accuracy"]))  # Keras's choice: the first epoch of the best accuracy
    for name, epoch in [("epoch-1.keras", 0), ("epoch-2.keras", 1), ("best.keras", kept)]:
        saved = keras.saving.load_model(tmp_path / name).get_weights()
        for got, seen in zip(saved, watch.ended[epoch], strict=True):
            np.testing.assert_array_equal(got, seen)
    assert watch.logs == [{name: values[e] for name, values in history.history.items()} for e in range(2)]
    reference, steps = _model(), math.ceil(len(x) / BATCH)
    for epoch in range(2):
        order = np.concatenate(
            [data.global_batch_indices(len(x), BATCH, 0, epoch * steps + i, 2) for i in range(steps)]
        )
        reference.fit(x[order], y[order], batch_size=BATCH, shuffle=False, epochs=1, verbose=0)
        for got, expected in zip(watch.ended[epoch], reference.get_weights(), strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    for final, seen, kept in zip(model.get_weights(), watch.final, watch.ended[-1], strict=True):
        np.testing.assert_array_equal(final, kept)
        np.testing.assert_array_equal(seen, kept)
    with pytest.raises(BadInputError, match=r"a callback changed the optimizer's learning rate \(0\.1 → 0\.05\)"):
        slsml.fit(_model(), x, y, batch_size=BATCH, epochs=2, callbacks=[_Decay()], workers=2, verbose=0)

    class Batched(_Watch):
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None: ...

    with pytest.raises(BadInputError, match=r"callback Batched defines on_train_batch_end: slsml\.fit tells"):
        slsml.fit(_model(), x, y, callbacks=[Batched(1)], verbose=0)
    with pytest.raises(BadInputError, match=r"callback ReduceLROnPlateau cannot run in slsml\.fit"):
        slsml.fit(_model(), x, y, callbacks=[keras.callbacks.ReduceLROnPlateau()], verbose=0)


def _normalized(x: np.ndarray) -> keras.Model:
    """``_model`` behind a Normalization adapted to ``x``: a weight of int64 (its sample count) that is not trained."""
    normalization = keras.layers.Normalization()
    normalization.adapt(x)
    model = _model()
    return keras.Sequential([keras.Input((30,)), normalization, *model.layers], name="normalized")


def test_a_batch_larger_than_the_samples_is_one_step_of_them_all_as_in_keras() -> None:
    """As Keras's fit: one step of all the samples an epoch; the model, behind an adapted Normalization (whose int64
    count a float32-only plan refused), ends at Keras's weights, the Normalization's as adapted."""
    x, y, _, _ = _cancer()
    raw = x * 3 + 1
    model = _normalized(raw)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy", metrics=["accuracy"])
    history = slsml.fit(model, raw, y, batch_size=1000, epochs=2, workers=2, reducers=1, verbose=0)
    assert history.params["steps"] == 1 and history.epoch == [0, 1]
    reference = _normalized(raw)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy", metrics=["accuracy"])
    fitted = reference.fit(raw, y, batch_size=1000, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], fitted.history["loss"], rtol=1e-4)
    for got, expected in zip(model.weights, reference.weights, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-4, atol=1e-5)


def test_a_generator_trains_with_its_batch_size_and_verbose_2_prints_one_line_per_epoch(capsys) -> None:
    x, y, x_val, y_val = _cancer()

    def batches():
        for start in range(0, len(x), 100):
            yield x[start : start + 100], y[start : start + 100]

    history = slsml.fit(_model(), batches(), epochs=2, validation_data=(x_val, y_val), workers=2, verbose=2)
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert history.epoch == [0, 1] and history.params["steps"] == math.ceil(len(x) / 100) == 5
    assert re.findall(r"Epoch (\d)/2", out) == ["1", "2"]
    assert len(re.findall(r"5/5 .*val_loss", out)) == 2 and "1/5" not in out
    assert len(history.history["val_loss"]) == 2


def test_what_fit_cannot_take_is_refused_in_one_line() -> None:
    x, y, _, _ = _cancer()
    endless = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
    with pytest.raises(BadInputError, match="repeats without end: give steps_per_epoch"):
        slsml.fit(_model(), endless, epochs=1, verbose=0)
    with pytest.raises(BadInputError, match="give no y or sample_weight"):
        slsml.fit(_model(), tf.data.Dataset.from_tensor_slices((x, y)), y, verbose=0)
    with pytest.raises(BadInputError, match="validation_split is for arrays"):
        slsml.fit(_model(), tf.data.Dataset.from_tensor_slices((x, y)).batch(8), validation_split=0.2, verbose=0)
    with pytest.raises(BadInputError, match=r"yields a tuple of 1: fit takes batches of \(x, y\)"):
        slsml.fit(_model(), iter([(x,)]), verbose=0)
    with pytest.raises(BadInputError, match="steps_per_epoch is for a dataset or generator"):
        slsml.fit(_model(), x, y, steps_per_epoch=3, verbose=0)


def test_fit_in_pipeline_stages_starts_a_process_for_each_stage_within_its_pool_and_equals_keras() -> None:
    """A worker's stages run at once: the runtime ``fit`` starts holds W×S Worker processes, as many as ``pool=``
    allows (a pool of one is refused, naming it); the History and weights are single-process Keras's."""
    x, y, _, _ = _cancer()

    def chain() -> keras.Model:  # two stages: one dense layer each
        initializers = [keras.initializers.GlorotUniform(seed=seed) for seed in (1, 2)]
        model = keras.Sequential(
            [
                keras.Input((30,)),
                keras.layers.Dense(8, "relu", kernel_initializer=initializers[0]),
                keras.layers.Dense(1, "sigmoid", kernel_initializer=initializers[1]),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
        return model

    options = {"batch_size": BATCH, "epochs": 1, "workers": 2, "reducers": 1, "pipeline_stages": 2, "verbose": 0}
    with pytest.raises(BadInputError, match="--pool"):
        slsml.fit(chain(), x, y, pool=1, **options)
    model = chain()
    history = slsml.fit(model, x, y, pool=4, **options)
    reference, steps = chain(), math.ceil(len(x) / BATCH)
    order = np.concatenate([data.global_batch_indices(len(x), BATCH, 0, i, 2) for i in range(steps)])
    fitted = reference.fit(x[order], y[order], batch_size=BATCH, shuffle=False, epochs=1, verbose=0)
    assert history.history["loss"][0] == pytest.approx(fitted.history["loss"][0], rel=1e-4)
    for got, expected in zip(model.weights, reference.weights, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-4, atol=1e-5)
