"""The update format: one S3 object per worker and iteration, read by each reducer with one ranged GET of its
own part (two for ``significance``, see below).

Version 1. A 32-byte header — magic ``SLSU``, u16 version, u16 encoding, u64 element count (the model's
flat size, whatever the encoding), u64 sample count, u16 kind, 6 reserved zero bytes — then the body,
little-endian. The kind says what the trainable weights' elements are: the worker's mean gradient (gradient
averaging) or its weight change over a round's local steps, start minus end (model averaging). Non-trainable
weights (e.g. BatchNorm statistics) are values, not changes: the worker's values after its last forward pass.

The body holds R parts, one per reducer shard (``slsml.spec.shardplan``), in shard order. The run's ``compress``
option (``Compression``) decides the encoding; a part of shard r with n_t trainable and n_n non-trainable
entries is:

====  ==============  ==========================================================================  ===============
enc.  compress        part                                                                        bytes
====  ==============  ==========================================================================  ===============
0     none            every entry, float32, in place (the format before compression existed)     4·(n_t+n_n)
1     fp16            the trainable entries as float16 (saturated at ±65504), then the            2·n_t + 4·n_n
                      non-trainable ones as float32
2     topk:F          k = ⌈F·n_t⌉ pairs (u32 index within the part, f32 value) of the trainable   8·k + 4·n_n
                      entries of largest magnitude, by increasing index; then the non-trainable
                      entries as float32
3     significance:V  u32 count c, then c pairs (as top-k) of the trainable entries whose         4 + 8·c + 4·n_n
                      |u_i| / max(|w_i|, 1e-6) exceeds V (u: the update, w: the weights the
                      iteration started from); then the non-trainable entries as float32
4     sparse          as significance, the pairs of every nonzero trainable entry: exact         4 + 8·c + 4·n_n
====  ==============  ==========================================================================  ===============

``sparse`` is lossless: an entry it leaves out is zero, and a reducer decodes it as zero, so the reducers average
and step exactly what a dense update gives them (bit for bit), whatever their optimizer: Adam's moments decay on
every row, touched or not, as in dense training (dense-equivalent, not "lazy", semantics). It pays where a round
touches few rows of a large embedding (``keras.layers.Embedding``, a hashed sparse input): TensorFlow's gradient
of a lookup is a ``tf.IndexedSlices`` of the rows looked up, which the worker adds up (duplicates summed) into its
flat update, and every other row's entries are zero. A part of c nonzero entries costs 4 + 8·c bytes against
dense's 4·n_t: smaller where fewer than half the entries are nonzero. It keeps no residual: nothing is left out.

Non-trainable entries are always sent whole, as float32: a value cannot be left for later. For encodings
0-2 each part's size follows from the shard plan and F, so a reducer computes its part's byte range
(``part_range``) and reads it with one ranged GET, as before. For ``significance`` and ``sparse`` the count
varies, so the
header is followed by a part table, R+1 u64 byte offsets into the object (part r is bytes
[table[r], table[r+1]); table[R] is the object's size). A reducer reads its two entries with a ranged GET of
16 bytes (``table_range``; the response also carries the object's size, checked against them), then its part
(``significant_part_range``). Its cost: 8·(R+1) bytes per object, and per iteration W·R more GETs of 16 bytes
and one more S3 round trip on each reducer's path (the second read of each part waits for the first). Offsets in
the user metadata would not save that request: a reducer needs its offset before its ranged GET, and metadata
comes only with a response (a HEAD is a request too); at R=256 they would also nearly fill the metadata's 2 KB
beside the worker's report. A fixed capacity per part would send the capacity's bytes whatever the count.

A reducer's ranged GET does not reach the header, so the header is also the object's user metadata
(``slsml-update`` = "version/encoding/kind"), which S3 returns with every GET: each reducer checks it on every
part it reads (``check``) and rejects, naming it, a version, encoding or kind it does not know, an encoding
the run's compress option does not send, or a kind the run does not average. Decoding a part rejects a part
whose length does not match its layout, and a sparse part whose indices fall outside the part, repeat, come
out of order or point at a non-trainable entry, before any of it is used.

What compression leaves out is not lost: see ``slsml.training.feedback`` (error feedback).

A round in pipeline stages (``slsml.pipeline.staged``) stores no update body: each stage stores its part of the
update (float32, in the update's order) as an object of its own, and the object at the update's key is an index
(``StagedIndex``, JSON of the runs of the flat vector each part holds and each part's ETag) with the update's
metadata, as above. A reducer reads the index whole, by the ETag the worker reported, then each range of the parts
its shard spans (``StagedIndex.ranges``), by the ETag the index names, and decodes their bytes joined as a dense
part.
"""

