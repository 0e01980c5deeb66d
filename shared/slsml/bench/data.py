"""Benchmark ``data``: reading a dataset bigger than the workers' warm cache. A synthetic image dataset (``samples``
of 32×32×3 uint8, random, 10 classes) is written through ``DatasetWriter`` (its MB/s measured), then trained on with
the same model, workers and global batch, one run each in one local runtime:

- ``cached``: the default bound (half a Worker's memory) holds the dataset: whole shards, read once;
- ``ranged``: the workers' warm cache bounded at ``cache_mb`` (``SLSML_WARM_CACHE_MB``), below the dataset: each
  worker fetches the records of its slice of the global batch by ranged GETs (the exact global order);
- ``shards``: the same bound, in the shard order (``shuffle shards``): each worker reads its lanes' shuffle buffers,
  one ranged GET of consecutive records per lane every ``shuffle_buffer`` iterations.

Per variant, from the functions' usage lines: S3 bytes read and GETs per iteration (medians), against the bytes of
the samples an iteration uses, and the median iteration."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel

from slsml.accounting import usage
from slsml.aws.cache import BOUND_ENV
from slsml.bench import pipeline as bench
from slsml.client import runs
from slsml.data.manifest import DatasetManifest, Split
from slsml.data.writer import DatasetWriter
from slsml.local.runtime import LocalRuntime
from slsml.pipeline.services import Services
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import modelio

SHAPE, CLASSES = (32, 32, 3), 10
SAMPLES, TEST_SAMPLES = 60_000, 1_000
WORKERS, REDUCERS, BATCH = 4, 2, 128
CACHE_MB = 64.0
ITERATIONS = 30
CHUNK = 4096  # samples generated and written at a time
BYTES_WITHIN = 2.0  # ranged: S3 bytes per iteration ≤ this × (bytes of the samples used + the cached run's)
TIME_WITHIN = 1.5  # ranged: median iteration ≤ this × the cached run's
IDLE_WAIT_S = 30

Progress = Callable[[str, int, int], None]  # (variant, iterations merged, iterations)


class Ingest(BaseModel):
    bytes: int  # of the shards written
    seconds: float
    mb_s: float


class DataVariant(BaseModel):
    name: str
    description: str
    cache_mb: float | None  # the workers' SLSML_WARM_CACHE_MB (None: the default bound)
    summary: runs.RunSummary
    bytes_used_per_iteration: int  # of the samples the iteration's workers train on
    bytes_read_per_iteration: float | None  # S3, every function of the iteration (median)
    gets_per_iteration: float | None  # s3:GetObject, every function of the iteration (median)
    median_iteration_s: float | None


class DataReport(BaseModel):
    samples: int
    sample_bytes: int
    dataset_bytes: int
    workers: int
    global_batch: int
    iterations: int
    ingest: Ingest
    variants: list[DataVariant]
    bytes_ratio: float | None  # ranged bytes read / (bytes used + cached bytes read)
    time_ratio: float | None  # ranged median iteration / cached
    bytes_within: bool  # bytes_ratio ≤ BYTES_WITHIN
    time_within: bool  # time_ratio ≤ TIME_WITHIN

    def variant(self, name: str) -> DataVariant:
        return next(v for v in self.variants if v.name == name)


def image_model(seed: int = 0) -> bytes:
    """A small compiled CNN for 32×32×3 uint8 images, 10 classes, as a ``.keras`` file."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input(SHAPE), keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return modelio.save_model(model)


def put_images(services: Services, name: str, samples: int, test_samples: int, seed: int = 0) -> tuple[
        DatasetManifest, Ingest]:
    """A synthetic dataset of random images, generated and written ``CHUNK`` samples at a time."""
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    with DatasetWriter(services.store, name, SHAPE, "uint8", (), "int64") as writer:
        splits: tuple[tuple[Split, int], ...] = (("train", samples), ("test", test_samples))
        for split, count in splits:
            for start in range(0, count, CHUNK):
                n = min(CHUNK, count - start)
                writer.write(split, rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8),
                             rng.integers(0, CLASSES, n, dtype=np.int64))
        manifest = writer.finish()
    seconds = time.perf_counter() - started
    written = manifest.train.bytes + manifest.test.bytes
    return manifest, Ingest(bytes=written, seconds=round(seconds, 3), mb_s=round(written / seconds / 1e6, 1))


def data_reads(local: LocalRuntime, samples: int = SAMPLES, iterations: int = ITERATIONS, cache_mb: float = CACHE_MB,
               progress: Progress | None = None) -> DataReport:
    """Write the dataset, train each variant on ``local`` (an entered runtime with ``WORKERS`` worker processes)
    and compare them."""
    services = local.services
    stem = runs.new_run_id("data")
    manifest, ingest = put_images(services, stem, samples, TEST_SAMPLES)
    model_bytes = image_model()
    spec = TrainingSpec(workers=WORKERS, reducers=REDUCERS, global_batch=BATCH, iterations=iterations, eval_every=0,
                        optimizer=OptimizerConfig(name="adam", learning_rate=1e-3))
    compared = {
        "cached": ("the dataset in the workers' warm cache (default bound): whole shards, read once", None, spec),
        "ranged": (f"warm cache bounded at {cache_mb:g} MB: ranged GETs of the samples used", cache_mb, spec),
        "shards": (f"warm cache bounded at {cache_mb:g} MB, shuffle shards: a ranged GET per lane and shuffle buffer",
                   cache_mb, spec.model_copy(update={"shuffle": "shards"})),
    }
    variants = []
    for name, (description, bound, trained) in compared.items():
        run_id = f"{stem}-{name}"
        local.host.function_environment = {} if bound is None else {BOUND_ENV: f"{bound:g}"}
        try:
            run, started = bench.run_to_the_end(services, model_bytes, trained, run_id, name, progress, dataset=stem)
            local.host.wait_idle(run_id, IDLE_WAIT_S)
        finally:
            local.host.function_environment = {}
        summary = runs.summarize(run, services.table.list_iterations(run_id), time.time() - started,
                                 usage.read_local(local.log_dir, run_id))
        variants.append(DataVariant(
            name=name, description=description, cache_mb=bound, summary=summary,
            bytes_used_per_iteration=BATCH * manifest.record_bytes,
            bytes_read_per_iteration=summary.bytes_read_per_iteration,
            gets_per_iteration=(summary.requests_per_iteration or {}).get("s3:GetObject"),
            median_iteration_s=summary.median_iteration_s,
        ))
    cached, ranged = variants[:2]
    bytes_ratio = time_ratio = None
    if cached.bytes_read_per_iteration is not None and ranged.bytes_read_per_iteration is not None:
        bytes_ratio = ranged.bytes_read_per_iteration / (ranged.bytes_used_per_iteration
                                                         + cached.bytes_read_per_iteration)
    if cached.median_iteration_s and ranged.median_iteration_s:
        time_ratio = ranged.median_iteration_s / cached.median_iteration_s
    return DataReport(
        samples=samples, sample_bytes=manifest.record_bytes, dataset_bytes=manifest.train.bytes + manifest.test.bytes,
        workers=WORKERS, global_batch=BATCH, iterations=iterations, ingest=ingest, variants=variants,
        bytes_ratio=bytes_ratio, time_ratio=time_ratio,
        bytes_within=bytes_ratio is not None and bytes_ratio <= BYTES_WITHIN,
        time_within=time_ratio is not None and time_ratio <= TIME_WITHIN,
    )
