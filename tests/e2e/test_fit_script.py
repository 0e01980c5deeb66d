"""``slsml.fit`` from a plain script (no ``if __name__ == "__main__":`` guard): the History ``model.fit``
returns, the model trained in place, and nothing of its local runtime left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.processes import left_running

SCRIPT = """
import json

import keras
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

import slsml

x, y = load_breast_cancer(return_X_y=True)
x = ((x - x.mean(0)) / x.std(0)).astype("float32")
x, x_val, y, y_val = train_test_split(x, y, test_size=0.25, random_state=0)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy",
              metrics=[keras.metrics.AUC(name="auc"), "accuracy"])
before = model.evaluate(x_val, y_val, return_dict=True, verbose=0)
history = slsml.fit(model, x, y, batch_size=64, epochs=4, validation_data=(x_val, y_val), workers=2, reducers=1,
                    verbose=0)
after = model.evaluate(x_val, y_val, return_dict=True, verbose=0)
print(json.dumps({"history": history.history, "epoch": history.epoch, "type": type(history).__name__,
                  "before": before, "after": after, "steps": history.params["steps"],
                  "optimizer_iterations": int(model.optimizer.iterations)}))
"""


def test_fit_from_a_plain_script_returns_a_history_and_trains_the_model_in_place(tmp_path: Path) -> None:
    (tmp_path / "fit_cancer.py").write_text(SCRIPT)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = subprocess.Popen(
        [sys.executable, "fit_cancer.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        start_new_session=True,
    )
    out, err = script.communicate(timeout=900)
    assert script.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    history = result["history"]
    assert result["type"] == "History" and result["epoch"] == [0, 1, 2, 3]
    assert {name: len(values) for name, values in history.items()} == dict.fromkeys(
        ["loss", "accuracy", "auc", "val_loss", "val_auc", "val_accuracy"], 4
    )
    assert history["loss"][-1] < history["loss"][0]
    for name in ("auc", "loss", "accuracy"):  # the model holds the final weights, evaluated at the last epoch's end
        assert abs(result["after"][name] - history[f"val_{name}"][-1]) < 1e-3, name
    assert result["after"]["loss"] < result["before"]["loss"]
    assert result["optimizer_iterations"] == 4 * result["steps"] > 0  # the optimizer's state, as fit leaves it
    assert left_running(script.pid) == []  # the cloud, the fork server and the warm processes ended with it