from __future__ import annotations

import json
import math
import struct
from decimal import Decimal
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from slsml.spec.compression import DENSE_F16, DENSE_F32, NONE, SIGNIFICANCE, SPARSE, TOP_K, Compression
from slsml.spec.shardplan import ShardPlan

MAGIC = b"SLSU"
VERSION = 1
ENCODINGS = {
    DENSE_F32: "dense float32",
    DENSE_F16: "dense float16",
    TOP_K: "top-k",
    SIGNIFICANCE: "significance",
    SPARSE: "sparse",
}
KINDS = ("gradient", "weight change")  # by number
METADATA = "slsml-update"
_HEADER = struct.Struct("<4sHHQQH6x")
HEADER_SIZE = _HEADER.size
_PAIR = np.dtype([("index", "<u4"), ("value", "<f4")])
_COUNT = struct.Struct("<I")
_OFFSETS = struct.Struct("<QQ")  # a part's two entries of the significance table
FP16_MAX = float(np.finfo(np.float16).max)
SIGNIFICANCE_EPS = 1e-6  # |w| below this counts as this: a change of a (near) zero weight is measured absolutely


class UpdateFormatError(ValueError):
    pass


class Encoded(NamedTuple):
    body: bytes
    metadata: dict[str, str]


# ---- part sizes --------------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def _entry_counts(plan: ShardPlan) -> tuple[tuple[int, int], ...]:
    """(trainable, non-trainable) entries of each shard."""
    counts = []
    for shard in range(plan.reducers):
        pieces = plan.pieces(shard)
        trainable = sum(p.span.stop - p.span.start for p in pieces if p.variable.trainable)
        counts.append((trainable, plan.bounds[shard + 1] - plan.bounds[shard] - trainable))
    return tuple(counts)


def top_k(compression: Compression, trainable: int) -> int:
    """Pairs a top-k part of ``trainable`` trainable entries holds: ⌈F·n⌉, F taken as the decimal it was given."""
    assert compression.kind == "topk" and compression.value is not None
    return math.ceil(Decimal(repr(compression.value)) * trainable)


def part_size(plan: ShardPlan, shard: int, compression: Compression = NONE) -> int:
    """Bytes of ``shard``'s part (fixed layouts: every encoding but significance and sparse)."""
    if compression.tabled:
        raise ValueError(f"{compression} parts have no fixed size: read the part table (table_range)")
    return part_bytes(compression, *_entry_counts(plan)[shard])


def part_bytes(compression: Compression, trainable: int, other: int, significant: int = 0) -> int:
    """Bytes of a part of ``trainable`` trainable and ``other`` non-trainable entries (significance, sparse: of
    which ``significant`` are sent)."""
    if compression.kind == "none":
        return 4 * (trainable + other)
    if compression.kind == "fp16":
        return 2 * trainable + 4 * other
    if compression.kind == "topk":
        return 8 * top_k(compression, trainable) + 4 * other
    return _COUNT.size + 8 * significant + 4 * other


def table_bytes(reducers: int) -> int:
    """Bytes of a significance or sparse update's part table: R+1 offsets."""
    return 8 * (reducers + 1)


def part_range(plan: ShardPlan, shard: int, compression: Compression = NONE) -> tuple[int, int]:
    """First and last byte (inclusive, as in an HTTP Range) of ``shard``'s part (fixed layouts)."""
    if compression.kind == "none":  # in place: no need to sum the parts before
        layout = plan.shard(shard)
        return HEADER_SIZE + 4 * layout.start, HEADER_SIZE + 4 * layout.stop - 1
    first = HEADER_SIZE + sum(part_size(plan, r, compression) for r in range(shard))
    return first, first + part_size(plan, shard, compression) - 1


def table_range(plan: ShardPlan, shard: int) -> tuple[int, int]:
    """Significance, sparse: the bytes (inclusive) of the part table's entries r and r+1, the bounds of ``shard``'s
    part."""
    first = HEADER_SIZE + 8 * shard
    return first, first + _OFFSETS.size - 1


