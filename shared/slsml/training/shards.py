"""The shard format: one S3 object per shard and iteration holding the shard's weights and its
optimizer state together, so that the two always come from the same average, written once.

Version 1: a 32-byte header — magic ``SLSS``, u16 version, u16 flags (1: the shard kept the weights of
the iteration before, no reducer finished it; 2: the step was skipped, a gradient not being finite under loss
scaling), u64 element count, u64 byte length of the state archive, the loss scale entering the next iteration as
float32 and its finite steps as u32 (``slsml.training.precision``; zeros: the run scales no loss, as in shards
written before) — then the weights as float32 (little-endian), then the optimizer state and the workers averaged
as an ``.npz`` archive. The Merger reads only the weights (one ranged GET); for a model that carries the
optimizer's state (the final one), then each shard's state archive (one ranged GET each, its range from the header
the first read returned). The workers read the loss scale in shard 0's header (``loss_scale``, one ranged GET).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from slsml.spec.shardplan import ShardPlan
from slsml.training import npz
from slsml.training.optimizers import State
from slsml.training.precision import LossScale

MAGIC = b"SLSS"
VERSION = 1
KEPT = 1
SKIPPED = 2
_HEADER = struct.Struct("<4sHHQQfI")
HEADER_SIZE = _HEADER.size
_AVERAGED = "averaged"


class ShardFormatError(ValueError):
    pass


@dataclass
class Shard:
    weights: np.ndarray
    state: State
    averaged: list[int]  # the workers whose parts were averaged into this shard
    kept: bool = False  # the weights of the iteration before, carried over
    loss_scale: LossScale | None = None  # the loss scale entering the next iteration (None: the run scales no loss)
    skipped: bool = False  # the step was skipped: a gradient was not finite under loss scaling


def encode(shard: Shard) -> bytes:
    weights = np.ascontiguousarray(shard.weights, dtype="<f4")
    state = npz.encode(**shard.state, **{_AVERAGED: np.asarray(shard.averaged, dtype=np.int64)})
    flags = (KEPT if shard.kept else 0) | (SKIPPED if shard.skipped else 0)
    scale = shard.loss_scale or LossScale(0.0)
    header = _HEADER.pack(MAGIC, VERSION, flags, weights.size, len(state), scale.scale, scale.steps)
    return header + weights.tobytes() + state


def loss_scale(data: bytes) -> LossScale | None:
    """The loss scale in a shard object's header (``data``: a read from its first byte; None: none)."""
    scale, steps = _HEADER.unpack_from(_checked(data))[5:]
    return LossScale(scale, steps) if scale else None


def decode(data: bytes, expected_size: int | None = None) -> Shard:
    flags, count, state_bytes = _header(data)
    if expected_size is not None and count != expected_size:
        raise ShardFormatError(f"shard holds {count} weights, the plan expects {expected_size}")
    end = HEADER_SIZE + 4 * count
    if len(data) != end + state_bytes:
        raise ShardFormatError(f"shard of {len(data)} bytes does not match its header ({end + state_bytes})")
    arrays = npz.decode(data[end:])
    averaged = arrays.pop(_AVERAGED).tolist()
    weights = np.frombuffer(data, dtype="<f4", count=count, offset=HEADER_SIZE).astype(np.float32)
    return Shard(
        weights=weights,
        state=arrays,
        averaged=averaged,
        kept=bool(flags & KEPT),
        loss_scale=loss_scale(data),
        skipped=bool(flags & SKIPPED),
    )


def _header(data: bytes) -> tuple[int, int, int]:
    _, _, flags, count, state_bytes, _, _ = _HEADER.unpack_from(_checked(data))
    return flags, count, state_bytes


def _checked(data: bytes) -> bytes:
    """``data``, if it begins with a shard header this slsml reads; else ShardFormatError naming why."""
    if len(data) < HEADER_SIZE:
        raise ShardFormatError(f"shard of {len(data)} bytes is shorter than its header")
    magic, version = _HEADER.unpack_from(data)[:2]
    if magic != MAGIC:
        raise ShardFormatError("not an slsml shard (bad magic)")
    if version != VERSION:
        raise ShardFormatError(f"shard format v{version} is not supported (this slsml reads v{VERSION})")
    return data


def weights_range(plan: ShardPlan, shard: int) -> tuple[int, int]:
    """First and last byte (inclusive, as in an HTTP Range) of the weights in ``shard``'s object."""
    return 0, HEADER_SIZE + 4 * plan.shard(shard).size - 1


def state_range(data: bytes, plan: ShardPlan, shard: int) -> tuple[int, int]:
    """The bytes (inclusive) of the state archive in ``shard``'s object, from a read of its ``weights_range``."""
    _, count, state_bytes = _header(data)
    first = HEADER_SIZE + 4 * plan.shard(shard).size
    if count != plan.shard(shard).size or not state_bytes:
        raise ShardFormatError(
            f"shard {shard} holds {count} weights and {state_bytes} bytes of state, the plan"
            f" expects {plan.shard(shard).size} weights and their state"
        )
    return first, first + state_bytes - 1


def decode_state(data: bytes) -> State:
    """The optimizer state from a ranged read (``state_range``) of a shard object."""
    arrays = npz.decode(data)
    arrays.pop(_AVERAGED, None)
    return arrays


def decode_weights(data: bytes, plan: ShardPlan, shard: int) -> np.ndarray:
    """The weights from a ranged read (``weights_range``) of a shard object."""
    _, count, _ = _header(data)
    size = plan.shard(shard).size
    if count != size or len(data) != HEADER_SIZE + 4 * size:
        raise ShardFormatError(f"shard {shard} holds {count} weights, the plan expects {size}")
    return np.frombuffer(data, dtype="<f4", offset=HEADER_SIZE).astype(np.float32)
