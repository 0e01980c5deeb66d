"""A hyperparameter search on `slsml local up`, as a user runs one: scikit-learn's breast cancer data, a build
function over the learning rate (log scale) and a layer's width. From Python, eight trials four at a time end
completed or pruned, the best model's val_auc is Keras's evaluate of it, and the search takes well under the sum of
its trials' times; with a budget below all trials' price it starts fewer and says why; from the command line, Ctrl-C
leaves no run running and --resume finishes the search without running a finished trial again."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from slsml import tune
from slsml.cli.tune import load_build
from slsml.cost import budget
from slsml.data import datasets as data
from slsml.local import service
from slsml.pipeline import launch
from slsml.search import space
from slsml.spec.config import TrainingSpec
from slsml.state.records import RunStatus
from slsml.training import modelio

from .service import SLSML, last_json, local_service, service_table, slsml

BUILD = """
import keras


def build_model(hp):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((30,)),
        keras.layers.Dense(hp.Int("units", 2, 32, step=2), activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ])
    rate = hp.Float("learning_rate", 1e-4, 1e-1, sampling="log")
    model.compile(optimizer=keras.optimizers.Adam(rate), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(name="auc")])
    return model
"""
BATCH = 213  # two iterations an epoch of the 427 training samples


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder with the build function and the data (``cancer.npz``, also stored as dataset ``cancer``), where
    `slsml local up` runs for the module."""
    from sklearn.datasets import load_breast_cancer

    folder = tmp_path_factory.mktemp("tune")
    (folder / "model.py").write_text(BUILD)
    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    x, y, x_val, y_val = data.split_train_test(x, y.astype(np.int64), 0.25, seed=0)
    np.savez(folder / "cancer.npz", x=x, y=y, x_test=x_val, y_test=y_val)
    with local_service(folder, "--pool", "4"):
        put = slsml(folder, "data", "put", "cancer", "cancer.npz", "--json")
        assert put.returncode == 0, put.stderr
        yield folder


@pytest.fixture
def cancer(home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, ...]:
    """The data as arrays, in the service's folder: ``slsml.tune`` runs on the service that is up there."""
    monkeypatch.chdir(home)
    arrays = np.load(home / "cancer.npz")
    return arrays["x"], arrays["y"], arrays["x_test"], arrays["y_test"]


def test_trials_run_in_parallel_the_weak_stop_early_and_the_best_model_is_the_best_trials(
    home: Path, cancer: tuple[np.ndarray, ...]
) -> None:
    x, y, x_val, y_val = cancer
    result = tune(
        load_build(f"{home / 'model.py'}:build_model"),
        x,
        y,
        validation_data=(x_val, y_val),
        max_trials=8,
        parallel=4,
        epochs=6,
        batch_size=BATCH,
        objective="val_auc",
        workers=1,
        name="cancer-search",
        verbose=0,
    )
    statuses = [t.status.value for t in result.trials]
    assert len(statuses) == 8 and set(statuses) <= {"completed", "pruned"}, [t.reason for t in result.trials]
    assert "pruned" in statuses and "completed" in statuses
    evaluated = result.best_model.evaluate(x_val, y_val, return_dict=True, verbose=0)
    assert evaluated["auc"] == pytest.approx(result.best_value, abs=1e-3)
    best = result.best_trial  # the trial, as KerasTuner's oracle gives it
    assert best is not None and best.score == result.best_value
    assert sorted(t.number for t in result.trials) == list(range(1, 9))  # counted from 1, as their runs are
    assert result.best_hyperparameters == best.hyperparameters and set(best.hyperparameters) == {
        "units",
        "learning_rate",
    }
    assert result.wall_s < 0.6 * sum(t.wall_s for t in result.trials)
    _, services = service.connect()
    for trial in result.trials:  # each trial a run of its own, a pruned one stopped as `run stop` stops it
        run = services.table.get_run(trial.run_id)
        assert trial.run_id == f"cancer-search-t{trial.number}"
        assert run.status == (RunStatus.COMPLETED if trial.status == "completed" else RunStatus.STOPPED)
        assert trial.cost_usd and trial.cost_usd > 0
        epochs = len(trial.history["val_auc"])
        assert epochs == 6 if trial.status == "completed" else 1 <= epochs < 6
        assert trial.value == (
            max(trial.history["val_auc"]) if trial.status == "completed" else trial.history["val_auc"][-1]
        )


