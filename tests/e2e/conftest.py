"""One embedded cloud with warm function processes for the whole end-to-end session."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Collection
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slsml.client import demo, runs
from slsml.data import datasets as data
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.pipeline.services import Services
from slsml.spec import keys
from slsml.spec.config import RunConfig, TrainingSpec
from slsml.spec.deployment import STAGE_FUNCTIONS
from slsml.spec.limits import RunLimits
from slsml.state.runtable import RunRecord
from slsml.training import modelio

DIGITS = "digits"


@pytest.fixture(scope="session")
def local(tmp_path_factory: pytest.TempPathFactory) -> LocalRuntime:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with LocalRuntime(workers=4, reducers=3, log_dir=tmp_path_factory.mktemp("logs")) as runtime:
        yield runtime


@pytest.fixture(scope="session")
def services(local: LocalRuntime) -> Services:
    return local.services


@pytest.fixture(scope="session")
def digits(services: Services) -> tuple[np.ndarray, ...]:
    arrays = demo.digits()
    data.put_dataset(services.store, DIGITS, *arrays)
    return arrays


@pytest.fixture(scope="session")
def warm(services: Services, digits: tuple[np.ndarray, ...]) -> None:
    """The warm processes have trained the digits CNN: a test whose Worker and Reducer time out after seconds
    (``timeouts``) then sees no first step of a process, which loads the model and traces its functions."""
    spec = TrainingSpec(workers=4, reducers=2, global_batch=128, iterations=4, eval_every=0)
    trained_clean(services, spec, "warm-up")


def timeouts(local: LocalRuntime, seconds: int) -> AbstractContextManager[LocalRuntime]:
    """For the block, a deployment whose Worker and Reducer time out after ``seconds``: runs with deadlines as
    short as that may start, and their steps are ended there, as Lambda would end them (see ``warm``)."""
    return local.limited(RunLimits(function_timeouts_s=dict.fromkeys(STAGE_FUNCTIONS, seconds)))


def log_entries(path: Path, **fields: Any) -> list[dict[str, Any]]:
    """The JSON (Powertools) entries of a function's log whose fields have these values."""
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
    return [e for e in entries if all(e.get(k) == v for k, v in fields.items())]


def train(services: Services, spec: TrainingSpec, run_id: str, model_bytes: bytes | None = None) -> None:
    """Start a run on the digits data (without waiting)."""
    model_bytes = model_bytes or modelio.save_model(demo.digits_cnn(seed=1))
    launch.start_run(services, model_bytes, DIGITS, spec, run_id=run_id)


def finish(services: Services, run_id: str, timeout_s: float = 300) -> RunRecord:
    """The run once it ended, read every 0.1 s: a test goes on as soon as its run is done."""
    return runs.wait_for_run(services, run_id, timeout_s=timeout_s, poll_s=0.1)


def final_weights(services: Services, run_id: str) -> np.ndarray:
    """The weights of the run's final model, read from the .keras file a user would get."""
    run = services.table.get_run(run_id)
    model = modelio.load_model(services.store.get(keys.final_model(run_id)))
    return np.concatenate([np.asarray(w).ravel() for w in model.get_weights()]), run


def prepared_with_source(services: Services, spec: TrainingSpec, run_id: str, source: bytes) -> RunConfig:
    """Run ``run_id`` as ``launch.prepare_run`` leaves it, but for its ``source.keras``: ``source``, which slsml never
    stores (prepare_run checks what it is given; the bucket's policy refuses an overwrite, and a delete under runs/,
    to all but the pipeline): a run prepared beside it lends its run.json and initial shards, under ``run_id``, naming
    ``source`` by its SHA-256 as a run's start names its model."""
    lent = launch.prepare_run(services, modelio.save_model(demo.digits_cnn()), DIGITS, spec, run_id=f"{run_id}-lent")
    config = lent.model_copy(update={"run_id": run_id, "source_sha256": hashlib.sha256(source).hexdigest()})
    services.store.put_new(keys.run_config(run_id), config.stored())
    for shard in range(config.reducers):
        services.store.put_new(keys.shard(run_id, 0, shard), services.store.get(keys.shard(lent.run_id, 0, shard)))
    services.store.put_new(keys.source_model(run_id), source)
    return config


def trained_clean(services: Services, spec: TrainingSpec, run_id: str) -> np.ndarray:
    """The final weights of run ``run_id`` of ``spec`` on the digits data, trained without faults to COMPLETED."""
    train(services, spec, run_id)
    run = finish(services, run_id)
    assert run.status == "COMPLETED", run.reason
    return final_weights(services, run_id)[0]


def dead_letters(local: LocalRuntime, bodies: Collection[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """The dead letters of the messages ``bodies`` by body, once all are in or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    letters: dict[str, dict[str, Any]] = {}
    while len(letters) < len(bodies) and time.monotonic() < deadline:
        letters = {d["message"]: d for d in local.host.dead_letters if d["message"] in bodies}
        time.sleep(0.5)
    return letters
