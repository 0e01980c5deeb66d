"""A dataset's manifest and the record layout of its shards.

A dataset is ``datasets/<name>/manifest.json`` plus shard objects ``<split>/<index>/shard.bin`` for the splits
``train`` and ``test``, each under a prefix of its own (``slsml.spec.keys``): the workers read from every shard at
once, and S3's request rates are per prefix. A shard is a run of fixed-size records and nothing else: record r of a
shard is bytes [r·R, (r+1)·R) with R = ``record_bytes``, one sample's x then its y, each in C order and
little-endian, then, in a ``weighted`` dataset, the sample's weight as float32 (``record_dtype``). An x (or y) of
several named arrays (a model of several inputs or outputs: ``x_arrays``, ``y_arrays``) is each of them in turn, at
fixed offsets of the record. Every shard of a split holds ``shard_records`` records, the last one the rest; so
sample j of a split is record j mod ``shard_records`` of shard j // ``shard_records``, and its bytes are a ranged
GET away.

The manifest lists each shard's records, bytes, SHA-256 and ETag (the one S3 gave the stored object, which S3 answers
every GET of it with, a ranged one too: a reader checks that the bytes it read are the shard's at no request more)
and is written last, create-only: a dataset without one does not exist, whatever shards an interrupted upload left,
and a name's manifest is written once. A run pins its dataset by the SHA-256 of its manifest's stored bytes
(``slsml.data.datasets.pinned_manifest``), which covers every shard's checksum and ETag.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import TypeIs

Split = Literal["train", "test"]
SPLITS: tuple[Split, Split] = ("train", "test")
# 4: each shard's ETag listed (3: without it; 2: every shard of a split under one prefix; neither read any more)
SCHEMA_VERSION: Literal[4] = 4
# 64 MB shards: a whole-shard GET streams for ~0.7 s at S3's ~90 MB/s per connection, so its ~20-50 ms first byte
# costs under 10% and a million 150 KB images make ~3,000 objects; the writer holds one shard per split (plus those
# in upload) and a cached shard is a small part of a Worker's warm cache (half of its 3,008 MB).
DEFAULT_SHARD_MB = 64.0


class ShardEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    records: int = Field(gt=0)
    bytes: int = Field(gt=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    etag: str = Field(min_length=1, description="the stored object's ETag, as S3 answers its GETs with it")


class SplitInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    count: int = Field(ge=0)
    shards: tuple[ShardEntry, ...]

    @property
    def bytes(self) -> int:
        return sum(shard.bytes for shard in self.shards)


class ArraySpec(BaseModel):
    """One of the named arrays of a dataset's x or y: its name (the model's input or output it feeds), the shape of
    a sample's part and its dtype, and the smallest and the largest of its values (None: not recorded)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    shape: tuple[int, ...]
    dtype: str
    range: tuple[float, float] | None = None


