"""Datasets in S3 and the deterministic data order of a run.

A dataset is a manifest plus shards of fixed-size records (train and test splits; ``slsml.data.manifest`` gives
the layout, ``slsml.data.writer`` writes one in bounded memory). Iteration i of a run uses global batch i of a seeded
per-epoch permutation of the training set; worker w takes its contiguous slice of that batch. The order depends only
on (seed, iteration, workers), which is what lets the pipeline reproduce single-process training. Under ADMM, worker w
keeps a partition of its own instead (``partition_batch``).

A ``DatasetReader`` fetches the records a batch uses by ranged GETs, unless the split fits the warm cache's share
for data (``DATA_CACHE_SHARE`` of its bound): then whole shards are read once and kept.
"""

from __future__ import annotations

import hashlib
import json
import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial

import numpy as np
from botocore.exceptions import ClientError

from slsml.accounting import usage
from slsml.aws.cache import LRUCache
from slsml.aws.clients import error_code
from slsml.aws.storage import ObjectStore
from slsml.data.blockorder import BlockOrder
from slsml.data.manifest import DEFAULT_SHARD_MB, SCHEMA_VERSION, ArraySpec, DatasetManifest, Split
from slsml.data.sources.base import validate_arrays, validate_weights
from slsml.data.writer import DatasetWriter
from slsml.spec import keys, samples
from slsml.spec.algorithms import ALGORITHMS
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError
from slsml.spec.samples import Arrays

# A split whose shards take at most this share of the warm cache's bound is kept there whole; the rest of the
# cache holds the run's model (and its config, its manifest).
DATA_CACHE_SHARE = 0.5
READS = 16  # concurrent GETs of a reader: of a worker's batches together


