"""Error feedback for compressed updates: what compression leaves out of a worker slot's update is kept and
added to the slot's next update before it is compressed, so that nothing is lost over time.

Slot w's residual after iteration i is one object, ``runs/<run>/iters/<i>/residuals/<w>.bin``: raw
little-endian bfloat16, one per weight of the flat vector (non-trainable entries are zero: they are values,
always sent whole). bfloat16 keeps float32's range and 8 bits of each entry's precision, so that the residual
costs half a dense float32 update, and top-k's update plus its residual moves fewer bytes than a dense update.
The worker of slot w at iteration i reads the residual of i-1 (none: zeros — iteration 0, a new slot after a
scale-out, or a slot whose worker did not store one), adds it to its update's trainable
entries, compresses the sum, and stores the new residual: the sum minus what the reducers will decode of the
update (the update decoded back, so the rule holds for every encoding), rounded to bfloat16. fp16's rounding
(and its saturation at ±65504) feeds back too, so that small changes that float16 rounds away or to
subnormals still add up. Hence, for every slot, the sum of what it sent plus its stored residual equals the
sum of its uncompressed updates, but for each stored residual's rounding: at most 2⁻⁸ of each entry kept.

The residual is stored before the update, create-only like everything else:

- superseded: a duplicate, a retry or a re-launched attempt computes from the same weights, data and residual,
  so it computes the same residual; the first one stored stands (and its update, which comes after it).
- dropped: an update left out of the average (late, past the quorum; its part dropped after a read timeout)
  is lost as an uncompressed one is: the residual keeps what was not sent, and what was sent is not added
  back (the worker cannot know, when it stores the residual, whether its update will count).
- non-finite: an update with NaN or Inf is left out by the reducers; the slot's residual is carried over
  unchanged (the NaN is not).
- removed: a slot beyond the next round's workers (the elastic fleet scaled in) is not read again; its
  residual is dropped with the iteration's other scratch objects. A slot added later starts from zeros.

A residual object of another size than the model's is refused, naming it (``ResidualError``), and the worker
stores nothing.

Cost, per worker and iteration of a compressed run: one GET (read alongside the compute) and one PUT of
2 bytes per weight, off the reducers' path (a residual of float32 entries, 4 bytes per weight, as stored
before, is read too).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from slsml.spec.shardplan import ShardPlan
from slsml.training import updates
from slsml.training.updates import Compression, Encoded


class ResidualError(ValueError):
    pass


class Compressed(NamedTuple):
    update: Encoded
    residual: np.ndarray  # what was not sent, to be stored for the slot's next update
    sent: np.ndarray  # what the reducers will decode


def compress(
    vector: np.ndarray,
    residual: np.ndarray | None,
    plan: ShardPlan,
    compression: Compression,
    samples: int,
    kind: str,
    weights: np.ndarray | None = None,
) -> Compressed:
    """The update (``vector`` plus the slot's ``residual``, None: zeros) compressed, and the new residual."""
    trainable = plan.trainable_mask()
    accumulated = np.array(vector, dtype=np.float32)
    if residual is not None:
        accumulated[trainable] += residual[trainable]
    update = updates.encode(accumulated, samples, kind, compression, plan, weights)
    sent, _ = updates.decode(update.body, kind, plan, compression)
    if not np.isfinite(accumulated).all():  # left out by the reducers: keep the residual as it was
        kept = np.zeros(plan.size, dtype=np.float32) if residual is None else residual
        return Compressed(update, kept, sent)
    left = np.zeros(plan.size, dtype=np.float32)
    left[trainable] = accumulated[trainable] - sent[trainable]
    return Compressed(update, _from_bfloat16(_to_bfloat16(left)), sent)


def residual_bytes(size: int) -> int:
    """Bytes of a stored residual of a model of ``size`` weights."""
    return 2 * size


def _to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bits (the upper half of the float32's), rounded to the nearest, ties to even."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4")
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype("<u2")


def _from_bfloat16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype("<u4") << 16).view("<f4").astype(np.float32)


def encode_residual(residual: np.ndarray) -> bytes:
    """A residual as it is stored: bfloat16 (``compress`` has rounded it so: nothing more is lost)."""
    return _to_bfloat16(residual).tobytes()


def decode_residual(body: bytes, plan: ShardPlan, where: str) -> np.ndarray:
    if len(body) == 4 * plan.size:  # float32 entries, as residuals were stored before
        residual = np.frombuffer(body, dtype="<f4").astype(np.float32)
    elif len(body) == residual_bytes(plan.size):
        residual = _from_bfloat16(np.frombuffer(body, dtype="<u2"))
    else:
        raise ResidualError(
            f"{where}: a residual of {len(body)} bytes does not match the model's {plan.size}"
            f" weights ({residual_bytes(plan.size)} bytes of bfloat16)"
        )
    if not np.isfinite(residual).all():
        raise ResidualError(f"{where}: the residual holds NaN or Inf")
    return residual
