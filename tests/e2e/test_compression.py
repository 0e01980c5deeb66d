"""Compressed updates through the pipeline (the demo CNN on digits, W=4, R=2): each compressor's run completes, its
update objects are smaller by about the expected factor (fp16 2×, topk:0.01 about 50×), and every worker slot
stores its residual each iteration (none without compression), in bfloat16: top-k's updates and residuals together
are smaller than dense updates."""

from __future__ import annotations

import numpy as np
import pytest

from slsml.accounting import usage
from slsml.client import demo
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, TrainingSpec

from .conftest import final_weights, finish, train

ITERATIONS, WORKERS = 4, 4
COMPRESSORS = {"none": "none", "fp16": "fp16", "topk": "topk:0.01", "significance": "significance:0.1"}
WARMUP = 2  # the top-k run of ``test_a_warmup_sends_dense_updates_then_compresses_with_its_residuals``


def _run_id(name: str) -> str:
    return f"compress-{name}"


@pytest.fixture(scope="module")
def finished(services, digits):
    for name, compress in COMPRESSORS.items():
        spec = TrainingSpec(
            workers=WORKERS,
            reducers=2,
            global_batch=128,
            iterations=ITERATIONS,
            eval_every=0,
            optimizer=OptimizerConfig(name="adam", learning_rate=0.003),
            compress=compress,
            # each encoding from the first iteration (the default warm-up of a sparse one with Adam is an epoch)
            compress_warmup=0 if name in ("topk", "significance") else None,
        )
        train(services, spec, _run_id(name))
    warm = spec.model_copy(update={"compress": "topk:0.01", "compress_warmup": WARMUP})
    train(services, warm, _run_id("warm"))
    return {name: finish(services, _run_id(name)) for name in (*COMPRESSORS, "warm")}


def _sizes(services, run_id: str, folder: str) -> dict[str, int]:
    """The objects of ``iters/<i>/<folder>/`` of the run, by key, with their bytes."""
    pages = services.store.s3.get_paginator("list_objects_v2").paginate(
        Bucket=services.store.bucket, Prefix=f"{keys.run_prefix(run_id)}iters/"
    )
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", []) if f"/{folder}/" in o["Key"]}


def test_every_compressor_completes_and_shrinks_the_updates(finished, services):
    initial = np.concatenate([np.asarray(w).ravel() for w in demo.digits_cnn(seed=1).get_weights()])
    sizes = {}
    for name, run in finished.items():
        if name not in COMPRESSORS:
            continue
        assert run.status == "COMPLETED", f"{name}: {run.reason}"
        weights, _ = final_weights(services, _run_id(name))
        assert np.isfinite(weights).all() and not np.array_equal(weights, initial), name
        found = _sizes(services, _run_id(name), "updates")
        assert len(found) == ITERATIONS * WORKERS, name
        sizes[name] = float(np.mean(list(found.values())))
    dense = sizes["none"]
    assert dense == 32 + 4 * initial.size  # the dense float32 format, unchanged
    ratios = {name: dense / size for name, size in sizes.items()}
    print(
        "\nupdate object bytes (ratio to dense): "
        + ", ".join(f"{COMPRESSORS[n]} {sizes[n]:.0f} ({ratios[n]:.1f}×)" for n in COMPRESSORS)
    )
    assert 1.99 < ratios["fp16"] <= 2.0
    assert 45 < ratios["topk"] < 51  # 8 bytes per pair: 1 / (2·0.01), less the header
    assert ratios["significance"] > 2


def _residuals(local, services, run_id: str) -> dict[tuple[int, int], int]:
    """(iteration, worker) → the bytes a worker stored beside its update: its residual. The pipeline deletes
    residuals once superseded (and the last ones with the completed run), so they are read off the workers'
    usage lines, less the update objects' bytes."""
    assert local.host.wait_idle(run_id, timeout_s=60)
    updates = _sizes(services, run_id, "updates")
    return {
        (r.iteration, r.worker): r.bytes_written - updates[keys.update(run_id, r.iteration, r.worker)]
        for r in usage.read_local(local.log_dir, run_id)
        if r.function == "worker" and r.iteration is not None and r.iteration < ITERATIONS
    }


def test_each_worker_slot_stores_its_residual_each_iteration(finished, local, services):
    weights = sum(np.asarray(w).size for w in demo.digits_cnn(seed=1).get_weights())
    slots = [(i, w) for i in range(ITERATIONS) for w in range(WORKERS)]
    assert _residuals(local, services, _run_id("none")) == dict.fromkeys(slots, 0)
    for name in ("fp16", "topk", "significance"):
        assert _residuals(local, services, _run_id(name)) == dict.fromkeys(slots, 2 * weights), name  # bfloat16
        assert not _sizes(services, _run_id(name), "residuals"), name  # none outlives its completed run
    dense = sum(_sizes(services, _run_id("none"), "updates").values())
    topk = sum(_sizes(services, _run_id("topk"), "updates").values()) + len(slots) * 2 * weights
    assert topk < 0.6 * dense  # top-k's updates and residuals together, against dense updates


def test_a_warmup_sends_dense_updates_then_compresses_with_its_residuals(finished, local, services):
    """Adam with top-k and compress_warmup 2: iterations 0 and 1 send dense updates and keep no residual, 2 and 3
    send top-k's pairs and store a residual each, the first of them starting from zeros."""
    run = finished["warm"]
    assert run.status == "COMPLETED", run.reason
    weights = sum(np.asarray(w).size for w in demo.digits_cnn(seed=1).get_weights())
    sizes = _sizes(services, _run_id("warm"), "updates")
    by_iteration = {i: {sizes[keys.update(_run_id("warm"), i, w)] for w in range(WORKERS)} for i in range(ITERATIONS)}
    dense = {32 + 4 * weights}
    assert [by_iteration[i] == dense for i in range(ITERATIONS)] == [i < WARMUP for i in range(ITERATIONS)]
    assert all(max(by_iteration[i]) < 0.05 * min(dense) for i in range(WARMUP, ITERATIONS))
    residuals = _residuals(local, services, _run_id("warm"))
    assert residuals == {(i, w): 0 if i < WARMUP else 2 * weights for i in range(ITERATIONS) for w in range(WORKERS)}
