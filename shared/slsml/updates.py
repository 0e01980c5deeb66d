"""The update format: one S3 object per worker and iteration, read by each reducer with one ranged
GET of its own part.

Version 1, encoding 0 (dense float32): a 32-byte header — magic ``SLSU``, u16 version, u16 encoding,
u64 element count, u64 sample count, 8 reserved bytes — then the flat vector, little-endian. For
trainable weights the vector holds the worker's mean gradient; for non-trainable weights (e.g.
BatchNorm statistics) it holds the values after the worker's forward pass. New encodings (sparse,
compressed) get new numbers; readers reject ones they do not know.
"""

from __future__ import annotations

import struct

import numpy as np

from slsml.plan import ShardPlan

MAGIC = b"SLSU"
VERSION = 1
DENSE_F32 = 0
_HEADER = struct.Struct("<4sHHQQ8x")
HEADER_SIZE = _HEADER.size


class UpdateFormatError(ValueError):
    pass


def encode(vector: np.ndarray, samples: int) -> bytes:
    flat = np.ascontiguousarray(vector, dtype="<f4")
    if flat.ndim != 1:
        raise ValueError("an update is a flat vector")
    return _HEADER.pack(MAGIC, VERSION, DENSE_F32, flat.size, samples) + flat.tobytes()


def part_range(plan: ShardPlan, shard: int) -> tuple[int, int]:
    """First and last byte (inclusive, as in an HTTP Range) of ``shard``'s part."""
    layout = plan.shard(shard)
    return HEADER_SIZE + 4 * layout.start, HEADER_SIZE + 4 * layout.stop - 1


def decode_part(data: bytes, plan: ShardPlan, shard: int) -> np.ndarray:
    layout = plan.shard(shard)
    if len(data) != 4 * layout.size:
        raise UpdateFormatError(f"part of shard {shard} has {len(data)} bytes, expected {4 * layout.size}")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """A whole update object → (vector, samples)."""
    if len(data) < HEADER_SIZE:
        raise UpdateFormatError(f"update of {len(data)} bytes is shorter than its header")
    magic, version, encoding, count, samples = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise UpdateFormatError("not an slsml update (bad magic)")
    if version != VERSION or encoding != DENSE_F32:
        raise UpdateFormatError(f"update format v{version} encoding {encoding} is not supported")
    if len(data) != HEADER_SIZE + 4 * count:
        raise UpdateFormatError(f"update declares {count} elements but holds {len(data) - HEADER_SIZE} bytes")
    return np.frombuffer(data, dtype="<f4", offset=HEADER_SIZE).astype(np.float32), samples
