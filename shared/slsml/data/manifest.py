"""A dataset's manifest and the record layout of its shards.

A dataset is ``datasets/<name>/manifest.json`` plus shard objects ``<split>-<index>.bin`` for the splits ``train``
and ``test``. A shard is a run of fixed-size records and nothing else: record r of a shard is bytes
[r·R, (r+1)·R) with R = ``record_bytes``, one sample's x then its y, each in C order and little-endian, then, in a
``weighted`` dataset, the sample's weight as float32 (``record_dtype``). Every shard of a split holds
``shard_records`` records, the last one the rest; so sample j of a split is record j mod ``shard_records`` of shard
j // ``shard_records``, and its bytes are a ranged GET away.

The manifest lists each shard's records, bytes and SHA-256 and is written last: a dataset without one does not
exist, whatever shards an interrupted upload left.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

Split = Literal["train", "test"]
SPLITS: tuple[Split, Split] = ("train", "test")
SCHEMA_VERSION: Literal[2] = 2
# 64 MB shards: a whole-shard GET streams for ~0.7 s at S3's ~90 MB/s per connection, so its ~20-50 ms first byte
# costs under 10% and a million 150 KB images make ~3,000 objects; the writer holds one shard per split (plus those
# in upload) and a cached shard is a small part of a Worker's warm cache (half of its 3,008 MB).
DEFAULT_SHARD_MB = 64.0


class ShardEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    records: int = Field(gt=0)
    bytes: int = Field(gt=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class SplitInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    count: int = Field(ge=0)
    shards: tuple[ShardEntry, ...]

    @property
    def bytes(self) -> int:
        return sum(shard.bytes for shard in self.shards)


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

    schema_version: Literal[2] = SCHEMA_VERSION
    name: str
    x_shape: tuple[int, ...]
    x_dtype: str
    y_shape: tuple[int, ...]
    y_dtype: str
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
        if self.record_dtype.itemsize != self.record_bytes:
            raise ValueError(
                f"records of x {self.x_dtype}{list(self.x_shape)} and y {self.y_dtype}"
                f"{list(self.y_shape)} take {self.record_dtype.itemsize} bytes, not {self.record_bytes}"
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
        return record_dtype(self.x_shape, self.x_dtype, self.y_shape, self.y_dtype, self.weighted)

    def split(self, name: Split) -> SplitInfo:
        return self.train if name == "train" else self.test


def record_dtype(
    x_shape: tuple[int, ...], x_dtype: str, y_shape: tuple[int, ...], y_dtype: str, weighted: bool = False
) -> np.dtype:
    """One record: the sample's x then its y (then its weight), little-endian, packed."""
    return np.dtype(
        [
            ("x", np.dtype(x_dtype).newbyteorder("<"), x_shape),
            ("y", np.dtype(y_dtype).newbyteorder("<"), y_shape),
            *([("w", "<f4")] if weighted else []),
        ]
    )


def shard_records(record_bytes: int, shard_mb: float = DEFAULT_SHARD_MB) -> int:
    """Records per shard of about ``shard_mb`` MB (at least one)."""
    return max(1, int(shard_mb * 2**20) // record_bytes)