def significant_part_range(entries: bytes, plan: ShardPlan, shard: int, size: int | None) -> tuple[int, int]:
    """Significance, sparse: the byte range (inclusive) of ``shard``'s part, from its two table entries (the bytes of
    ``table_range``) and the object's ``size`` (None: not known); UpdateFormatError if they cannot be right."""
    if len(entries) != _OFFSETS.size:
        raise UpdateFormatError(
            f"part table entries of shard {shard} have {len(entries)} bytes, expected {_OFFSETS.size}"
        )
    start, end = _OFFSETS.unpack(entries)
    trainable, other = _entry_counts(plan)[shard]
    smallest = _COUNT.size + 4 * other
    parts = HEADER_SIZE + table_bytes(plan.reducers)
    if (
        start < parts
        or end < start + smallest
        or end > start + smallest + 8 * trainable
        or (end - start - smallest) % _PAIR.itemsize
        or (size is not None and end > size)
    ):
        within = f" of the object's {size} bytes" if size is not None else ""
        raise UpdateFormatError(
            f"the part table puts shard {shard}'s part at bytes [{start}, {end}){within}, which"
            f" cannot hold it ({trainable} trainable and {other} other entries from byte {parts})"
        )
    return start, end - 1


# ---- encoding ----------------------------------------------------------------------------------------------


def encode(
    vector: np.ndarray,
    samples: int,
    kind: str = "gradient",
    compression: Compression = NONE,
    plan: ShardPlan | None = None,
    weights: np.ndarray | None = None,
) -> Encoded:
    """The update object and its user metadata (the header, as a reducer's ranged GET returns it). Every
    encoding but ``none`` needs the shard plan; ``significance`` also the weights the iteration started from."""
    flat = np.ascontiguousarray(vector, dtype="<f4")
    if flat.ndim != 1:
        raise ValueError("an update is a flat vector")
    encoding = compression.encoding
    if encoding == DENSE_F32:
        body = flat.tobytes()
    else:
        if plan is None or flat.size != plan.size:
            raise ValueError(f"{compression} needs the shard plan of the update's {flat.size} weights")
        if compression.kind == "significance" and (weights is None or np.shape(weights) != flat.shape):
            raise ValueError("significance needs the weights the update's changes are relative to")
        parts = []
        for shard in range(plan.reducers):
            layout = plan.shard(shard)
            scale = None if weights is None else weights[layout.start : layout.stop]
            parts.append(_encode_part(flat[layout.start : layout.stop], layout.trainable, compression, scale))
        body = b"".join(parts)
        if compression.tabled:
            offsets = np.cumsum([HEADER_SIZE + table_bytes(plan.reducers)] + [len(p) for p in parts], dtype=np.uint64)
            body = offsets.astype("<u8").tobytes() + body
    start = header(flat.size, samples, kind, compression)
    return Encoded(start.body + body, start.metadata)


def header(elements: int, samples: int, kind: str = "gradient", compression: Compression = NONE) -> Encoded:
    """The first ``HEADER_SIZE`` bytes of an update of a model of ``elements`` weights, and the update's user
    metadata: what a writer that streams the body puts first (``encode``: the whole update at once)."""
    number = KINDS.index(kind)
    packed = _HEADER.pack(MAGIC, VERSION, compression.encoding, elements, samples, number)
    return Encoded(packed, {METADATA: f"{VERSION}/{compression.encoding}/{number}"})


def _encode_part(
    part: np.ndarray, trainable: np.ndarray, compression: Compression, weights: np.ndarray | None
) -> bytes:
    values = part[~trainable].astype("<f4").tobytes()  # non-trainable: whole, float32
    if compression.kind == "fp16":
        return np.clip(part[trainable], -FP16_MAX, FP16_MAX).astype("<f2").tobytes() + values
    positions = np.flatnonzero(trainable)
    if compression.kind == "topk":
        k = top_k(compression, positions.size)
        if k < positions.size:  # the k largest magnitudes, by increasing index
            positions = np.sort(positions[np.argpartition(np.abs(part[positions]), positions.size - k)[-k:]])
        return _pairs(part, positions).tobytes() + values
    if compression.kind == "sparse":  # exact: every entry left out is zero
        positions = positions[part[positions] != 0]
        return _COUNT.pack(positions.size) + _pairs(part, positions).tobytes() + values
    assert weights is not None and compression.value is not None
    scale = np.maximum(np.abs(weights[positions]), np.float32(SIGNIFICANCE_EPS))
    positions = positions[np.abs(part[positions]) > np.float32(compression.value) * scale]
    return _COUNT.pack(positions.size) + _pairs(part, positions).tobytes() + values


