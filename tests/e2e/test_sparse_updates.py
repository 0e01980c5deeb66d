"""Exact sparse updates through the pipeline: a small Criteo-like workload (logistic regression on 2^20 hashed
buckets, ``slsml.bench.workloads``) trained with dense updates and with ``compress sparse`` (W=4, R=2, Adam) both
complete, at the same final weights and test loss, bit for bit, and the sparse run's update objects are at most a
tenth of the dense run's. Fully asynchronous training (ASP) takes them too: with one worker its updates apply one
by one, so its dense and sparse runs end bit for bit alike, and with four its sparse update objects are as small."""

from __future__ import annotations

import numpy as np
import pytest

from slsml.bench.workloads import BUCKETS, Workload
from slsml.pipeline import launch
from slsml.spec import keys
from slsml.spec.config import TrainingSpec

from .conftest import final_weights, finish

DATASET, ITERATIONS, WORKERS = "criteo-small", 4, 4


@pytest.fixture(scope="module")
def finished(services):
    workload = Workload("criteo", seed=4)
    workload.put(services.store, DATASET, samples=4096, test_samples=1024)
    model = workload.model()
    spec = TrainingSpec(workers=WORKERS, reducers=2, global_batch=256, iterations=ITERATIONS, eval_every=0)
    for compress in ("none", "sparse"):
        launch.start_run(services, model, DATASET, spec.model_copy(update={"compress": compress}), run_id=_id(compress))
    return {compress: finish(services, _id(compress)) for compress in ("none", "sparse")}


def _id(compress: str) -> str:
    return f"sparse-criteo-{compress}"


@pytest.fixture(scope="module")
def asynchronous(services, finished):
    """ASP runs on the same data: one worker dense and sparse, four workers sparse (each as many updates as the
    synchronous runs' workers sent)."""
    model = services.store.get(keys.source_model(_id("none")))
    runs = {
        "asp-1-none": TrainingSpec(workers=1, global_batch=64, compress="none"),
        "asp-1-sparse": TrainingSpec(workers=1, global_batch=64, compress="sparse"),
        "asp-4-sparse": TrainingSpec(workers=WORKERS, global_batch=256, compress="sparse"),
    }
    for name, spec in runs.items():
        options = {"reducers": 2, "iterations": ITERATIONS * WORKERS, "eval_every": 0, "staleness": "unbounded"}
        launch.start_run(services, model, DATASET, spec.model_copy(update=options), run_id=f"sparse-criteo-{name}")
    return {name: finish(services, f"sparse-criteo-{name}") for name in runs}


def _update_bytes(services, run_id: str) -> list[int]:
    pages = services.store.s3.get_paginator("list_objects_v2").paginate(
        Bucket=services.store.bucket, Prefix=f"{keys.run_prefix(run_id)}iters/"
    )
    return [o["Size"] for page in pages for o in page.get("Contents", []) if "/updates/" in o["Key"]]


def test_sparse_updates_train_as_dense_ones_at_a_tenth_of_the_bytes(finished, services):
    for compress, run in finished.items():
        assert run.status == "COMPLETED", f"{compress}: {run.reason}"
    (dense, dense_run), (sparse, sparse_run) = (final_weights(services, _id(c)) for c in ("none", "sparse"))
    assert dense.size == BUCKETS + 2 and np.isfinite(dense).all()
    assert np.array_equal(sparse, dense)  # exact
    assert sparse_run.test_loss is not None and sparse_run.test_loss == dense_run.test_loss
    dense_bytes, sparse_bytes = _update_bytes(services, _id("none")), _update_bytes(services, _id("sparse"))
    assert len(dense_bytes) == len(sparse_bytes) == ITERATIONS * WORKERS
    print(f"\na worker's update object: dense {np.mean(dense_bytes):,.0f}, sparse {np.mean(sparse_bytes):,.0f}")
    assert max(sparse_bytes) <= 0.1 * min(dense_bytes)


def test_asp_takes_exact_sparse_updates_at_a_tenth_of_the_bytes(asynchronous, services):
    for name, run in asynchronous.items():
        assert run.status == "COMPLETED", f"{name}: {run.reason}"
    (dense, dense_run), (sparse, sparse_run) = (
        final_weights(services, f"sparse-criteo-asp-1-{c}") for c in ("none", "sparse")
    )
    assert np.isfinite(dense).all() and np.array_equal(sparse, dense)  # one update a version: exact
    assert sparse_run.test_loss is not None and sparse_run.test_loss == dense_run.test_loss
    dense_bytes = _update_bytes(services, "sparse-criteo-asp-1-none")
    assert len(dense_bytes) == len(_update_bytes(services, "sparse-criteo-asp-1-sparse")) == ITERATIONS * WORKERS
    four = _update_bytes(services, "sparse-criteo-asp-4-sparse")
    assert len(four) == ITERATIONS * WORKERS  # every update once, whatever the versions grouped
    assert max(four) <= 0.1 * min(_update_bytes(services, _id("none")))
