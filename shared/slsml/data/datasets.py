"""Datasets in S3 and the deterministic data order of a run.

A dataset is a manifest plus ``.npz`` shards of ``shard_size`` samples (train and test splits).
Iteration i of a run uses global batch i of a seeded per-epoch permutation of the training set;
worker w takes its contiguous slice of that batch. The order depends only on (seed, iteration,
workers), which is what lets the pipeline reproduce single-process training. Under ADMM, worker w
keeps a partition of its own instead (``partition_batch``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from slsml.aws.cache import LRUCache
from slsml.aws.storage import ObjectStore
from slsml.spec import keys
from slsml.spec.config import DATASET_PATTERN, TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError
from slsml.training import npz

Split = Literal["train", "test"]
DEFAULT_SHARD_SIZE = 4096


class SplitInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    count: int = Field(ge=0)
    shards: int = Field(ge=0)


class DatasetManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    name: str
    x_shape: tuple[int, ...]
    x_dtype: str
    y_shape: tuple[int, ...]
    y_dtype: str
    classes: int | None = Field(description="number of classes when labels are integer class ids")
    x_range: tuple[float, float] | None = Field(
        default=None, description="the smallest and the largest value of x, train and test (None: not recorded)"
    )
    shard_size: int = Field(gt=0)
    train: SplitInfo
    test: SplitInfo


def validate_arrays(x: np.ndarray, y: np.ndarray, what: str) -> None:
    if len(x) != len(y):
        raise BadInputError(f"{what}: x has {len(x)} samples but y has {len(y)}")
    if len(x) == 0:
        raise BadInputError(f"{what}: no samples")
    for name, array in (("x", x), ("y", y)):
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
            raise BadInputError(f"{what}: {name} has non-numeric dtype {array.dtype}")
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise BadInputError(f"{what}: {name} contains NaN or Inf")


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
    x: np.ndarray,
    y: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    shard_size: int = DEFAULT_SHARD_SIZE,
) -> DatasetManifest:
    """Upload a dataset as shards plus a manifest (written last). An existing dataset is never replaced."""
    if not DATASET_PATTERN.match(name):
        raise BadInputError(f"dataset name {name!r} must be 1-63 lowercase letters, digits or '-'")
    validate_arrays(x, y, "training data")
    validate_arrays(x_test, y_test, "test data")
    if x.shape[1:] != x_test.shape[1:] or y.shape[1:] != y_test.shape[1:]:
        raise BadInputError(
            f"train and test samples differ in shape: x {x.shape[1:]} vs {x_test.shape[1:]}, "
            f"y {y.shape[1:]} vs {y_test.shape[1:]}"
        )
    if store.exists(keys.dataset_manifest(name)):
        raise BadInputError(f"dataset {name!r} already exists; choose another name")
    integer_labels = np.issubdtype(y.dtype, np.integer) and y.ndim == 1
    manifest = DatasetManifest(
        name=name,
        x_shape=x.shape[1:],
        x_dtype=str(x.dtype),
        y_shape=y.shape[1:],
        y_dtype=str(y.dtype),
        classes=int(max(y.max(), y_test.max())) + 1 if integer_labels else None,
        x_range=(float(min(x.min(), x_test.min())), float(max(x.max(), x_test.max()))),
        shard_size=shard_size,
        train=SplitInfo(count=len(x), shards=-(-len(x) // shard_size)),
        test=SplitInfo(count=len(x_test), shards=-(-len(x_test) // shard_size)),
    )
    for split, xs, ys in (("train", x, y), ("test", x_test, y_test)):
        for index, start in enumerate(range(0, len(xs), shard_size)):
            body = npz.encode(x=xs[start : start + shard_size], y=ys[start : start + shard_size])
            if not store.put_new(keys.dataset_shard(name, split, index), body):
                raise BadInputError(
                    f"dataset {name!r} has shards left by an interrupted upload; choose another name"
                )
    if not store.put_json_new(keys.dataset_manifest(name), manifest.model_dump(mode="json")):
        raise BadInputError(f"dataset {name!r} was created concurrently by someone else")
    return manifest


def load_manifest(store: ObjectStore, name: str) -> DatasetManifest:
    try:
        return DatasetManifest.model_validate(store.get_json(keys.dataset_manifest(name)))
    except NotFoundError:
        raise NotFoundError(f"dataset {name!r} does not exist (upload it with `slsml data put`)") from None


def iterations_per_epoch(train_count: int, global_batch: int) -> int:
    if global_batch > train_count:
        raise BadInputError(f"global batch {global_batch} is larger than the training set ({train_count} samples)")
    return train_count // global_batch


def global_batch_indices(train_count: int, global_batch: int, seed: int, iteration: int) -> np.ndarray:
    """Sample indices of global batch ``iteration``: a slice of epoch e's seeded permutation."""
    per_epoch = iterations_per_epoch(train_count, global_batch)
    epoch, position = divmod(iteration, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(train_count)
    return order[position * global_batch : (position + 1) * global_batch]


def worker_indices(batch: np.ndarray, workers: int, worker: int) -> np.ndarray:
    """Worker ``worker``'s contiguous, size-balanced slice of a global batch."""
    return np.array_split(batch, workers)[worker]


def partition_batch(train_count: int, global_batch: int, seed: int, workers: int, worker: int,
                    number: int) -> np.ndarray:
    """Sample indices of worker ``worker``'s batch ``number`` within its own partition of the training set
    (ADMM): the partition is its slice of a seeded permutation; its batches, of the worker's share of the
    global batch, follow a seeded per-epoch permutation of the partition."""
    part = np.array_split(np.random.default_rng([seed, workers]).permutation(train_count), workers)[worker]
    size = len(worker_indices(np.arange(global_batch), workers, worker))
    epoch, position = divmod(number, max(1, len(part) // size))
    order = np.random.default_rng([seed, workers, worker, epoch]).permutation(len(part))
    return part[order[position * size : (position + 1) * size]]


def round_batches(spec: TrainingSpec, train_count: int, workers: int, worker: int, iteration: int) -> list[np.ndarray]:
    """Sample indices of each of worker ``worker``'s batches in round ``iteration``: its slice of the round's
    global batch (gradient averaging), of each of the round's ``local_steps`` global batches (model averaging),
    or its own partition's next ``local_steps`` batches (ADMM)."""
    numbers = range(iteration * spec.local_batches, (iteration + 1) * spec.local_batches)
    if spec.algorithm == "admm":
        return [partition_batch(train_count, spec.global_batch, spec.seed, workers, worker, n) for n in numbers]
    return [worker_indices(global_batch_indices(train_count, spec.global_batch, spec.seed, n), workers, worker)
            for n in numbers]


class DatasetReader:
    """Reads samples by index, fetching a shard only when ``cache`` does not hold it (default: a cache
    of the reader's own, unbounded). Shards are cached under ``("shard", dataset, split, index)``."""

    def __init__(self, store: ObjectStore, manifest: DatasetManifest, cache: LRUCache | None = None) -> None:
        self.store = store
        self.manifest = manifest
        self._cache = LRUCache(None) if cache is None else cache

    def _shard(self, split: Split, index: int) -> tuple[np.ndarray, np.ndarray]:
        key = ("shard", self.manifest.name, split, index)
        cached = self._cache.get(key)
        if cached is None:
            try:
                arrays = self.store.get_arrays(keys.dataset_shard(self.manifest.name, split, index))
            except NotFoundError:
                raise NotFoundError(f"dataset {self.manifest.name!r} is missing its {split} shard {index}") from None
            x, y = arrays["x"], arrays["y"]
            cached = self._cache.put(key, (x, y), x.nbytes + y.nbytes)
        return cached

    def take(self, split: Split, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shard_of, offset = np.divmod(indices, self.manifest.shard_size)
        m = self.manifest
        x_out = np.empty((len(indices), *m.x_shape), dtype=m.x_dtype)
        y_out = np.empty((len(indices), *m.y_shape), dtype=m.y_dtype)
        for index in np.unique(shard_of):
            x, y = self._shard(split, int(index))
            rows = shard_of == index
            x_out[rows], y_out[rows] = x[offset[rows]], y[offset[rows]]
        return x_out, y_out

    def split(self, split: Split) -> tuple[np.ndarray, np.ndarray]:
        count = self.manifest.train.count if split == "train" else self.manifest.test.count
        return self.take(split, np.arange(count))
