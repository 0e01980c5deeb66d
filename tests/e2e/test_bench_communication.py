"""The communication benchmark, in miniature (3 iterations per compressor, 4 workers): its byte figures are those of
the objects in S3 and of the functions' usage lines, and its update objects have the sizes of their encodings."""

from __future__ import annotations

import numpy as np
import pytest

from slsml import rules
from slsml.accounting import usage
from slsml.bench import communication as bench_communication
from slsml.client import demo
from slsml.spec import keys
from slsml.spec.config import RunConfig
from slsml.spec.shardplan import ShardPlan
from slsml.training import modelio, optimizers, shards, updates

ITERATIONS, WORKERS = 3, 4


def _listed(services, run_id: str, folder: str) -> dict[str, int]:
    """The run's objects of ``iters/<i>/<folder>/``, by key, with their bytes."""
    pages = services.store.s3.get_paginator("list_objects_v2").paginate(
        Bucket=services.store.bucket, Prefix=f"{keys.run_prefix(run_id)}iters/"
    )
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", []) if f"/{folder}/" in o["Key"]}


def _shard_bytes(config: RunConfig, averaged: list[int]) -> int:
    """The bytes of a run's shard objects whose average took the workers ``averaged`` (the initial ones: none)."""
    server, plan = rules.server_optimizer(config), config.plan
    return sum(
        len(
            shards.encode(
                shards.Shard(
                    np.zeros(plan.shard(r).size, np.float32),
                    optimizers.initial_state(server, int(plan.shard(r).trainable.sum())),
                    averaged,
                )
            )
        )
        for r in range(plan.reducers)
    )


def _of_iterations(listed: dict[str, int], last: int) -> int:
    return sum(size for key, size in listed.items() if int(key.split("/iters/")[1][:6]) <= last)


@pytest.fixture(scope="module")
def report(local, digits):
    progress: dict[str, int] = {}
    # every model reaches a test accuracy of 0: the figures "to the target" are those of iteration 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench_communication, "ACCURACY_TARGET", 0.0)
        made = bench_communication.communication(
            local, ITERATIONS, workers=WORKERS, progress=lambda name, done, total: progress.__setitem__(name, total)
        )
    assert progress == dict.fromkeys(("dense", "fp16", "topk", "significance"), ITERATIONS)
    return made


def test_the_byte_figures_are_those_of_the_objects_in_s3(report, local, services):
    print(report.model_dump_json(indent=1, exclude={"variants": {"__all__": {"spec"}}}))
    model = demo.digits_cnn()
    plan = ShardPlan.build(modelio.variable_specs(model), bench_communication.REDUCERS)
    weights = sum(np.asarray(w).size for w in model.get_weights())
    top_k = updates.part_size(plan, 0, updates.Compression.parse("topk:0.01")) + updates.part_size(
        plan, 1, updates.Compression.parse("topk:0.01")
    )
    expected_update = {"dense": 32 + 4 * weights, "fp16": 32 + 2 * weights, "topk": 32 + top_k}
    for v in report.variants:
        run_id = v.run_id
        assert v.iterations == ITERATIONS and v.spec.workers == WORKERS and v.final_accuracy is not None
        assert len(v.accuracy_by_iteration) == ITERATIONS and all(a is not None for a in v.accuracy_by_iteration)
        listed = _listed(services, run_id, "updates")
        evaluations = _listed(services, run_id, "evaluation")
        assert not _listed(services, run_id, "residuals"), v.name  # deleted once superseded, the last at the end
        assert len(listed) == v.update_objects == ITERATIONS * WORKERS, v.name
        assert v.update_bytes == sum(listed.values()), v.name
        if v.name in expected_update:
            assert set(listed.values()) == {expected_update[v.name]}, v.name
        else:  # significance: its header, part table and R counts, and whole pairs
            assert all(s >= 32 + 8 * 3 + 4 * 2 and (s - 32 - 8 * 3 - 4 * 2) % 8 == 0 for s in listed.values())
        # the usage lines: workers wrote their updates, residuals (bfloat16, one per slot and iteration) and
        # evaluation states
        records = usage.read_local(local.log_dir, run_id)
        assert v.worker_usage_bytes_written == sum(r.bytes_written for r in records if r.function == "worker"), v.name
        slot_residual = 0 if v.name == "dense" else 2 * weights
        assert v.residual_bytes == ITERATIONS * WORKERS * slot_residual, v.name
        assert v.worker_usage_bytes_written == v.update_bytes + v.residual_bytes + sum(evaluations.values()), v.name
        # to the target: iteration 0's objects (ACCURACY_TARGET 0)
        assert v.iterations_to_target == 1, v.name
        assert v.update_bytes_to_target == _of_iterations(listed, 0) < v.update_bytes, v.name
        assert v.residual_bytes_to_target == WORKERS * slot_residual, v.name
        # reducers read the parts of every update (but its header, and significance's table but for each reducer's
        # two entries), their shards (deleted once superseded: sized by their encoding) with the manifest that names
        # them (past iteration 0), and the config
        table = 8 * 3 - 16 * 2 if v.name == "significance" else 0
        assert v.reducer_update_bytes_read == v.update_bytes - len(listed) * (32 + table), v.name
        read = sum(r.bytes_read for r in records if r.function == "reducer" and r.iteration is not None)
        assert v.reducer_bytes_read == read, v.name
        run_config = RunConfig.model_validate_json(services.store.get(keys.run_config(run_id)))
        shards_read = _shard_bytes(run_config, []) + (ITERATIONS - 1) * _shard_bytes(run_config, list(range(WORKERS)))
        manifests = sum(len(services.store.get(keys.manifest(run_id, i))) for i in range(1, ITERATIONS))
        assert read == v.reducer_update_bytes_read + shards_read + run_config.plan.reducers * manifests, v.name
        # what a container reads once to serve the run, its config, counts for the run and no iteration
        once = sum(r.bytes_read for r in records if r.function == "reducer" and r.iteration is None)
        config = len(services.store.get(keys.run_config(run_id)))
        configs, left = divmod(once, config)
        assert left == 0 and 1 <= configs <= local.concurrency["reducer"], (v.name, once, shards, config)
        assert v.requests_to_target < v.requests and v.cost_to_target_usd < v.cost_usd
    dense, fp16, topk = (report.variant(name) for name in ("dense", "fp16", "topk"))
    assert report.fp16_ratio == pytest.approx(dense.update_bytes / fp16.update_bytes) and report.fp16_fewer
    assert report.topk_ratio == pytest.approx(dense.update_bytes_to_target / topk.update_bytes_to_target)
    assert report.topk_fewer  # about 48× at every iteration