def _pairs(part: np.ndarray, positions: np.ndarray) -> np.ndarray:
    pairs = np.empty(positions.size, dtype=_PAIR)
    pairs["index"], pairs["value"] = positions, part[positions]
    return pairs


# ---- an update in pipeline stages ---------------------------------------------------------------------------


class StagedIndex(NamedTuple):
    """What stands at an update's key where its worker computed it in pipeline stages (``slsml.pipeline.staged``):
    each stage stored its part of the update, its entries float32 in the update's order, as an object of its own, and
    the index says which runs of the flat vector each part holds (``runs``: stage, first element, elements) and names
    each part by its ETag (``etags``, by stage). Its user metadata is the update's (``header``). Encoded as JSON, the
    same bytes each time (a retry's index is the one stored before: ``ObjectStore.put_own``)."""

    runs: tuple[tuple[int, int, int], ...]
    etags: tuple[str, ...]

    def encode(self) -> bytes:
        return json.dumps({"runs": [list(run) for run in self.runs], "etags": list(self.etags)}).encode()

    @classmethod
    def decode(cls, body: bytes, plan: ShardPlan) -> StagedIndex:
        """UpdateFormatError unless ``body`` is an index whose runs cover the plan's flat vector, in order."""
        try:
            found = json.loads(body)
            runs = tuple((int(a), int(b), int(c)) for a, b, c in found["runs"])
            etags = tuple(str(e) for e in found["etags"])
        except (ValueError, KeyError, TypeError) as error:
            raise UpdateFormatError(f"not an index of an update in stages ({error})") from None
        at = 0
        for stage, start, count in runs:
            if start != at or count <= 0 or not 0 <= stage < len(etags):
                raise UpdateFormatError(
                    f"an index of an update in stages whose run {(stage, start, count)} is out of place"
                )
            at += count
        if at != plan.size:
            raise UpdateFormatError(f"an index of an update in stages of {at} entries, the model has {plan.size}")
        return cls(runs, etags)

    def ranges(self, plan: ShardPlan, shard: int) -> list[tuple[int, int, int]]:
        """The byte ranges (stage, first byte, byte after) of the stages' parts that hold ``shard``'s entries, in
        order."""
        layout = plan.shard(shard)
        found, within = [], dict.fromkeys(range(len(self.etags)), 0)  # elements of each part before the run
        for stage, start, count in self.runs:
            first, last = max(start, layout.start), min(start + count, layout.stop)
            if first < last:
                offset = within[stage] + first - start
                found.append((stage, 4 * offset, 4 * (offset + last - first)))
            within[stage] += count
        return found


# ---- checking and decoding ---------------------------------------------------------------------------------


def check(metadata: dict[str, str], kind: str, where: str, compression: Compression = NONE) -> None:
    """An update's header as its metadata says it: UpdateFormatError naming what a reducer cannot read, an
    encoding other than the run's compress option sends, or a kind other than the run's."""
    header = metadata.get(METADATA)
    try:
        version, encoding, number = (int(part) for part in (header or "").split("/"))
    except ValueError:
        raise UpdateFormatError(f"{where}: not an slsml update (its {METADATA} header is {header!r})") from None
    _check(version, encoding, number, kind, where, compression)


def _check(version: int, encoding: int, number: int, kind: str, where: str, compression: Compression) -> None:
    if version != VERSION:
        raise UpdateFormatError(f"{where}: update format version {version} is not supported (only {VERSION})")
    if encoding not in ENCODINGS:
        raise UpdateFormatError(
            f"{where}: update encoding {encoding} is not supported (only"
            f" {', '.join(f'{n} ({name})' for n, name in ENCODINGS.items())})"
        )
    if encoding != compression.encoding:
        raise UpdateFormatError(
            f"{where}: the update's encoding is {encoding} ({ENCODINGS[encoding]}), but the run's compress option"
            f" {compression} sends encoding {compression.encoding} ({ENCODINGS[compression.encoding]})"
        )
    if number >= len(KINDS):
        raise UpdateFormatError(f"{where}: update kind {number} is not known")
    if KINDS[number] != kind:
        raise UpdateFormatError(f"{where}: the update holds a {KINDS[number]}, but the run averages a {kind}")