def split_train_test(
    x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if not 0 < test_fraction < 1:
        raise BadInputError(f"test fraction must be between 0 and 1, got {test_fraction}")
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = max(1, round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def put_dataset(
    store: ObjectStore,
    name: str,
    x: Arrays,
    y: Arrays,
    x_test: Arrays,
    y_test: Arrays,
    shard_mb: float = DEFAULT_SHARD_MB,
    w: np.ndarray | None = None,
    w_test: np.ndarray | None = None,
) -> DatasetManifest:
    """Upload arrays as a dataset (``DatasetWriter``), with the training samples' weights ``w`` (and the test
    samples', ``w_test``: default 1 each) if given: every array is checked before anything is stored, the
    manifest is written last, and an existing dataset is never replaced. x and y are each one array or a dict of
    named arrays (by the model's input and output names, as ``fit`` takes them)."""
    x, y = samples.as_arrays(x, "training data"), samples.as_arrays(y, "training data")
    x_test, y_test = samples.as_arrays(x_test, "test data"), samples.as_arrays(y_test, "test data")
    validate_arrays(x, y, "training data")
    validate_arrays(x_test, y_test, "test data")
    if w_test is not None and w is None:
        raise BadInputError("test data: sample weights where the training data has none")
    for weights, count, what in (
        (w, samples.count(x), "training data"),
        (w_test, samples.count(x_test), "test data"),
    ):
        if weights is not None:
            validate_weights(weights, count, what)
    x_test, y_test = _like(x_test, x, "x"), _like(y_test, y, "y")
    with DatasetWriter.like(store, name, x, y, shard_mb=shard_mb, weighted=w is not None) as writer:
        writer.write("train", x, y, w)
        writer.write("test", x_test, y_test, w_test)
        return writer.finish()


def _like(test: Arrays, train: Arrays, part: str) -> Arrays:
    """The test samples in the training samples' dtypes; BadInputError where their names or shapes differ."""
    pairs = dict(samples.named(train, part)), dict(samples.named(test, part))
    if pairs[0].keys() != pairs[1].keys() or any(a.shape[1:] != pairs[1][k].shape[1:] for k, a in pairs[0].items()):
        raise BadInputError(
            f"train and test samples differ in shape: {part} {samples.describe(train)} vs {samples.describe(test)}"
        )
    if isinstance(test, dict):
        assert isinstance(train, dict)
        return {k: a.astype(train[k].dtype, copy=False) for k, a in test.items()}
    assert isinstance(train, np.ndarray)
    return test.astype(train.dtype, copy=False)


def load_manifest(store: ObjectStore, name: str) -> DatasetManifest:
    return open_manifest(store, name)[0]


def open_manifest(store: ObjectStore, name: str) -> tuple[DatasetManifest, str]:
    """Dataset ``name``'s manifest and the SHA-256 of its stored bytes: what a run pins (one GET)."""
    try:
        body = store.get(keys.dataset_manifest(name))
    except NotFoundError:
        raise NotFoundError(f"dataset {name!r} does not exist (upload it with `slsml data put`)") from None
    stored = json.loads(body)
    if isinstance(stored, dict) and stored.get("schema_version") != SCHEMA_VERSION:
        raise BadInputError(
            f"dataset {name!r} is stored in format {stored.get('schema_version')}, which this slsml "
            f"no longer reads (v{SCHEMA_VERSION}): remove it (`slsml data rm {name}`) and upload it again"
        )
    return DatasetManifest.model_validate(stored), hashlib.sha256(body).hexdigest()


def pinned_manifest(store: ObjectStore, name: str, pinned: str | None) -> DatasetManifest:
    """Dataset ``name``'s manifest, which must be the one whose stored bytes have the SHA-256 ``pinned`` (None: any):
    BadInputError naming the dataset where it changed, NotFoundError where it is gone."""
    try:
        manifest, digest = open_manifest(store, name)
    except NotFoundError:
        raise NotFoundError(f"dataset {name!r} the run trains on was removed since the run started") from None
    if pinned is not None and digest != pinned:
        raise BadInputError(
            f"dataset {name!r} changed since the run started: its manifest is not the one the run pinned"
            f" (sha256 {pinned[:12]}…, now {digest[:12]}…)"
        )
    return manifest


def check_stored(store: ObjectStore, name: str, pinned: str | None) -> None:
    """That dataset ``name`` is the one pinned (``pinned_manifest``) and that every shard its manifest lists is stored
    as listed (its ETag): one GET and a LIST per thousand shards. BadInputError or NotFoundError naming the dataset
    and the first shard missing or changed."""
    manifest = pinned_manifest(store, name, pinned)
    stored = store.etags(keys.dataset_shards(name, "train")) | store.etags(keys.dataset_shards(name, "test"))
    for split in ("train", "test"):
        for index, entry in enumerate(manifest.split(split).shards):
            found = stored.get(keys.dataset_shard(name, split, index))
            if found is None:
                raise NotFoundError(f"dataset {name!r} is missing its {split} shard {index}")
            if found != entry.etag:
                raise BadInputError(_changed(name, split, index))


def _changed(name: str, split: Split, shard: int) -> str:
    return (
        f"dataset {name!r}: {split} shard {shard} is not the one its manifest lists (it was replaced since the"
        " dataset was put)"
    )


def iterations_per_epoch(train_count: int, global_batch: int, least: int = 1) -> int:
    """Global batches an epoch, as Keras counts them (``samples.epoch_batches``: the last one smaller, where it holds
    ``least`` samples)."""
    if global_batch > train_count:
        raise BadInputError(
            f"global batch {global_batch} is larger than the training set ({train_count} samples): give --batch"
            f" {train_count} or less"
        )
    return samples.epoch_batches(train_count, global_batch, least)


def epoch_iterations(spec: TrainingSpec, train_count: int) -> int:
    """Iterations of an epoch of the samples the run trains on (of ``train_count`` before its held-out ones): its
    global batches as Keras counts them, ``local_batches`` a round."""
    trained = len(held_out(spec, train_count)[0])
    rounds = max(1, iterations_per_epoch(trained, spec.global_batch, spec.asked_workers()) // spec.local_batches)
    return rounds * spec.initial_workers if spec.asynchronous else rounds  # ASP: an iteration is one worker's update


def asynchronous_task(update: int, workers: int) -> tuple[int, int]:
    """ASP: the (slot, round) of the synchronous run whose batches update number ``update``
    (``barrier.asynchronous_updates``) takes: the updates take the synchronous run's slots in order, whichever
    worker is free."""
    return divmod(update, workers)[::-1]


def global_batch_indices(train_count: int, global_batch: int, seed: int, iteration: int, least: int = 1) -> np.ndarray:
    """Sample indices of global batch ``iteration``: a slice of epoch e's seeded permutation (the epoch's last one
    the samples left, where they are ``least`` at least)."""
    per_epoch = iterations_per_epoch(train_count, global_batch, least)
    epoch, position = divmod(iteration, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(train_count)
    return order[position * global_batch : (position + 1) * global_batch]


def worker_indices(batch: np.ndarray, workers: int, worker: int) -> np.ndarray:
    """Worker ``worker``'s contiguous, size-balanced slice of a global batch."""
    return np.array_split(batch, workers)[worker]


def partition_batch(
    train_count: int, global_batch: int, seed: int, workers: int, worker: int, number: int
) -> np.ndarray:
    """Sample indices of worker ``worker``'s batch ``number`` within its own partition of the training set
    (ADMM): the partition is its slice of a seeded permutation; its batches, of the worker's share of the
    global batch, follow a seeded per-epoch permutation of the partition."""
    part = np.array_split(np.random.default_rng([seed, workers]).permutation(train_count), workers)[worker]
    size = len(worker_indices(np.arange(global_batch), workers, worker))
    epoch, position = divmod(number, max(1, len(part) // size))
    order = np.random.default_rng([seed, workers, worker, epoch]).permutation(len(part))
    return part[order[position * size : (position + 1) * size]]


def held_out(spec: TrainingSpec, train_count: int) -> tuple[np.ndarray, np.ndarray]:
    """The training split's samples a run trains on and those it holds out for validation, each in index order: the
    samples from ``floor(train_count × (1 - validation_split))`` on, as Keras's ``fit`` splits them before it
    shuffles (``validation_samples`` last), or as many drawn by the seed (seeded); none without a split. Every
    reader of the held-out samples (the workers, the evaluations, the run's length) takes them from here."""
    if spec.validation_split is None:
        return np.arange(train_count), np.arange(0)
    split_at = math.floor(train_count * (1.0 - spec.validation_split))
    if not 0 < split_at < train_count:
        raise BadInputError(
            f"validation split {spec.validation_split:g} of {train_count} training samples holds out"
            f" {train_count - split_at}: give a fraction that leaves samples on both sides"
        )
    if spec.validation_samples == "last":
        return np.arange(split_at), np.arange(split_at, train_count)
    chosen = np.random.default_rng([spec.seed, train_count]).permutation(train_count)[: train_count - split_at]
    kept = np.ones(train_count, dtype=bool)
    kept[chosen] = False
    return np.flatnonzero(kept), np.sort(chosen)


def block_order(spec: TrainingSpec, train_count: int) -> BlockOrder | None:
    """The run's block order over the training split (None: the exact global order)."""
    if spec.shuffle != "blocks":
        return None
    order = BlockOrder(train_count, spec.global_batch, spec.shuffle_block, spec.seed, spec.asked_workers())
    if spec.global_batch > order.streamed:  # as the exact order refuses one larger than the split
        raise BadInputError(
            f"global batch {spec.global_batch} is larger than the training set in blocks of {spec.shuffle_block}"
            f" ({order.streamed} samples): give --batch {order.streamed} or less"
        )
    return order


def round_numbers(spec: TrainingSpec, iteration: int) -> range:
    """The global batches of round ``iteration``: one, or ``local_steps`` under model averaging and ADMM."""
    return range(iteration * spec.local_batches, (iteration + 1) * spec.local_batches)


def round_batches(
    spec: TrainingSpec, train_count: int, workers: int, worker: int, iteration: int, order: BlockOrder | None = None
) -> list[np.ndarray]:
    """Sample indices of each of worker ``worker``'s batches in round ``iteration``: its slice of the round's
    global batch (gradient averaging), of each of the round's ``local_steps`` global batches (model averaging),
    or its own partition's next ``local_steps`` batches (a partitioned rule: ADMM). ``order``: the run's block order,
    if it has one."""
    numbers = round_numbers(spec, iteration)
    if ALGORITHMS[spec.algorithm].partitioned:
        return [partition_batch(train_count, spec.global_batch, spec.seed, workers, worker, n) for n in numbers]
    if order is not None:
        return [order.batch(n, worker_indices(np.arange(order.size(n)), workers, worker)) for n in numbers]
    least = spec.asked_workers()
    return [
        worker_indices(global_batch_indices(train_count, spec.global_batch, spec.seed, n, least), workers, worker)
        for n in numbers
    ]


def coalesce(indices: np.ndarray, shard_records: int) -> list[tuple[int, int, int]]:
    """The ranged reads that fetch records ``indices`` of a split: (shard, first record, end record) per run of
    adjacent records within a shard, in index order. Their number is the GETs a batch costs."""
    unique = np.unique(indices)
    if not len(unique):
        return []
    shard_of = unique // shard_records
    breaks = np.flatnonzero((np.diff(unique) != 1) | (np.diff(shard_of) != 0)) + 1
    starts, stops = np.concatenate(([0], breaks)), np.concatenate((breaks, [len(unique)]))
    return [
        (
            int(shard_of[a]),
            int(unique[a] - shard_of[a] * shard_records),
            int(unique[b - 1] - shard_of[a] * shard_records + 1),
        )
        for a, b in zip(starts, stops, strict=True)
    ]


def _unpack(field: np.ndarray, dtype: str | None, arrays: tuple[ArraySpec, ...] | None) -> Arrays:
    """A record field's samples as an array in the dataset's dtype, or as its named arrays."""
    if arrays is None:
        return field.astype(dtype)
    return {a.name: field[a.name].astype(a.dtype) for a in arrays}


class DatasetReader:
    """Reads samples by index. A split whose bytes fit ``DATA_CACHE_SHARE`` of ``cache``'s bound is read by whole
    shards, checked against the manifest's SHA-256 and kept in ``cache`` under ``("shard", dataset, split, index,
    sha256)``; any other split (every split, without a cache) by ranged GETs of the records used alone (``coalesce``),
    issued concurrently by the reader's ``READS`` threads (kept: a batch's GETs do not start threads of their own).
    Every GET's answer is checked to come from the object the manifest lists (its ETag): a shard replaced since the
    dataset was put is refused, naming the dataset and the shard, whichever read finds it."""

    def __init__(self, store: ObjectStore, manifest: DatasetManifest, cache: LRUCache | None = None) -> None:
        self.store = store
        self.manifest = manifest
        self._cache = cache
        self._reads = ThreadPoolExecutor(max_workers=READS, thread_name_prefix="data-read")

    def cached(self, split: Split) -> bool:
        """Whether ``split`` is read by whole shards kept in the cache."""
        if self._cache is None:
            return False
        return self._cache.limit is None or self.manifest.split(split).bytes <= DATA_CACHE_SHARE * self._cache.limit

    def take(self, split: Split, indices: np.ndarray) -> tuple[Arrays, Arrays]:
        x, y, _ = self.take_weighted(split, indices)
        return x, y

    def take_weighted(self, split: Split, indices: np.ndarray) -> tuple[Arrays, Arrays, np.ndarray | None]:
        """The samples' x, y (each one array, or a dict of the named arrays) and weights (None: the dataset has
        none), read together."""
        m = self.manifest
        indices = np.asarray(indices, dtype=np.int64)
        count = m.split(split).count
        if len(indices) and (indices.min() < 0 or indices.max() >= count):
            raise IndexError(f"{split} sample indices {indices.min()}..{indices.max()} outside 0..{count - 1}")
        records = self._cached_records(split, indices) if self.cached(split) else self._ranged_records(split, indices)
        weights = records["w"].astype(np.float32) if m.weighted else None
        return _unpack(records["x"], m.x_dtype, m.x_arrays), _unpack(records["y"], m.y_dtype, m.y_arrays), weights

    def split(self, split: Split) -> tuple[Arrays, Arrays]:
        return self.take(split, np.arange(self.manifest.split(split).count))

    def _ranged_records(self, split: Split, indices: np.ndarray) -> np.ndarray:
        size, per_shard = self.manifest.record_bytes, self.manifest.shard_records
        reads = coalesce(indices, per_shard)
        bodies = self._get(
            split, [shard for shard, _, _ in reads], [(first * size, end * size - 1) for _, first, end in reads]
        )
        records = np.empty(sum(end - first for _, first, end in reads), self.manifest.record_dtype)
        at = 0
        for (shard, first, end), body in zip(reads, bodies, strict=True):
            if len(body) != (end - first) * size:
                raise BadInputError(
                    f"dataset {self.manifest.name!r}: {split} shard {shard} is shorter than its "
                    f"manifest says (records {first}..{end - 1} read {len(body)} bytes)"
                )
            records[at : at + end - first] = np.frombuffer(body, self.manifest.record_dtype)
            at += end - first
        return records[np.searchsorted(np.unique(indices), indices)]

    def _cached_records(self, split: Split, indices: np.ndarray) -> np.ndarray:
        assert self._cache is not None
        shard_of, offset = np.divmod(indices, self.manifest.shard_records)
        needed = [int(s) for s in np.unique(shard_of)]
        entries = self.manifest.split(split).shards
        # a shard is kept by its content: a dataset put again under the same name is not read from the old one's
        kept = {s: ("shard", self.manifest.name, split, s, entries[s].sha256) for s in needed}
        shards = {s: self._cache.get(kept[s]) for s in needed}
        missing = [s for s in needed if shards[s] is None]
        # the cache fills once per container: the run's reads, not the iteration's (``usage.warming``)
        for shard, body in zip(missing, self._get(split, missing, [None] * len(missing), warming=True), strict=True):
            entry = entries[shard]
            if len(body) != entry.bytes or hashlib.sha256(body).hexdigest() != entry.sha256:
                raise BadInputError(_changed(self.manifest.name, split, shard))
            records = np.frombuffer(body, self.manifest.record_dtype)
            shards[shard] = self._cache.put(kept[shard], records, len(body))
        out = np.empty(len(indices), self.manifest.record_dtype)
        for shard in needed:
            rows, cached = shard_of == shard, shards[shard]
            assert cached is not None  # cached, or read just now
            out[rows] = cached[offset[rows]]
        return out

    def _get(
        self, split: Split, shards: list[int], ranges: list[tuple[int, int] | None], warming: bool = False
    ) -> list[bytes]:
        """Concurrent GETs of ``shards`` of ``split`` (their byte ``ranges``), in order; ``warming``: reads that fill
        the warm cache (``usage.warming``)."""
        read = partial(self._read, warming=warming)
        if len(shards) <= 1:
            return [read(split, s, r) for s, r in zip(shards, ranges, strict=True)]
        return list(self._reads.map(read, [split] * len(shards), shards, ranges))

    def _read(self, split: Split, shard: int, byte_range: tuple[int, int] | None, warming: bool = False) -> bytes:
        """A shard's bytes (``byte_range`` of them), read from the object its manifest lists: the ETag the GET
        answers with is the listed one (BadInputError naming the dataset and the shard otherwise)."""
        try:
            with usage.warming() if warming else nullcontext():
                key = keys.dataset_shard(self.manifest.name, split, shard)
                stored = self.store.read(key) if byte_range is None else self.store.get_range(key, byte_range)
            if stored.etag != self.manifest.split(split).shards[shard].etag:
                raise BadInputError(_changed(self.manifest.name, split, shard))
            return stored.body
        except NotFoundError:
            raise NotFoundError(f"dataset {self.manifest.name!r} is missing its {split} shard {shard}") from None
        except ClientError as error:
            if error_code(error) != "InvalidRange":
                raise
            raise BadInputError(
                f"dataset {self.manifest.name!r}: {split} shard {shard} is shorter than its manifest "
                f"says (bytes {byte_range} read)"
            ) from None
