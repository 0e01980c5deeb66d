"""What a run's data costs the workers per iteration in steady state, for the plan (``slsml.cost.model``).

A training split of N samples of s bytes in shards of S samples is cached when it fits the workers' warm cache's
share for data (``DATA_CACHE_SHARE`` of the bound: ``SLSML_WARM_CACHE_MB``, else half a Worker's memory): read
once, then nothing. Past it:

- the exact order (``shuffle global``): each of the round's K batches, a worker's b = B/W samples of a random batch,
  costs one ranged GET per run of adjacent samples; b random samples of N hold b·(b−1)·(N − N/S)/(N·(N−1))
  adjacent pairs of one shard on average, so a worker sends b minus that many GETs, all at once (``READS`` at a
  time), and reads b·s bytes;
- the block order (``shuffle blocks``): a worker's slice of each batch is whole blocks of c (``shuffle_block``)
  consecutive samples, a GET each, two where a block crosses a shard's end ((c − 1)/S of them), one for two where
  the next block of the slice is the one stored after it: b/c blocks where the slices fall on blocks' ends (B and b
  multiples of c), else 1 + (b − 1)/c on average, for K·b·s bytes.

The worker reads its samples while it reads the weights, so a read adds to its time only where it is longer.

Each of the split's P = ⌈N/S⌉ shards lies under a prefix of its own (``slsml.spec.keys``), and S3's request rates
are per prefix: the G GETs of a burst fall on the shards at random, so a prefix takes Binomial(G, 1/P) of them, and
the busiest one the median of their largest (the largest k with 1 − (1 − Pr[X ≥ k])^P ≥ ½, the prefixes taken as
independent).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from slsml.aws.cache import MEMORY_SHARE
from slsml.data.datasets import DATA_CACHE_SHARE, READS
from slsml.data.manifest import shard_records

Order = Literal["global", "blocks"]


class DataTraffic(BaseModel):
    order: Order
    samples: int
    sample_bytes: int
    shard_records: int
    split_bytes: int = Field(description="the training split")
    cache_bytes: int = Field(description="the workers' warm cache bound")
    cached: bool = Field(description="the split fits the cache's share for data: read once, then from memory")
    gets_per_iteration: float = Field(description="data GETs of all workers, an iteration on average")
    bytes_per_iteration: float = Field(description="data bytes all workers read, an iteration on average")
    burst_gets: float = Field(description="data GETs the workers send together at an iteration that reads")
    prefixes: int = Field(description="the training split's shards, each under a prefix of its own")
    busiest_gets: float = Field(description="of the burst's GETs, those to the busiest shard's prefix")
    worker_gets: float = Field(description="a worker's GETs at an iteration that reads")
    burst_s: float = Field(description="a worker's data read at an iteration that reads")
    read_s: float = Field(description="a worker's data read, an iteration on average")
    detail: str


def data_traffic(
    order: Order,
    samples: int,
    sample_bytes: int,
    global_batch: int,
    workers: int,
    batches: int,
    block: int,
    worker_memory_mb: int,
    cache_mb: float | None,
    per_shard: int | None,
    latency_s: float,
    read_mb_s: float,
) -> DataTraffic:
    """The data traffic of ``batches`` global batches a round of ``global_batch`` samples among ``workers``."""
    per_shard = per_shard or shard_records(sample_bytes)
    cache = int((cache_mb if cache_mb is not None else MEMORY_SHARE * worker_memory_mb) * 2**20)
    split = samples * sample_bytes
    prefixes = math.ceil(samples / per_shard)
    cached = split <= DATA_CACHE_SHARE * cache
    b = global_batch / workers
    used = batches * global_batch * sample_bytes
    common = {
        "order": order,
        "samples": samples,
        "sample_bytes": sample_bytes,
        "shard_records": per_shard,
        "split_bytes": split,
        "cache_bytes": cache,
        "cached": cached,
        "prefixes": prefixes,
    }
    if cached:
        return DataTraffic(
            **common,
            gets_per_iteration=0,
            bytes_per_iteration=0,
            burst_gets=0,
            busiest_gets=0,
            worker_gets=0,
            burst_s=0,
            read_s=0,
            detail=f"the {split / 1e6:,.0f} MB training split fits the workers'"
            f" cache ({DATA_CACHE_SHARE:.0%} of {cache / 2**20:,.0f} MB): read once",
        )
    if order == "global":
        adjacent = b * (b - 1) * (samples - samples / per_shard) / (samples * (samples - 1))
        worker_gets = batches * (b - adjacent)
        detail = f"past the workers' cache: {worker_gets:,.1f} ranged GETs of one sample a worker"
    else:
        aligned = global_batch % (block := min(block, samples)) == 0 and global_batch % workers == 0 and b % block == 0
        blocks = b / block if aligned else 1 + (b - 1) / block  # blocks a worker's slice touches
        # a GET each, two where it crosses a shard's end, one for two where the next is the block stored after it
        worker_gets = batches * (blocks * (1 + (block - 1) / per_shard) - (blocks - 1) / max(1, samples // block - 1))
        detail = f"block order: {worker_gets:,.1f} ranged GETs of blocks of {block} samples a worker"
    read_s = _read_s(worker_gets, batches * b * sample_bytes, latency_s, read_mb_s)
    return DataTraffic(
        **common,
        gets_per_iteration=workers * worker_gets,
        bytes_per_iteration=used,
        burst_gets=workers * worker_gets,
        busiest_gets=busiest(workers * worker_gets, prefixes),
        worker_gets=worker_gets,
        burst_s=read_s,
        read_s=read_s,
        detail=detail,
    )


def _read_s(gets: float, size: float, latency_s: float, read_mb_s: float) -> float:
    return math.ceil(gets / READS) * latency_s + size / (read_mb_s * 1e6) if gets else 0.0


def busiest(gets: float, prefixes: int) -> float:
    """Of ``gets`` GETs that fall on ``prefixes`` prefixes at random, those to the busiest: the median of the
    largest share (see the module's docstring); all of them under one prefix."""
    n = round(gets)
    if prefixes <= 1 or n == 0:
        return gets
    p, mean = 1 / prefixes, n / prefixes
    needed = -math.expm1(math.log(0.5) / prefixes)  # Pr[X ≥ k] at which the largest of P is ≥ k half the time
    tail = 0.0  # Pr[X ≥ k], summed from above a point past which the binomial's tail is negligible
    for k in range(min(n, math.ceil(mean + 10 * math.sqrt(mean) + 20)), 0, -1):
        choose = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        tail += math.exp(choose + k * math.log(p) + (n - k) * math.log1p(-p))
        if tail >= needed:
            return float(k)
    return 1.0
