"""``slsml.fit``'s History from a run's iterations, and the top package staying light."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from slsml.client.fit import epoch_history
from slsml.state.records import Counter


def test_each_epoch_has_the_figures_of_its_summed_train_states_and_the_validation_figures_at_its_end() -> None:
    # states: the loss's sum and samples, then a metric's correct and samples
    counters = [Counter(iteration=i, train_state=[float(i), 1.0, float(i % 2), 1.0]) for i in range(6)]
    counters[2] = counters[2].model_copy(update={"test": {"loss": 0.9, "auc": 0.7}})
    counters[5] = counters[5].model_copy(update={"test": {"loss": 0.4, "auc": 0.8}, "val": {"loss": 9.0}})
    counters.append(Counter(iteration=6))  # a third epoch's iteration whose state was not recorded: left out

    def train(states: list[np.ndarray]) -> dict[str, float]:
        total = np.sum(states, axis=0)
        return {"loss": total[0] / total[1], "accuracy": total[2] / total[3]}

    assert epoch_history(counters, 3, 3, "test", train) == {
        "loss": [1.0, 4.0],
        "accuracy": [1 / 3, 2 / 3],
        "val_loss": [0.9, 0.4],
        "val_auc": [0.7, 0.8],
    }
    assert epoch_history(counters, 3, 2, "val", train) == {
        "loss": [1.0, 4.0],
        "accuracy": [1 / 3, 2 / 3],
        "val_loss": [9.0],
    }


def test_the_top_package_imports_no_tensorflow_and_finds_fit_on_first_use() -> None:
    probe = (
        "import sys, slsml; assert not {'keras', 'tensorflow', 'slsml.client'} & set(sys.modules);"
        " fit = slsml.fit; assert fit.__module__ == 'slsml.client.fit'"
    )
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_fit_monitors_its_validation_data_as_the_runs_test_split_at_each_epochs_end() -> None:
    from slsml.client.fit import _spec

    validation = (np.zeros((10, 2)), np.zeros(10))
    spec = _spec(640, 64, 3, validation, None, {"early_stopping": "val_loss:2", "keep_best": "val_auc"})
    assert (spec.early_stopping, spec.keep_best, spec.eval_every) == ("test_loss:2", "test_auc", 10)
    held = _spec(640, 64, 3, None, 0.25, {"early_stopping": "val_loss:2"})
    assert (held.early_stopping, held.eval_every) == ("val_loss:2", 0)


def test_fits_keras_callbacks_become_the_runs_early_stopping_and_best_model() -> None:
    import keras
    import pytest

    from slsml.client.fit import callback_options
    from slsml.spec.errors import BadInputError

    stop = keras.callbacks.EarlyStopping(monitor="val_auc", patience=3, min_delta=0.01, restore_best_weights=True)
    assert callback_options([stop, keras.callbacks.History()]) == {
        "early_stopping": "val_auc:3:0.01",
        "keep_best": "val_auc",
    }
    best = keras.callbacks.ModelCheckpoint("best.keras", monitor="val_loss", save_best_only=True)
    assert callback_options([keras.callbacks.EarlyStopping(), best]) == {  # Keras's checkpoint saves the file
        "early_stopping": "val_loss:0:0",
    }
    with pytest.raises(BadInputError, match=r"^callback LearningRateScheduler cannot run in slsml\.fit"):
        callback_options([keras.callbacks.LearningRateScheduler(lambda epoch: 0.1)])
    with pytest.raises(BadInputError, match=r"^callback ModelCheckpoint cannot run"):
        callback_options([keras.callbacks.ModelCheckpoint("every.keras", save_freq=10)])  # every 10 batches
    assert callback_options([keras.callbacks.ModelCheckpoint("each-{epoch}.keras")]) == {}  # told each epoch's end
    with pytest.raises(BadInputError, match="with mode='max'"):
        callback_options([keras.callbacks.EarlyStopping(monitor="val_auc", mode="max")])
