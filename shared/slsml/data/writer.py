"""Writing a dataset to S3 in bounded memory, from (x, y) chunks of any length.

```python
writer = DatasetWriter(store, "cifar", x_shape=(32, 32, 3), x_dtype="uint8", y_shape=(), y_dtype="int64")
for x, y in chunks:                # numpy arrays, any number of samples each
    writer.write("train", x, y)    # the splits may come in any order, interleaved
writer.write("test", x_test, y_test)
manifest = writer.finish()         # the last shards, then the manifest: the dataset exists from here on
```

The writer fills one shard of ``shard_mb`` per split (``slsml.data.manifest`` gives the record layout) and uploads
each full shard in the background, at most ``uploads`` at a time: it holds at most (2 + ``uploads``) shards, however
big the dataset. Each chunk is checked first (shape, dtype, NaN or Inf: one line naming the split and the problem).
Shards are stored create-only with their SHA-256 as metadata; a shard already stored with the same checksum (an
interrupted upload of the same data, written again) is kept and not sent again, one with another checksum is refused.
Use it as a context manager: after an error it waits for the uploads in flight and drops those not begun.
``finish`` writes the manifest last; an existing dataset is never replaced. ``progress`` is called with the bytes of
each shard stored.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType

import numpy as np

from slsml.aws.storage import ObjectStore
from slsml.data.manifest import (
    DEFAULT_SHARD_MB,
    SPLITS,
    DatasetManifest,
    DatasetOrigin,
    ShardEntry,
    Split,
    SplitInfo,
    record_dtype,
    shard_records,
)
from slsml.data.sources.base import validate_arrays, validate_weights
from slsml.spec import keys
from slsml.spec.config import DATASET_PATTERN
from slsml.spec.errors import BadInputError

UPLOADS = 4  # shards uploaded at once
CHECKSUM_METADATA = "sha256"
WHAT = {"train": "training data", "test": "test data"}


@dataclass
class _SplitState:
    buffer: bytearray  # one shard's bytes, filled through ``records``
    records: np.ndarray
    filled: int = 0
    count: int = 0
    shards: list[Future[ShardEntry]] = field(default_factory=list)


class DatasetWriter:
    """Streams (x, y) chunks into a dataset's shards and writes its manifest last (see the module's docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        name: str,
        x_shape: tuple[int, ...],
        x_dtype: str,
        y_shape: tuple[int, ...],
        y_dtype: str,
        shard_mb: float = DEFAULT_SHARD_MB,
        uploads: int = UPLOADS,
        progress: Callable[[int], None] | None = None,
        weighted: bool = False,
    ) -> None:
        if not DATASET_PATTERN.match(name):
            raise BadInputError(f"dataset name {name!r} must be 1-63 lowercase letters, digits or '-'")
        if store.exists(keys.dataset_manifest(name)):
            raise BadInputError(f"dataset {name!r} already exists; choose another name")
        self.store, self.name, self.progress = store, name, progress
        self.x_shape, self.y_shape = tuple(x_shape), tuple(y_shape)
        self.x_dtype, self.y_dtype = str(np.dtype(x_dtype)), str(np.dtype(y_dtype))
        self.weighted = weighted  # each sample has a weight (a chunk without weights: 1 each)
        self.dtype = record_dtype(self.x_shape, self.x_dtype, self.y_shape, self.y_dtype, weighted)
        self.shard_records = shard_records(self.dtype.itemsize, shard_mb)
        self._splits: dict[Split, _SplitState] = {}
        self._pool = ThreadPoolExecutor(max_workers=uploads, thread_name_prefix="shard-upload")
        self._slots = threading.BoundedSemaphore(uploads)
        self._low, self._high, self._label_max = np.inf, -np.inf, -1
        self._counts = np.zeros(0, dtype=np.int64)
        self._integer_labels = np.issubdtype(np.dtype(self.y_dtype), np.integer) and self.y_shape == ()

    def write(self, split: Split, x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> None:
        """Append samples to ``split`` (with their weights ``w``, in a weighted dataset: None, 1 each); a full
        shard goes to S3 in the background."""
        what = WHAT[split]
        if len(x) == len(y) == 0:
            return
        validate_arrays(x, y, what)
        if w is not None:
            if not self.weighted:
                raise BadInputError(f"{what}: sample weights where the training data has none")
            validate_weights(w, len(x), what)
        for name, array, shape, dtype in (("x", x, self.x_shape, self.x_dtype), ("y", y, self.y_shape, self.y_dtype)):
            if array.shape[1:] != shape or str(array.dtype) != dtype:
                raise BadInputError(
                    f"{what}: {name} samples are {array.dtype}{list(array.shape[1:])} where the "
                    f"dataset's are {dtype}{list(shape)}"
                )
        self._low, self._high = min(self._low, float(x.min())), max(self._high, float(x.max()))
        if self._integer_labels:
            self._label_max = max(self._label_max, int(y.max()))
            if split == "train":  # the samples of each class (class weights)
                counts = np.bincount(y[y >= 0].astype(np.int64), minlength=len(self._counts))
                counts[: len(self._counts)] += self._counts
                self._counts = counts
        if split not in self._splits:
            self._splits[split] = self._new_state()
        state = self._splits[split]
        start = 0
        while start < len(x):
            take = min(len(x) - start, self.shard_records - state.filled)
            rows = state.records[state.filled : state.filled + take]
            rows["x"], rows["y"] = x[start : start + take], y[start : start + take]
            if self.weighted:
                rows["w"] = 1.0 if w is None else w[start : start + take]
            state.filled, state.count, start = state.filled + take, state.count + take, start + take
            if state.filled == self.shard_records:
                self._flush(split, state)

    def finish(self, origin: DatasetOrigin | None = None) -> DatasetManifest:
        """Store the last shards, wait for every upload, then write the manifest (with where the dataset came
        from, ``origin``); returns it."""
        with self:
            for split in SPLITS:
                state = self._splits.get(split)
                if state is None or state.count == 0:
                    raise BadInputError(f"{WHAT[split]}: no samples")
                if state.filled:
                    self._flush(split, state)
            infos = {
                split: SplitInfo(
                    count=self._splits[split].count, shards=tuple(f.result() for f in self._splits[split].shards)
                )
                for split in SPLITS
            }
            manifest = DatasetManifest(
                name=self.name,
                x_shape=self.x_shape,
                x_dtype=self.x_dtype,
                y_shape=self.y_shape,
                y_dtype=self.y_dtype,
                classes=self._label_max + 1 if self._integer_labels else None,
                class_counts=self._class_counts(),
                x_range=(self._low, self._high),
                record_bytes=self.dtype.itemsize,
                shard_records=self.shard_records,
                weighted=self.weighted,
                origin=origin,
                **infos,
            )
            if not self.store.put_json_new(keys.dataset_manifest(self.name), manifest.model_dump(mode="json")):
                raise BadInputError(f"dataset {self.name!r} was created concurrently by someone else")
            return manifest

    def _class_counts(self) -> tuple[int, ...] | None:
        """The training samples of each class id 0 … classes−1 (None: labels that are not class ids)."""
        if not self._integer_labels or self._label_max < 0:
            return None
        return tuple(int(n) for n in np.pad(self._counts, (0, self._label_max + 1 - len(self._counts))))

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        """Wait for the uploads in flight (after an error too: none is left running)."""
        self._pool.shutdown(wait=True, cancel_futures=error is not None)

    def _new_state(self) -> _SplitState:
        buffer = bytearray(self.shard_records * self.dtype.itemsize)
        return _SplitState(buffer, np.frombuffer(buffer, self.dtype))

    def _flush(self, split: Split, state: _SplitState) -> None:
        for earlier in state.shards:  # an upload that failed stops the writer at its next shard
            if earlier.done():
                earlier.result()
        full = state.filled == self.shard_records
        body = state.buffer if full else bytes(state.buffer[: state.filled * self.dtype.itemsize])
        index = len(state.shards)
        self._slots.acquire()  # at most ``uploads`` shards in flight: memory stays bounded
        try:
            state.shards.append(self._pool.submit(self._upload, split, index, body))
        except BaseException:
            self._slots.release()
            raise
        fresh = self._new_state()
        state.buffer, state.records, state.filled = fresh.buffer, fresh.records, 0

    def _upload(self, split: Split, index: int, body: bytes | bytearray) -> ShardEntry:
        try:
            entry = ShardEntry(
                records=len(body) // self.dtype.itemsize, bytes=len(body), sha256=hashlib.sha256(body).hexdigest()
            )
            key = keys.dataset_shard(self.name, split, index)
            stored = self.store.head(key)  # a shard an interrupted upload stored is not sent again
            if stored is None and self.store.put_new(key, body, metadata={CHECKSUM_METADATA: entry.sha256}):
                stored = {CHECKSUM_METADATA: entry.sha256}
            if (stored or self.store.head(key) or {}).get(CHECKSUM_METADATA) != entry.sha256:
                raise BadInputError(
                    f"dataset {self.name!r}: {split} shard {index} stored by an earlier upload "
                    "holds other data (its checksum differs); choose another name"
                )
            if self.progress is not None:
                self.progress(entry.bytes)
            return entry
        finally:
            self._slots.release()