def decode_part(data: bytes, plan: ShardPlan, shard: int, compression: Compression = NONE) -> np.ndarray:
    """``shard``'s part (as its ranged GET returns it) → its dense float32 entries; entries a sparse part does
    not hold are zero. UpdateFormatError, before anything is used, for a part that does not fit its layout."""
    layout = plan.shard(shard)
    if compression.kind == "none":
        if len(data) != 4 * layout.size:
            raise UpdateFormatError(f"part of shard {shard} has {len(data)} bytes, expected {4 * layout.size}")
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    trainable, other = _entry_counts(plan)[shard]
    out = np.zeros(layout.size, dtype=np.float32)
    if compression.tabled:
        if len(data) < _COUNT.size:
            raise UpdateFormatError(f"part of shard {shard} has {len(data)} bytes, too few for its count")
        (count,) = _COUNT.unpack_from(data)
        if count > trainable:
            raise UpdateFormatError(
                f"part of shard {shard} declares {count} pairs, but the shard has {trainable} trainable entries"
            )
        body, expected = data[_COUNT.size :], _COUNT.size + 8 * count + 4 * other
        what = f"{expected} bytes ({count} pairs)"
    else:
        body, expected = data, part_size(plan, shard, compression)
        what = f"{expected} bytes"
    if len(data) != expected:
        raise UpdateFormatError(f"part of shard {shard} has {len(data)} bytes, expected {what} for {compression}")
    dense, values = body[: len(body) - 4 * other], body[len(body) - 4 * other :]
    if compression.kind == "fp16":
        out[layout.trainable] = np.frombuffer(dense, dtype="<f2")
    else:
        pairs = np.frombuffer(dense, dtype=_PAIR)
        index = pairs["index"].astype(np.int64)
        _check_indices(index, layout.trainable, shard)
        out[index] = pairs["value"]
    out[~layout.trainable] = np.frombuffer(values, dtype="<f4")
    return out


def _check_indices(index: np.ndarray, trainable: np.ndarray, shard: int) -> None:
    if not index.size:
        return
    if index.max() >= trainable.size:
        raise UpdateFormatError(
            f"part of shard {shard}: index {int(index.max())} lies outside the part's {trainable.size} entries"
        )
    steps = np.diff(index)
    if (steps <= 0).any():
        at = int(np.flatnonzero(steps <= 0)[0]) + 1
        raise UpdateFormatError(
            f"part of shard {shard}: index {int(index[at])} repeats or comes out of order (indices must increase)"
        )
    if not trainable[index].all():
        bad = int(index[~trainable[index]][0])
        raise UpdateFormatError(f"part of shard {shard}: index {bad} is a non-trainable entry, which is sent whole")


def decode(
    data: bytes, kind: str = "gradient", plan: ShardPlan | None = None, compression: Compression = NONE
) -> tuple[np.ndarray, int]:
    """A whole update object → (dense vector, samples). Every encoding but ``none`` needs the shard plan."""
    if len(data) < HEADER_SIZE:
        raise UpdateFormatError(f"update of {len(data)} bytes is shorter than its header")
    magic, version, encoding, count, samples, number = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise UpdateFormatError("not an slsml update (bad magic)")
    _check(version, encoding, number, kind, "update", compression)
    if encoding == DENSE_F32:
        if len(data) != HEADER_SIZE + 4 * count:
            raise UpdateFormatError(f"update declares {count} elements but holds {len(data) - HEADER_SIZE} bytes")
        return np.frombuffer(data, dtype="<f4", offset=HEADER_SIZE).astype(np.float32), samples
    if plan is None:
        raise ValueError(f"decoding {compression} needs the shard plan")
    if count != plan.size:
        raise UpdateFormatError(f"update declares {count} elements, the model has {plan.size}")
    if compression.tabled:
        ranges = []
        for r in range(plan.reducers):
            first, last = table_range(plan, r)
            ranges.append(significant_part_range(data[first : last + 1], plan, r, len(data)))
        end = HEADER_SIZE + table_bytes(plan.reducers)
    else:
        ranges = [part_range(plan, r, compression) for r in range(plan.reducers)]
        end = HEADER_SIZE
    for first, last in ranges:  # the parts must tile the body
        if first != end:
            raise UpdateFormatError(f"update's parts do not tile it: a part starts at byte {first}, not {end}")
        end = last + 1
    if end != len(data):
        raise UpdateFormatError(f"update's parts end at byte {end}, but it holds {len(data)} bytes")
    vector = np.concatenate(
        [decode_part(data[first : last + 1], plan, r, compression) for r, (first, last) in enumerate(ranges)]
    )
    return vector, samples
