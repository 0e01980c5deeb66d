"""The update object format: whole-object and per-shard (ranged) decoding."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from slsml import updates
from slsml.plan import ShardPlan, VariableSpec
from slsml.updates import HEADER_SIZE, UpdateFormatError

SPECS = [
    VariableSpec(name="a", shape=(10, 7), trainable=True),
    VariableSpec(name="b", shape=(3,), trainable=False),
    VariableSpec(name="c", shape=(4, 5, 2), trainable=True),
]
SIZE = 70 + 3 + 40


def vector(seed: int = 0, size: int = SIZE) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = (rng.standard_normal(size) * 10.0 ** rng.integers(-30, 30, size)).astype(np.float32)
    out[:4] = [-0.0, np.float32(1e-45), np.finfo(np.float32).max, -np.finfo(np.float32).tiny]
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.float32 and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_encode_decode_round_trip() -> None:
    original = vector()
    data = updates.encode(original, samples=37).body
    assert isinstance(data, bytes) and len(data) == HEADER_SIZE + 4 * SIZE
    assert data[:4] == b"SLSU"
    decoded, samples = updates.decode(data)
    assert samples == 37
    assert same_bits(decoded, original)
    decoded[0] = 1.0  # the decoded vector is writable and independent of the bytes
    assert updates.decode(data)[0][0] == original[0]


def test_encode_converts_float64_and_refuses_matrices() -> None:
    original = vector(1)
    decoded, _ = updates.decode(updates.encode(original.astype(np.float64), samples=1).body)
    assert same_bits(decoded, original)
    with pytest.raises(ValueError, match="flat"):
        updates.encode(original.reshape(-1, 1), samples=1)


def test_ranged_parts_decode_to_the_shards() -> None:
    plan = ShardPlan.build(SPECS, 3)
    original = vector(2)
    data = updates.encode(original, samples=5).body
    previous_last = HEADER_SIZE - 1
    for shard in range(plan.reducers):
        first, last = updates.part_range(plan, shard)
        assert first == previous_last + 1, "parts must tile the payload"
        previous_last = last
        layout = plan.shard(shard)
        part = updates.decode_part(data[first : last + 1], plan, shard)  # HTTP ranges are inclusive
        assert same_bits(part, original[layout.start : layout.stop]), f"shard {shard}"
    assert previous_last == len(data) - 1


def test_decode_part_refuses_a_wrong_length() -> None:
    plan = ShardPlan.build(SPECS, 3)
    data = updates.encode(vector(3), samples=5).body
    first, last = updates.part_range(plan, 1)
    with pytest.raises(UpdateFormatError, match="shard 1"):
        updates.decode_part(data[first:last], plan, 1)
    with pytest.raises(UpdateFormatError):
        updates.decode_part(data[first : last + 5], plan, 1)


def test_bad_magic() -> None:
    data = updates.encode(vector(4), samples=2).body
    with pytest.raises(UpdateFormatError, match="magic"):
        updates.decode(b"PK\x03\x04" + data[4:])


@pytest.mark.parametrize("cut", [0, 3, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 5, -4, -1])
def test_truncated(cut: int) -> None:
    data = updates.encode(vector(5), samples=2).body
    with pytest.raises(UpdateFormatError):
        updates.decode(data[:cut])


def test_trailing_bytes() -> None:
    with pytest.raises(UpdateFormatError, match="declares"):
        updates.decode(updates.encode(vector(6), samples=2).body + b"\0\0\0\0")


@pytest.mark.parametrize(("version", "encoding"), [(2, 0), (0, 0), (1, 1), (1, 7)])
def test_unknown_version_or_encoding(version: int, encoding: int) -> None:
    data = updates.encode(vector(7), samples=2).body
    forged = data[:4] + struct.pack("<HH", version, encoding) + data[8:]
    named = f"version {version} is not" if version != 1 else f"encoding {encoding} is not"
    with pytest.raises(UpdateFormatError, match=named):
        updates.decode(forged)
    with pytest.raises(UpdateFormatError, match=named):  # the same header, as a reducer's ranged GET sees it
        updates.check({updates.METADATA: f"{version}/{encoding}/0"}, "gradient", "part")


def test_a_kind_the_run_did_not_ask_for_is_refused_by_name() -> None:
    encoded = updates.encode(vector(8), samples=3, kind="weight change")
    updates.check(encoded.metadata, "weight change", "part")
    assert updates.decode(encoded.body, "weight change")[1] == 3
    with pytest.raises(UpdateFormatError, match="holds a weight change, but the run averages a gradient"):
        updates.check(encoded.metadata, "gradient", "part")
    with pytest.raises(UpdateFormatError, match="holds a weight change"):
        updates.decode(encoded.body)
    forged = encoded.body[:24] + struct.pack("<H", 9) + encoded.body[26:]
    with pytest.raises(UpdateFormatError, match="kind 9 is not known"):
        updates.decode(forged, "weight change")


@pytest.mark.parametrize("header", [None, "", "1/0", "one/0/0"])
def test_an_object_without_the_header_is_no_update(header: str | None) -> None:
    metadata = {} if header is None else {updates.METADATA: header}
    with pytest.raises(UpdateFormatError, match="not an slsml update"):
        updates.check(metadata, "gradient", "updates/00003.bin")
