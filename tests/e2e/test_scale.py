"""A run far wider than the machine: 256 workers through the ``slsml`` command, served by a bounded
pool of warm processes (``--pool``), the messages beyond it waiting in their queue. One iteration decides it:
its 256 Work messages and 256 reports go through the queues of 2 processes each, its reduce waits for all 256
and its merge ends the run."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np

from slsml.client import demo
from slsml.spec.deployment import DEFAULT_FUNCTIONS
from slsml.training import modelio

from .conftest import log_entries
from .test_cli import slsml

WORKERS, POOL, ITERATIONS = 256, 2, 1


def test_256_workers_run_to_the_end_on_a_pool_of_warm_processes(tmp_path: Path) -> None:
    x, y, x_test, y_test = demo.digits()
    np.savez(tmp_path / "digits.npz", x=x, y=y, x_test=x_test, y_test=y_test)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    (tmp_path / "dense.keras").write_bytes(modelio.save_model(model))

    done = slsml(
        "run",
        "start",
        "--local",
        "--model",
        "dense.keras",
        "--data",
        "digits.npz",
        "--workers",
        str(WORKERS),
        "--reducers",
        "2",
        "--batch",
        str(WORKERS),
        "--iterations",
        str(ITERATIONS),
        "--eval-every",
        "0",
        "--deadline",
        "600",
        "--pool",
        str(POOL),
        "--run-id",
        "wide",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["status"], summary["iterations"], summary["workers"]) == ("COMPLETED", ITERATIONS, WORKERS)
    assert (summary["deadlines_fired"], summary["relaunched_workers"]) == (0, 0)  # every reduce had all 256
    started = log_entries(tmp_path / ".slsml" / "logs" / "wide" / "worker.log", message="warm process started")
    pids = {entry["pid"] for entry in started}
    assert 1 <= len(pids) <= POOL, pids  # these processes served all 256 workers
    assert {entry["function_memory_size"] for entry in started} == {DEFAULT_FUNCTIONS["worker"].memory_mb}
