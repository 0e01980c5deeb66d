"""Benchmark ``data``: reading a dataset far bigger than the workers' warm cache. A synthetic image dataset (``samples``
random 32×32×3 uint8 images, 10 classes) is written as a ``.npy`` source and ingested by ``slsml data put`` in a
process of its own (its peak RSS and MB/s measured), then trained on with the same model, workers and global batch,
one run each in one local runtime:

- ``cached``: the default bound (half a Worker's memory) holds the dataset: whole shards, read once;
- ``ranged``: the workers' warm cache bounded at ``cache_mb`` (``SLSML_WARM_CACHE_MB``), far below the dataset: each
  worker fetches the records of its slice of the global batch by ranged GETs (the exact global order);
- ``blocks``: the same bound, in the block order (``shuffle blocks``, blocks of 16): each worker reads its slice's
  blocks, one ranged GET of consecutive records each.

Per variant, from the functions' usage lines: S3 bytes read and GETs per iteration (the median, and the mean after
the first iteration), the data's share (the mean beyond the cached run's median) per byte of the samples used, and
the median iteration.

Before the runs, the ingest of sources of each of ``ingest_gb`` gigabytes, a ``.npy`` of such images and a folder of
JPEG and PNG photos (``slsml.bench.ingest``), each measured alike and removed: whether its peak RSS stays within
``PEAK_MB`` however large the source."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from slsml.accounting import usage
from slsml.aws.cache import BOUND_ENV
from slsml.aws.storage import ObjectStore
from slsml.bench import pipeline as bench
from slsml.bench.ingest import PEAK_MB, Ingest, image_folder, measure
from slsml.client import runs
from slsml.data import catalog
from slsml.data import datasets as data
from slsml.local.cloud import LocalDeployment
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import modelio

SHAPE, CLASSES = (32, 32, 3), 10
SAMPLES = 60_000  # training images (184 MB), and TEST_FRACTION more held out
TEST_FRACTION = 1 / 61
WORKERS, REDUCERS, BATCH = 4, 2, 128
CACHE_MB = 16.0  # the dataset is over 10× this
ITERATIONS = 30
CHUNK = 4096  # images generated and written to the source at a time
BYTES_WITHIN = 2.0  # ranged: S3 bytes per iteration ≤ this × (bytes of the samples used + the cached run's)
TIME_WITHIN = 1.5  # ranged: median iteration ≤ this × the cached run's
IDLE_WAIT_S = 30
INGEST_GB = (0.05,)  # the sizes of the sources whose ingest is measured besides the dataset's

Progress = Callable[[str, int, int], None]  # (variant, iterations merged, iterations)


class DataVariant(BaseModel):
    name: str
    description: str
    cache_mb: float | None  # the workers' SLSML_WARM_CACHE_MB (None: the default bound)
    summary: runs.RunSummary
    bytes_used_per_iteration: int  # of the samples the iteration's workers train on
    bytes_read_per_iteration: float | None  # S3, every function of the iteration (median)
    gets_per_iteration: float | None  # s3:GetObject, every function of the iteration (median)
    mean_bytes_read: float  # S3 bytes an iteration, every function, the mean after the first iteration
    mean_gets: float  # s3:GetObject likewise
    data_bytes_per_byte_used: float | None = None  # (mean bytes − the cached run's) / bytes used
    median_iteration_s: float | None


class DataReport(BaseModel):
    samples: int
    sample_bytes: int
    dataset_bytes: int
    cache_mb: float
    workers: int
    global_batch: int
    iterations: int
    ingest: Ingest  # of the dataset trained on
    ingests: list[Ingest]  # of a .npy and a folder of images of each size measured
    ingest_within: bool  # every ingest's peak RSS ≤ PEAK_MB
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
    model = keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return modelio.save_model(model)


def write_source(folder: Path, samples: int, seed: int = 0) -> tuple[Path, Path]:
    """Random images and labels as ``x.npy`` and ``y.npy`` in ``folder``, written ``CHUNK`` images at a time."""
    rng = np.random.default_rng(seed)
    x_path, y_path = folder / "x.npy", folder / "y.npy"
    x = np.lib.format.open_memmap(x_path, mode="w+", dtype=np.uint8, shape=(samples, *SHAPE))
    y = np.lib.format.open_memmap(y_path, mode="w+", dtype=np.int64, shape=(samples,))
    for start in range(0, samples, CHUNK):
        stop = min(start + CHUNK, samples)
        x[start:stop] = rng.integers(0, 256, (stop - start, *SHAPE), dtype=np.uint8)
        y[start:stop] = rng.integers(0, CLASSES, stop - start)
        x.flush()
    del x, y
    return x_path, y_path


def ingest(deployment: LocalDeployment, store: ObjectStore, name: str, samples: int) -> Ingest:
    """Write a source of ``samples`` images and ``measure`` their ingest as dataset ``name``."""
    with tempfile.TemporaryDirectory(prefix="slsml-bench-data-") as folder:
        x_path, y_path = write_source(Path(folder), samples)
        arguments = [str(x_path), "--labels-file", str(y_path), "--test-fraction", f"{TEST_FRACTION}"]
        source_bytes = x_path.stat().st_size + y_path.stat().st_size
        return measure(deployment, store, name, "npy", arguments, source_bytes, Path(folder) / "put.log")


def sized_ingests(
    deployment: LocalDeployment, store: ObjectStore, stem: str, sizes_gb: tuple[float, ...]
) -> list[Ingest]:
    """For each of ``sizes_gb``, the ingest of a ``.npy`` source of that many gigabytes and of a folder of images
    (``image_folder``), each dataset removed once measured."""
    measured = []
    sample_bytes = int(np.prod(SHAPE)) + np.dtype(np.int64).itemsize
    with tempfile.TemporaryDirectory(prefix="slsml-bench-ingest-") as work:
        for index, gigabytes in enumerate(sizes_gb):
            name = f"{stem}-npy-{index}"
            measured.append(ingest(deployment, store, name, max(1, round(gigabytes * 1e9 / sample_bytes))))
            catalog.remove(store, name)
            measured.append(image_folder(deployment, store, f"{stem}-images-{index}", gigabytes, Path(work)))
    return measured


def _means(records: list[usage.UsageRecord], iterations: int) -> tuple[float, float]:
    """S3 bytes read and GETs an iteration, the mean over iterations 1 … ``iterations``−1."""
    counted = [r for r in records if r.iteration is not None and 1 <= r.iteration < iterations]
    span = max(1, iterations - 1)
    return (sum(r.bytes_read for r in counted) / span, sum(r.requests.get("s3:GetObject", 0) for r in counted) / span)


def data_reads(
    local: LocalRuntime,
    samples: int = SAMPLES,
    iterations: int = ITERATIONS,
    cache_mb: float = CACHE_MB,
    progress: Progress | None = None,
    ingest_gb: tuple[float, ...] = INGEST_GB,
) -> DataReport:
    """Write and ingest the dataset, measure the ingests of ``ingest_gb``, then train each variant on ``local`` (an
    entered runtime with ``WORKERS`` worker processes) and compare them."""
    services = local.services
    stem = launch.new_run_id("data")
    assert local.deployment is not None
    ingested = ingest(
        local.deployment, services.store, stem, samples + round(samples * TEST_FRACTION / (1 - TEST_FRACTION))
    )
    sized = sized_ingests(local.deployment, services.store, stem, ingest_gb)
    manifest = data.load_manifest(services.store, stem)
    model_bytes = image_model()
    spec = TrainingSpec(
        workers=WORKERS,
        reducers=REDUCERS,
        global_batch=BATCH,
        iterations=iterations,
        eval_every=0,
        optimizer=OptimizerConfig(name="adam", learning_rate=1e-3),
    )
    compared = {
        "cached": ("the dataset in the workers' warm cache (default bound): whole shards, read once", None, spec),
        "ranged": (f"warm cache bounded at {cache_mb:g} MB: ranged GETs of the samples used", cache_mb, spec),
        "blocks": (
            f"warm cache bounded at {cache_mb:g} MB, shuffle blocks: a ranged GET per block of 16 samples",
            cache_mb,
            spec.model_copy(update={"shuffle": "blocks"}),
        ),
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
        records = usage.read_local(local.log_dir, run_id)
        summary = runs.summarize(run, services.table.list_iterations(run_id), time.time() - started, records)
        mean_bytes, mean_gets = _means(records, iterations)
        variants.append(
            DataVariant(
                name=name,
                description=description,
                cache_mb=bound,
                summary=summary,
                bytes_used_per_iteration=BATCH * manifest.record_bytes,
                bytes_read_per_iteration=summary.bytes_read_per_iteration,
                gets_per_iteration=(summary.requests_per_iteration or {}).get("s3:GetObject"),
                mean_bytes_read=mean_bytes,
                mean_gets=mean_gets,
                median_iteration_s=summary.median_iteration_s,
            )
        )
    cached, ranged = variants[:2]
    for variant in variants[1:]:
        variant.data_bytes_per_byte_used = (variant.mean_bytes_read - (cached.bytes_read_per_iteration or 0)) / (
            variant.bytes_used_per_iteration
        )
    bytes_ratio = time_ratio = None
    if cached.bytes_read_per_iteration is not None and ranged.bytes_read_per_iteration is not None:
        bytes_ratio = ranged.bytes_read_per_iteration / (
            ranged.bytes_used_per_iteration + cached.bytes_read_per_iteration
        )
    if cached.median_iteration_s and ranged.median_iteration_s:
        time_ratio = ranged.median_iteration_s / cached.median_iteration_s
    return DataReport(
        samples=manifest.train.count,
        sample_bytes=manifest.record_bytes,
        dataset_bytes=manifest.train.bytes + manifest.test.bytes,
        cache_mb=cache_mb,
        workers=WORKERS,
        global_batch=BATCH,
        iterations=iterations,
        ingest=ingested,
        ingests=sized,
        ingest_within=all(i.peak_rss_mb <= PEAK_MB for i in [ingested, *sized]),
        variants=variants,
        bytes_ratio=bytes_ratio,
        time_ratio=time_ratio,
        bytes_within=bytes_ratio is not None and bytes_ratio <= BYTES_WITHIN,
        time_within=time_ratio is not None and time_ratio <= TIME_WITHIN,
    )