def test_a_budget_below_all_trials_price_starts_fewer_and_says_why(home: Path, cancer: tuple[np.ndarray, ...]) -> None:
    x, y, x_val, y_val = cancer
    build = load_build(f"{home / 'model.py'}:build_model")
    _, services = service.connect()
    manifest = data.load_manifest(services.store, "cancer")
    spec = TrainingSpec(workers=1, reducers=1, global_batch=BATCH, epochs=1, keep_best="test_auc")
    model = modelio.save_model(space.build(build, space.hyperparameters()))
    price = budget.predict(model, manifest, launch.with_epochs(spec, manifest.train.count), services.limits)
    allowed = 1.5 * price
    result = tune(  # 10 trials, 2 at once: the search's own, as `slsml tune`'s (left out, as KerasTuner's search)
        build,
        x,
        y,
        validation_data=(x_val, y_val),
        epochs=1,
        batch_size=BATCH,
        objective="val_auc",
        workers=1,
        budget_usd=allowed,
        name="cancer-budget",
        verbose=0,
    )
    assert 1 <= len(result.trials) < 10
    assert result.stopped_starting is not None and "budget" in result.stopped_starting
    for trial in result.trials:  # priced at the mean cost of the trials completed before it started, else by the plan
        before = [t.cost_usd for t in result.trials if t.status == "completed" and t.ended_at < trial.started_at]
        assert trial.predicted_usd == pytest.approx(sum(before) / len(before)) if before else trial.predicted_usd
    most = max(t.predicted_usd or 0.0 for t in result.trials)
    assert most > 0 and result.spent_usd is not None
    assert result.spent_usd <= allowed + most


