"""Early stopping and keeping the best model decide as Keras's EarlyStopping and ModelCheckpoint(save_best_only)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from pydantic import ValidationError

from slsml.spec.config import TrainingSpec
from slsml.training import evaluation, stopping

SERIES = {
    "falls then stalls": [0.9, 0.7, 0.65, 0.651, 0.66, 0.64, 0.7],
    "noisy": [0.5, 0.52, 0.49, 0.495, 0.48, 0.6, 0.61, 0.62],
    "flat": [0.3] * 6,
    "improves": [5.0, 4.0, 3.0, 2.0],
}


def keras_early_stopping(values: list[float], mode: str, patience: int, min_delta: float) -> tuple[int | None, int]:
    """Keras's EarlyStopping fed ``values`` as val_x: the epoch it stops after (None: never) and its best epoch."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    callback = keras.callbacks.EarlyStopping(monitor="val_x", mode=mode, patience=patience, min_delta=min_delta)
    callback.set_model(model)
    callback.on_train_begin()
    model.stop_training = False
    for epoch, value in enumerate(values):
        callback.on_epoch_end(epoch, {"val_x": value})
        if model.stop_training:
            return epoch, callback.best_epoch
    return None, callback.best_epoch


@pytest.mark.parametrize("series", list(SERIES))
@pytest.mark.parametrize(
    ("mode", "patience", "min_delta"),
    [("min", 0, 0.0), ("min", 1, 0.0), ("min", 2, 0.005), ("max", 1, 0.0), ("max", 3, 0.01)],
)
def test_stops_where_keras_early_stopping_stops(series: str, mode: str, patience: int, min_delta: float) -> None:
    values = SERIES[series]
    expected, _ = keras_early_stopping(values, mode, patience, min_delta)
    assert stopping.stopped_at(values, mode, patience, min_delta) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("series", list(SERIES))
@pytest.mark.parametrize("mode", ["min", "max"])
def test_keeps_the_model_keras_keeps_as_best(series: str, mode: str) -> None:
    values = SERIES[series]
    _, expected = keras_early_stopping(values, mode, patience=len(values), min_delta=0.0)
    assert stopping.best_at(values, mode) == expected  # type: ignore[arg-type]


def test_the_cases_stop_at_different_epochs() -> None:
    found = {stopping.stopped_at(v, "min", p, 0.0) for v in SERIES.values() for p in (0, 1, 2)}
    assert len(found) > 3


def test_each_figure_improves_the_way_keras_decides() -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    metrics = evaluation.encode_metrics([keras.metrics.AUC(name="auc"), "accuracy", keras.metrics.MeanAbsoluteError()])
    x, y = np.zeros((2, 3), np.float32), np.array([0, 1])
    modes = evaluation.figure_modes(model, '"binary_crossentropy"', metrics, (x, y))
    assert modes == {"loss": "min", "auc": "max", "accuracy": "max", "mean_absolute_error": "min"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"early_stopping": "val_loss:x"}, r"is not MONITOR\[:PATIENCE\[:MIN_DELTA\]\]"),
        ({"early_stopping": "val_loss:1:-2"}, r"is not MONITOR\[:PATIENCE\[:MIN_DELTA\]\]"),
        ({"early_stopping": "loss:1", "validation_split": 0.2}, "'loss' is not a figure of an evaluation"),
        ({"early_stopping": "val_loss"}, "val_loss is evaluated on a validation split: give validation_split"),
        ({"keep_best": "test_auc", "eval_every": 0}, "test_auc is evaluated every eval_every iterations"),
    ],
)
def test_a_monitor_no_evaluation_gives_is_refused_by_name(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainingSpec(**fields)
    assert TrainingSpec(early_stopping="val_auc:3:0.01", validation_split=0.2).stopping == ("val_auc", 3, 0.01)
