"""Writing a dataset to S3 in bounded memory, from (x, y) chunks of any length.

```python
writer = DatasetWriter(store, "cifar", x_shape=(32, 32, 3), x_dtype="uint8", y_shape=(), y_dtype="int64")
# or DatasetWriter.like(store, "cifar", x, y): the layout of sample arrays, x or y a dict of named arrays
for x, y in chunks:                # numpy arrays, any number of samples each
    writer.write("train", x, y)    # the splits may come in any order, interleaved
writer.write("test", x_test, y_test)
manifest = writer.finish()         # the last shards, then the manifest: the dataset exists from here on
```

The writer fills one shard of ``shard_mb`` per split (``slsml.data.manifest`` gives the record layout) and uploads
each full shard in the background, at most ``uploads`` at a time: it holds at most (2 + ``uploads``) shards' bytes,
however big the dataset (a shard's bytes are freed before its upload's slot is; the last shard of a split is its
buffer cut to size, not a copy). Each chunk is checked first (shape, dtype, NaN or Inf: one line naming the split
and the problem).
Shards are stored create-only with their SHA-256 as metadata, and the ETag S3 gives each is listed in the manifest; a
shard already stored with the same bytes (an interrupted upload of the same data, written again: its ETag is their
MD5) is kept and not sent again, one of other bytes is refused, and so is one stored past the last shard written now.
Use it as a context manager: after an error it waits for the uploads in flight and drops those not begun.
``finish`` writes the manifest last, create-only: a name's manifest is written once, whoever else writes it at the
same time (the check when the writer starts only spares an upload that would be refused). ``progress`` is called
with the bytes of each shard stored.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from slsml.aws.storage import ObjectStore, etag_of
from slsml.data.manifest import (
    DEFAULT_SHARD_MB,
    SPLITS,
    ArraySpec,
    DatasetManifest,
    DatasetOrigin,
    Layout,
    ShardEntry,
    Split,
    SplitInfo,
    is_named,
    record_dtype,
    shard_records,
)
from slsml.data.sources.base import validate_arrays, validate_weights
from slsml.spec import keys, samples
from slsml.spec.config import DATASET_PATTERN
from slsml.spec.errors import BadInputError
from slsml.spec.samples import Arrays

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
        x_shape: tuple[int, ...] | None,
        x_dtype: str | None,
        y_shape: tuple[int, ...] | None,
        y_dtype: str | None,
        shard_mb: float = DEFAULT_SHARD_MB,
        uploads: int = UPLOADS,
        progress: Callable[[int], None] | None = None,
        weighted: bool = False,
        x_arrays: tuple[ArraySpec, ...] | None = None,
        y_arrays: tuple[ArraySpec, ...] | None = None,
    ) -> None:
        """x (and y) is one array of ``x_shape`` and ``x_dtype``, or the named arrays ``x_arrays`` (their shapes and
        dtypes; the shape and dtype None)."""
        if not DATASET_PATTERN.match(name):
            raise BadInputError(f"dataset name {name!r} must be 1-63 lowercase letters, digits or '-'")
        if store.exists(keys.dataset_manifest(name)):
            raise BadInputError(
                f"dataset {name!r} already exists; choose another name, or remove it first (`slsml data rm {name}`,"
                " refused while a run trains or would resume on it)"
            )
        self.store, self.name, self.progress = store, name, progress
        self.layouts: dict[str, Layout] = {
            "x": x_arrays or (tuple(x_shape or ()), str(np.dtype(x_dtype))),
            "y": y_arrays or (tuple(y_shape or ()), str(np.dtype(y_dtype))),
        }
        self.weighted = weighted  # each sample has a weight (a chunk without weights: 1 each)
        self.dtype = record_dtype(self.layouts["x"], self.layouts["y"], weighted)
        self.shard_records = shard_records(self.dtype.itemsize, shard_mb)
        self._splits: dict[Split, _SplitState] = {}
        self._pool = ThreadPoolExecutor(max_workers=uploads, thread_name_prefix="shard-upload")
        self._slots = threading.BoundedSemaphore(uploads)
        self._ranges: dict[str, tuple[float, float]] = {}  # of x, and of each named array (x's and y's)
        self._label_max = -1
        self._counts = np.zeros(0, dtype=np.int64)
        y = self.layouts["y"]
        self._integer_labels = not is_named(y) and y[0] == () and np.issubdtype(np.dtype(y[1]), np.integer)

    @classmethod
    def like(cls, store: ObjectStore, name: str, x: Arrays, y: Arrays, **options: Any) -> DatasetWriter:
        """A writer of samples such as ``x``, ``y`` (each one array or a dict of named arrays)."""
        layouts: dict[str, Any] = {}
        for part, arrays in (("x", x), ("y", y)):
            if isinstance(arrays, dict):
                specs = tuple(ArraySpec(name=k, shape=a.shape[1:], dtype=str(a.dtype)) for k, a in arrays.items())
                layouts |= {f"{part}_shape": None, f"{part}_dtype": None, f"{part}_arrays": specs}
            else:
                layouts |= {f"{part}_shape": arrays.shape[1:], f"{part}_dtype": str(arrays.dtype)}
        return cls(store, name, **layouts, **options)

    def write(self, split: Split, x: Arrays, y: Arrays, w: np.ndarray | None = None) -> None:
        """Append samples to ``split`` (with their weights ``w``, in a weighted dataset: None, 1 each); a full
        shard goes to S3 in the background."""
        what = WHAT[split]
        n = samples.count(x)
        if n == samples.count(y) == 0:
            return
        validate_arrays(x, y, what)
        if w is not None:
            if not self.weighted:
                raise BadInputError(f"{what}: sample weights where the training data has none")
            validate_weights(w, n, what)
        for part, arrays in (("x", x), ("y", y)):
            self._check_layout(what, part, arrays)
        for part, arrays in (("x", x), ("y", y)):
            for key, array in samples.named(arrays, part):
                if part == "x" or key != "y":  # the ranges of x and of every named array
                    low, high = self._ranges.get(key, (np.inf, -np.inf))
                    self._ranges[key] = min(low, float(array.min())), max(high, float(array.max()))
        if self._integer_labels:
            assert isinstance(y, np.ndarray)
            self._label_max = max(self._label_max, int(y.max()))
            if split == "train":  # the samples of each class (class weights)
                counts = np.bincount(y[y >= 0].astype(np.int64), minlength=len(self._counts))
                counts[: len(self._counts)] += self._counts
                self._counts = counts
        if split not in self._splits:
            self._splits[split] = self._new_state()
        state = self._splits[split]
        start = 0
        while start < n:
            take = min(n - start, self.shard_records - state.filled)
            rows = state.records[state.filled : state.filled + take]
            for part, arrays in (("x", x), ("y", y)):
                if isinstance(arrays, dict):
                    for key, array in arrays.items():
                        rows[part][key] = array[start : start + take]
                else:
                    rows[part] = arrays[start : start + take]
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
                    self._flush(split, state, last=True)
            infos = {
                split: SplitInfo(
                    count=self._splits[split].count, shards=tuple(f.result() for f in self._splits[split].shards)
                )
                for split in SPLITS
            }
            for split in SPLITS:
                self._refuse_stored_beyond(split, len(infos[split].shards))
            manifest = DatasetManifest(
                name=self.name,
                **self._layout_fields("x"),
                **self._layout_fields("y"),
                classes=self._label_max + 1 if self._integer_labels else None,
                class_counts=self._class_counts(),
                x_range=(min(low for low, _ in xs), max(high for _, high in xs))
                if (xs := [r for key, r in self._ranges.items() if key == "x" or key.startswith("x[")])
                else None,
                record_bytes=self.dtype.itemsize,
                shard_records=self.shard_records,
                weighted=self.weighted,
                origin=origin,
                **infos,
            )
            if not self.store.put_json_new(keys.dataset_manifest(self.name), manifest.model_dump(mode="json")):
                raise BadInputError(f"dataset {self.name!r} was created concurrently by someone else")
            return manifest

    def _check_layout(self, what: str, part: str, arrays: Arrays) -> None:
        """BadInputError naming the array whose names, shape or dtype differ from the dataset's."""
        layout = self.layouts[part]
        if isinstance(arrays, dict) != is_named(layout):
            form = f"named arrays ({', '.join(map(repr, arrays))})" if isinstance(arrays, dict) else "one array"
            first = f"named arrays ({', '.join(repr(a.name) for a in layout)})" if is_named(layout) else "one array"
            raise BadInputError(
                f"{what}: {part} is {form} where the dataset's first samples' is {first}: give all of its samples alike"
            )
        if isinstance(arrays, dict) and is_named(layout):
            specs = {a.name: (a.shape, a.dtype) for a in layout}
            if set(arrays) != set(specs):
                raise BadInputError(f"{what}: {part} names {sorted(arrays)} where the dataset's are {sorted(specs)}")
            wanted = [(f"{part}[{key!r}]", arrays[key], *specs[key]) for key in specs]
        else:
            wanted = [(part, arrays, *layout)]
        for key, array, shape, dtype in wanted:
            if array.shape[1:] != shape or str(array.dtype) != dtype:
                raise BadInputError(
                    f"{what}: {key} samples are {array.dtype}{list(array.shape[1:])} where the "
                    f"dataset's are {dtype}{list(shape)}"
                )

    def _refuse_stored_beyond(self, split: Split, shards: int) -> None:
        """Refuse a shard an earlier upload stored past the ``shards`` of ``split`` read now: the source gave more
        samples then, so it gives other data now."""
        prefix = keys.dataset_shards(self.name, split)
        stored = (keys.dataset_shard_index(self.name, split, key) for key in self.store.list_keys(prefix))
        if beyond := sorted(index for index in stored if index is not None and index >= shards):
            raise BadInputError(
                f"dataset {self.name!r}: {split} shard {beyond[0]} stored by an earlier upload lies past the end of "
                f"the {shards} shards the source gives now (it gives other data); choose another name"
            )

    def _layout_fields(self, part: str) -> dict[str, Any]:
        """The manifest's fields of x or y: one array's shape and dtype, or the named arrays with their ranges."""
        layout = self.layouts[part]
        if not is_named(layout):
            return {f"{part}_shape": layout[0], f"{part}_dtype": layout[1]}
        specs = tuple(a.model_copy(update={"range": self._ranges.get(f"{part}[{a.name!r}]")}) for a in layout)
        return {f"{part}_shape": None, f"{part}_dtype": None, f"{part}_arrays": specs}

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

    def _flush(self, split: Split, state: _SplitState, last: bool = False) -> None:
        """Send ``split``'s shard to S3 in the background once one of the ``uploads`` slots is free (memory stays
        bounded), and give the split a fresh buffer; the ``last`` shard's buffer is cut to its records, not copied."""
        for earlier in state.shards:  # an upload that failed stops the writer at its next shard
            if earlier.done():
                earlier.result()
        parcel, index, size = [state.buffer], len(state.shards), state.filled * self.dtype.itemsize
        # the split lets go of the shard (and of the view that keeps its buffer from being cut) while it waits
        state.buffer, state.records, state.filled = bytearray(), np.empty(0, self.dtype), 0
        if last:
            del parcel[0][size:]
        self._slots.acquire()
        try:
            state.shards.append(self._pool.submit(self._upload, split, index, parcel))
        except BaseException:
            self._slots.release()
            raise
        if not last:
            fresh = self._new_state()
            state.buffer, state.records = fresh.buffer, fresh.records

    def _upload(self, split: Split, index: int, parcel: list[bytearray]) -> ShardEntry:
        """Store a shard: ``parcel`` holds its bytes, taken out so that they are freed before its slot is."""
        body = parcel.pop()
        try:
            sha256 = hashlib.sha256(body).hexdigest()
            key = keys.dataset_shard(self.name, split, index)
            # a shard an interrupted upload stored is not sent again, but kept if it holds these very bytes (the ETag
            # a single-part upload gets is their MD5); the create is create-only: one stored meanwhile is not replaced
            stored = self.store.etag(key)
            created = None if stored else self.store.create(key, body, metadata={CHECKSUM_METADATA: sha256})
            etag = created or stored or self.store.etag(key)
            if created is None and etag != etag_of(body):
                raise BadInputError(
                    f"dataset {self.name!r}: {split} shard {index} stored by an earlier upload holds other data "
                    "than the source gives now (its checksum differs); choose another name"
                )
            assert etag is not None
            entry = ShardEntry(records=len(body) // self.dtype.itemsize, bytes=len(body), sha256=sha256, etag=etag)
            if self.progress is not None:
                self.progress(entry.bytes)
            return entry
        finally:
            del body
            self._slots.release()
