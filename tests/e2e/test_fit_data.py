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