class DatasetOrigin(BaseModel):
    """Where a dataset came from and how it was read: the same file read the same way is the same dataset."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: str = Field(description="the source's format (slsml.data.sources)")
    class_names: tuple[str, ...] | None = Field(default=None, description="the name of each label 0 … C−1")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="the source's checksum (slsml.data.ingest.checksum)")
    options: dict[str, Any] = Field(default_factory=dict, description="the format's options it was read with")
    test_fraction: float | None = Field(description="held out by the ingest (None: the source's own test part)")
    seed: int


class DatasetManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[4] = SCHEMA_VERSION
    name: str
    x_shape: tuple[int, ...] | None = Field(description="a sample's x (None: named arrays, x_arrays)")
    x_dtype: str | None
    y_shape: tuple[int, ...] | None = Field(description="a sample's y (None: named arrays, y_arrays)")
    y_dtype: str | None
    x_arrays: tuple[ArraySpec, ...] | None = Field(
        default=None, description="x as named arrays, in record order (a model of several inputs)"
    )
    y_arrays: tuple[ArraySpec, ...] | None = Field(
        default=None, description="y as named arrays, in record order (a model of several outputs)"
    )
    classes: int | None = Field(description="number of classes when labels are integer class ids")
    class_counts: tuple[int, ...] | None = Field(
        default=None,
        description="training samples of each class id 0 … classes−1 (None: not class ids, or not recorded)",
    )
    x_range: tuple[float, float] | None = Field(
        default=None, description="the smallest and the largest value of x, train and test (None: not recorded)"
    )
    weighted: bool = Field(default=False, description="each record ends with the sample's weight (float32)")
    record_bytes: int = Field(gt=0, description="bytes of one sample's record: its x, then its y (and its weight)")
    shard_records: int = Field(gt=0, description="records of every shard but a split's last")
    train: SplitInfo
    test: SplitInfo
    origin: DatasetOrigin | None = Field(default=None, description="the file or folder it was read from (None: arrays)")

    @model_validator(mode="after")
    def _consistent(self) -> DatasetManifest:
        for part, shape, dtype, arrays in (
            ("x", self.x_shape, self.x_dtype, self.x_arrays),
            ("y", self.y_shape, self.y_dtype, self.y_arrays),
        ):
            if (shape is None or dtype is None) == (arrays is None):
                raise ValueError(f"{part} is one array ({part}_shape, {part}_dtype) or named arrays ({part}_arrays)")
            if arrays is not None and (not arrays or len({a.name for a in arrays}) < len(arrays)):
                raise ValueError(f"{part}_arrays must name one array or more, each once")
        if self.record_dtype.itemsize != self.record_bytes:
            raise ValueError(
                f"records of x and y ({self.record_dtype}) take {self.record_dtype.itemsize} bytes, not"
                f" {self.record_bytes}"
            )
        for name in SPLITS:
            info = self.split(name)
            if sum(s.records for s in info.shards) != info.count:
                raise ValueError(
                    f"the {name} shards hold {sum(s.records for s in info.shards)} records, not {info.count}"
                )
            for index, shard in enumerate(info.shards):
                last = index == len(info.shards) - 1
                if (shard.records > self.shard_records if last else shard.records != self.shard_records) or (
                    shard.bytes != shard.records * self.record_bytes
                ):
                    raise ValueError(
                        f"{name} shard {index} of {shard.records} records and {shard.bytes} bytes does "
                        f"not fit {self.shard_records} records of {self.record_bytes} bytes"
                    )
        return self

    @property
    def record_dtype(self) -> np.dtype:
        return record_dtype(self.layout("x"), self.layout("y"), self.weighted)

    def layout(self, part: Literal["x", "y"]) -> Layout:
        """x's or y's: one array's (shape, dtype), or the named arrays."""
        named = self.x_arrays if part == "x" else self.y_arrays
        shape, dtype = (self.x_shape, self.x_dtype) if part == "x" else (self.y_shape, self.y_dtype)
        return named if named is not None else (shape or (), str(dtype))

    def split(self, name: Split) -> SplitInfo:
        return self.train if name == "train" else self.test


# a sample's x or y: one array's (shape, dtype), or named arrays
Layout = tuple[tuple[int, ...], str] | tuple[ArraySpec, ...]


def is_named(layout: Layout) -> TypeIs[tuple[ArraySpec, ...]]:
    return bool(layout) and isinstance(layout[0], ArraySpec)


def record_dtype(x: Layout, y: Layout, weighted: bool = False) -> np.dtype:
    """One record: the sample's x then its y (each one array, or its named arrays in turn), then its weight,
    little-endian, packed."""
    return np.dtype([_field("x", x), _field("y", y), *([("w", "<f4")] if weighted else [])])


def _field(name: str, layout: Layout) -> tuple[Any, ...]:
    if is_named(layout):
        return name, [(a.name, np.dtype(a.dtype).newbyteorder("<"), a.shape) for a in layout]
    shape, dtype = layout
    return name, np.dtype(dtype).newbyteorder("<"), shape


def shard_records(record_bytes: int, shard_mb: float = DEFAULT_SHARD_MB) -> int:
    """Records per shard of about ``shard_mb`` MB (at least one)."""
    return max(1, int(shard_mb * 2**20) // record_bytes)