def _lines(stream: Iterator[str]) -> queue.Queue[str]:
    """The lines of ``stream`` as they come, read by a thread of their own (``""`` at its end)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_ctrl_c_stops_every_trial_and_resume_finishes_the_search_without_running_a_finished_trial_again(
    home: Path,
) -> None:
    command = [
        *SLSML,
        "tune",
        "--build",
        "model.py:build_model",
        "--data",
        "cancer",
        "--max-trials",
        "4",
        "--parallel",
        "2",
        "--epochs",
        "3",
        "--batch-size",
        str(BATCH),
        "--objective",
        "val_auc",
        "--workers",
        "1",
        "--name",
        "cut",
    ]
    search = subprocess.Popen(
        command,
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    said, lines = [], _lines(search.stderr)
    deadline = time.monotonic() + 400
    while not any(line.startswith("Trial ") for line in said):
        line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
        assert line, "".join(said)
        said.append(line)
    ended_before = {int(line.split()[1]) for line in said if line.startswith("Trial ")}
    os.killpg(search.pid, signal.SIGINT)  # as a terminal's Ctrl-C reaches the command's process group
    search.wait(timeout=60)
    assert search.stdout is not None
    out = search.stdout.read()  # stderr is read by its thread alone: a second reader would take lines from it
    while (line := lines.get(timeout=10)) != "":
        said.append(line)
    assert search.returncode == 130, "".join(said)
    # said as the trials were stopped, before they were recorded: which, and how to resume
    hint = next(line for line in said if line.startswith("interrupted: search cut stopped"))
    assert "`slsml tune --resume cut`" in hint
    listed = re.search(r"\(([\d, ]+)\)", hint)
    stopped = {int(n) for n in listed.group(1).split(", ")} if listed else set()
    assert "search cut" in out  # the table of what it had
    table = service_table(home)
    started = [run for run in table.list_runs() if run.run_id.startswith("cut-t")]
    assert started and all(run.status != RunStatus.RUNNING for run in started)

    resumed = last_json(slsml(home, "tune", "--resume", "cut", "--json", "--report", "report"))
    trials = {t["number"]: t for t in resumed["trials"]}
    assert len(trials) == 4 and {t["status"] for t in trials.values()} <= {"completed", "pruned"}
    assert ended_before <= set(trials)
    ran = {run.run_id for run in table.list_runs() if run.run_id.startswith("cut-t")}
    # one run per trial: those that had ended were not run again, the interrupted ones' runs stay stopped
    assert ran == {t["run_id"] for t in [*trials.values(), *resumed["interrupted"]]}
    tried = [t["hyperparameters"] for t in trials.values()]
    assert stopped == {t["number"] for t in resumed["interrupted"]}
    for interrupted in resumed["interrupted"]:  # stopped by Ctrl-C, their hyperparameters tried again
        run = table.get_run(interrupted["run_id"])
        assert run.status == RunStatus.STOPPED, run.reason
        assert interrupted["hyperparameters"] in tried
    page = (home / "report" / "index.html").read_text()
    assert all(t["run_id"] in page for t in trials.values())
    assert resumed["best_hyperparameters"] == trials[resumed["best_trial"]["number"]]["hyperparameters"]


def test_each_trial_is_compiled_with_the_loss_optimizer_metrics_and_loss_weights_given_as_fit_takes_them(
    home: Path, cancer: tuple[np.ndarray, ...]
) -> None:
    """A build function that compiles with SGD and no metric, searched with ``compile``'s arguments given to
    ``tune`` as ``slsml.fit`` takes them: an optimizer instance, a metric object, a loss and its weight."""
    import json

    import keras

    from slsml.pipeline.services import run_config

    def plain(hp):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(hp.Int("units", 2, 4)),
                                  keras.layers.Dense(1, activation="sigmoid")])  # fmt: skip
        model.compile(optimizer="sgd", loss="mse")
        return model

    x, y, x_val, y_val = cancer
    result = tune(
        plain,
        x,
        y,
        validation_data=(x_val, y_val),
        max_trials=1,
        epochs=1,
        batch_size=BATCH,
        objective="val_auc",  # computed by the metric given here only
        workers=1,
        name="cancer-compiled",
        verbose=0,
        optimizer=keras.optimizers.Adam(0.02),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc")],
        loss_weights=[2.0],
    )
    (trial,) = result.trials
    assert trial.status == "completed", trial.reason
    _, services = service.connect()
    config = run_config(services, trial.run_id)
    assert (config.optimizer.name, config.optimizer.learning_rate) == ("adam", pytest.approx(0.02))
    loss = json.loads(config.loss)
    assert loss["loss_weights"] in ([2.0], {"dense_1": 2.0}) and "binary_crossentropy" in json.dumps(loss["loss"])
    evaluated = result.best_model.evaluate(x_val, y_val, return_dict=True, verbose=0)
    assert evaluated["auc"] == pytest.approx(trial.history["val_auc"][-1], abs=1e-3)
    with pytest.raises(TypeError, match=r"tune\(\) got an unexpected keyword argument 'metric'.*'metrics'"):
        tune(plain, x, y, validation_data=(x_val, y_val), metric=["auc"], name="cancer-misspelt")


def test_a_build_function_whose_model_carries_code_of_its_own_is_refused_before_anything_is_stored(
    home: Path, cancer: tuple[np.ndarray, ...]
) -> None:
    """slsml's functions load a model as Keras's safe mode does: a Lambda of Python code is refused in one line by the
    search itself, as by ``slsml.fit``, rather than failing every trial on the workers."""
    import keras

    from slsml.search import records
    from slsml.spec.errors import BadInputError

    def doubling(hp):
        model = keras.Sequential([keras.Input((30,)), keras.layers.Lambda(lambda t: t * 2),
                                  keras.layers.Dense(hp.Int("units", 1, 2), activation="sigmoid")])  # fmt: skip
        model.compile(optimizer="adam", loss="binary_crossentropy")
        return model

    x, y, x_val, y_val = cancer
    with pytest.raises(BadInputError, match=r"^the model carries code of its own.*a Lambda"):
        tune(doubling, x, y, validation_data=(x_val, y_val), name="cancer-lambda", verbose=0)
    _, services = service.connect()
    assert records.load_settings(services.store, "cancer-lambda") is None  # nothing stored
