"""The update format: one S3 object per worker and iteration, read by each reducer with one ranged
GET of its own part.

Version 1, encoding 0 (dense float32): a 32-byte header — magic ``SLSU``, u16 version, u16 encoding,
u64 element count, u64 sample count, u16 kind, 6 reserved bytes — then the flat vector, little-endian.
The kind says what the trainable weights' elements are: the worker's mean gradient (gradient averaging)
or its weight change over a round's local steps, start minus end (model averaging). For non-trainable
weights (e.g. BatchNorm statistics) the vector holds their values after the worker's last forward pass.

A reducer's ranged GET does not reach the header, so the header is also the object's user metadata
(``slsml-update``), which S3 returns with every GET: each reducer checks it on every part it reads and
rejects, naming it, a version, encoding or kind it does not know or the run did not ask for. New
encodings (sparse, compressed) get new numbers.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from slsml.plan import ShardPlan

MAGIC = b"SLSU"
VERSION = 1
DENSE_F32 = 0
ENCODINGS = {DENSE_F32: "dense float32"}
KINDS = ("gradient", "weight change")  # by number
METADATA = "slsml-update"
_HEADER = struct.Struct("<4sHHQQH6x")
HEADER_SIZE = _HEADER.size


class UpdateFormatError(ValueError):
    pass


class Encoded(NamedTuple):
    body: bytes
    metadata: dict[str, str]


def encode(vector: np.ndarray, samples: int, kind: str = "gradient") -> Encoded:
    """The update object and its user metadata (the header, as a reducer's ranged GET returns it)."""
    flat = np.ascontiguousarray(vector, dtype="<f4")
    if flat.ndim != 1:
        raise ValueError("an update is a flat vector")
    header = _HEADER.pack(MAGIC, VERSION, DENSE_F32, flat.size, samples, KINDS.index(kind))
    return Encoded(header + flat.tobytes(), {METADATA: f"{VERSION}/{DENSE_F32}/{KINDS.index(kind)}"})


def check(metadata: dict[str, str], kind: str, where: str) -> None:
    """An update's header as its metadata says it: UpdateFormatError naming what a reducer cannot read, or
    a kind other than the run's."""
    header = metadata.get(METADATA)
    try:
        version, encoding, number = (int(part) for part in (header or "").split("/"))
    except ValueError:
        raise UpdateFormatError(f"{where}: not an slsml update (its {METADATA} header is {header!r})") from None
    _check(version, encoding, number, kind, where)


def _check(version: int, encoding: int, number: int, kind: str, where: str) -> None:
    if version != VERSION:
        raise UpdateFormatError(f"{where}: update format version {version} is not supported (only {VERSION})")
    if encoding not in ENCODINGS:
        raise UpdateFormatError(f"{where}: update encoding {encoding} is not supported (only"
                                f" {', '.join(f'{n} ({name})' for n, name in ENCODINGS.items())})")
    if number >= len(KINDS):
        raise UpdateFormatError(f"{where}: update kind {number} is not known")
    if KINDS[number] != kind:
        raise UpdateFormatError(f"{where}: the update holds a {KINDS[number]}, but the run averages a {kind}")


def part_range(plan: ShardPlan, shard: int) -> tuple[int, int]:
    """First and last byte (inclusive, as in an HTTP Range) of ``shard``'s part."""
    layout = plan.shard(shard)
    return HEADER_SIZE + 4 * layout.start, HEADER_SIZE + 4 * layout.stop - 1


def decode_part(data: bytes, plan: ShardPlan, shard: int) -> np.ndarray:
    layout = plan.shard(shard)
    if len(data) != 4 * layout.size:
        raise UpdateFormatError(f"part of shard {shard} has {len(data)} bytes, expected {4 * layout.size}")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


def decode(data: bytes, kind: str = "gradient") -> tuple[np.ndarray, int]:
    """A whole update object → (vector, samples)."""
    if len(data) < HEADER_SIZE:
        raise UpdateFormatError(f"update of {len(data)} bytes is shorter than its header")
    magic, version, encoding, count, samples, number = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise UpdateFormatError("not an slsml update (bad magic)")
    _check(version, encoding, number, kind, "update")
    if len(data) != HEADER_SIZE + 4 * count:
        raise UpdateFormatError(f"update declares {count} elements but holds {len(data) - HEADER_SIZE} bytes")
    return np.frombuffer(data, dtype="<f4", offset=HEADER_SIZE).astype(np.float32), samples
