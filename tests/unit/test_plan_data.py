"""slsml plan knows the data: the workers' data GETs, bytes and time per iteration in steady state, by order,
from the training split against the workers' cache, in the requests, the worker's stage and the S3 GET rate."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from slsml.accounting import prices
from slsml.cost import datatraffic, planreport
from slsml.cost.modelinfo import from_params
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.plan import Plan
from slsml.cost.predict import predict
from slsml.cost.workload import Workload, function_memory, function_timeouts
from slsml.data.manifest import DatasetManifest, ShardEntry, SplitInfo
from slsml.spec.config import TrainingSpec

SLSML = {"params": 25_600_000, "sample_bytes": 150_528, "samples": 1_281_167, "global_batch": 8192, "workers": 256}


def plan(shuffle: str = "global", cache_mb: float | None = None, shard_records: int | None = None, **changes) -> Plan:
    figures = {**SLSML, **changes}
    spec = TrainingSpec(workers=figures["workers"], global_batch=figures["global_batch"], reducers=64, shuffle=shuffle)
    work = Workload(
        **from_params(figures["params"], Parameters()),
        training=spec,
        workers=figures["workers"],
        reducers=64,
        global_batch=figures["global_batch"],
        iterations=10,
        samples=figures["samples"],
        sample_bytes=figures["sample_bytes"],
        cache_mb=cache_mb,
        shard_records=shard_records,
        memory_mb=function_memory({"worker": 10240}),
        timeout_s=function_timeouts(),
    )
    return predict(work, Parameters(), Quotas(), prices.PriceTable())


def test_past_the_cache_the_exact_order_costs_a_get_per_sample_and_the_block_order_one_per_block() -> None:
    exact, blocks = plan("global"), plan("blocks")
    for p in (exact, blocks):
        assert not p.data.cached and p.data.bytes_per_iteration == 8192 * 150_528
    assert exact.data.gets_per_iteration == pytest.approx(8192, rel=1e-3)
    assert blocks.data.gets_per_iteration == pytest.approx(8192 / 16 * (1 + 15 / exact.data.shard_records), rel=1e-3)
    base = exact.requests_per_iteration["s3:GetObject"] - round(exact.data.gets_per_iteration)
    assert blocks.requests_per_iteration["s3:GetObject"] == base + round(blocks.data.gets_per_iteration)
    worker = next(s for s in exact.stages if s.function == "worker")
    assert "data GETs" in worker.detail
    assert {q.name: q for q in blocks.quotas}["S3 GET rate: data"].ok


def test_the_exact_orders_burst_spreads_over_the_prefixes_of_the_splits_shards() -> None:
    exact = plan("global")
    rate = {q.name: q for q in exact.quotas}["S3 GET rate: data"]
    assert exact.data.prefixes == -(-SLSML["samples"] // exact.data.shard_records)
    assert rate.ok and rate.value < exact.data.burst_gets / 100 and "datasets/<name>/train/<k>/" in rate.detail
    whole = plan("global", shard_records=SLSML["samples"])  # every sample in one shard: one prefix takes the burst
    one = {q.name: q for q in whole.quotas}["S3 GET rate: data"]
    assert whole.data.prefixes == 1 and whole.data.busiest_gets == whole.data.burst_gets
    assert one.value > Quotas().s3_get_per_s and not one.ok and "over by" in one.detail


@pytest.mark.parametrize(("gets", "prefixes"), [(8192, 2880), (529, 2880), (8192, 64), (128, 10), (1000, 2)])
def test_the_busiest_prefix_takes_what_the_busiest_of_random_draws_takes(gets: int, prefixes: int) -> None:
    draws = np.random.default_rng(0).integers(0, prefixes, (400, gets))
    busiest = np.array([np.bincount(d, minlength=prefixes).max() for d in draws])
    low, high = np.quantile(busiest, [0.02, 0.98])
    assert low <= datatraffic.busiest(gets, prefixes) <= high


def test_a_split_that_fits_the_workers_cache_costs_nothing_in_steady_state() -> None:
    small = plan(samples=60_000, sample_bytes=3_072, workers=4, global_batch=128)
    assert small.data.cached and small.data.gets_per_iteration == 0 and small.data.read_s == 0
    assert "S3 GET rate: data" not in {q.name for q in small.quotas}
    past = plan(samples=60_000, sample_bytes=3_072, workers=4, global_batch=128, cache_mb=64)
    assert not past.data.cached
    assert past.requests_per_iteration["s3:GetObject"] - small.requests_per_iteration["s3:GetObject"] == 128


def test_plan_data_takes_the_figures_of_the_datasets_manifest() -> None:
    entry = ShardEntry(records=100, bytes=100 * 3080, sha256="0" * 64, etag='"0"')
    manifest = DatasetManifest(
        name="images",
        x_shape=(32, 32, 3),
        x_dtype="uint8",
        y_shape=(),
        y_dtype="int64",
        classes=10,
        record_bytes=3080,
        shard_records=100,
        train=SplitInfo(count=250, shards=(entry, entry, entry.model_copy(update={"records": 50, "bytes": 50 * 3080}))),
        test=SplitInfo(count=100, shards=(entry,)),
    )
    args = argparse.Namespace(
        model=None, params=1000, compute_per_sample=None, sample_bytes=None, memory=[], samples=250, cache_mb=8.0
    )
    work = planreport.workload(args, TrainingSpec(workers=2, global_batch=16), Parameters(), manifest)
    assert (work.samples, work.sample_bytes, work.shard_records, work.cache_mb) == (250, 3080, 100, 8.0)
