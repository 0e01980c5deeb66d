"""The update object format: whole-object and per-shard (ranged) decoding, of every encoding (none, fp16, top-k,
significance, sparse), and what a reducer refuses."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from pydantic import ValidationError

from slsml.cli import main as cli
from slsml.cli import options
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.spec.shardplan import ShardPlan, VariableSpec
from slsml.training import updates
from slsml.training.updates import HEADER_SIZE, UpdateFormatError

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


@pytest.mark.parametrize(("version", "encoding"), [(2, 0), (0, 0), (1, 5), (1, 7)])
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


# ---- compressed encodings ----------------------------------------------------------------------------------

PLAN = ShardPlan.build(SPECS, 3)  # bounds 0, 38, 75, 113: shard 1 holds the non-trainable "b" (70..72)
TRAINABLE = PLAN.trainable_mask()
FP16, TOPK, SIGNIFICANCE, SPARSE = (
    updates.Compression.parse(t) for t in ("fp16", "topk:0.1", "significance:0.5", "sparse")
)


def changes(seed: int = 0) -> np.ndarray:
    """An update of plausible magnitudes (a gradient), with the non-trainable entries' values."""
    return (np.random.default_rng(seed).standard_normal(SIZE) * 0.1).astype(np.float32)


def start_weights(seed: int = 1) -> np.ndarray:
    weights = np.random.default_rng(seed).standard_normal(SIZE).astype(np.float32)
    weights[5] = 0.0  # a zero weight: its change is measured against SIGNIFICANCE_EPS
    return weights


def encoded(compression: updates.Compression, vector: np.ndarray | None = None, **extra) -> updates.Encoded:
    vector = changes() if vector is None else vector
    weights = start_weights() if compression.kind == "significance" else None
    return updates.encode(vector, 7, "gradient", compression, PLAN, weights, **extra)


def parts_of(data: bytes, compression: updates.Compression) -> list[bytes]:
    """Each shard's part, as its reducer's ranged GET(s) return it."""
    out = []
    for shard in range(PLAN.reducers):
        if compression.tabled:
            first, last = updates.table_range(PLAN, shard)
            first, last = updates.significant_part_range(data[first : last + 1], PLAN, shard, len(data))
        else:
            first, last = updates.part_range(PLAN, shard, compression)
        out.append(data[first : last + 1])
    return out


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("none", "none", None),
        ("fp16", "fp16", None),
        ("Sparse", "sparse", None),
        ("topk:0.01", "topk", 0.01),
        ("topk:1", "topk", 1.0),
        ("significance:0.002", "significance", 0.002),
        (" TopK:0.5 ", "topk", 0.5),
    ],
)
def test_compress_forms(text: str, kind: str, value: float | None) -> None:
    compression = updates.Compression.parse(text)
    assert (compression.kind, compression.value) == (kind, value)
    assert updates.Compression.parse(str(compression)) == compression
    assert TrainingSpec(compress=text).compression == compression
    assert compression.lossy == (kind not in ("none", "sparse"))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("topk:0", "fraction must be in \\(0, 1\\], not 0"),
        ("topk:2", "fraction must be in \\(0, 1\\], not 2"),
        ("zip", "'zip' is no compressor"),
        ("significance:-1", "threshold must be above 0, not -1"),
        ("significance:0", "above 0"),
        ("topk", "topk needs a value"),
        ("fp16:0.5", "fp16 takes no value"),
        ("sparse:0.1", "sparse takes no value"),
        ("topk:often", "'often' is not a number"),
        ("significance:inf", "finite"),
        ("", "'' is no compressor"),
    ],
)
def test_bad_compress_values_are_refused_naming_the_option_and_its_forms(text: str, why: str) -> None:
    for error_type, make in ((ValueError, updates.Compression.parse), (ValidationError, _spec)):
        with pytest.raises(error_type, match=why) as refused:
            make(text)
        message = str(refused.value)
        assert f"{text!r}: " in message
        assert "compress takes none, sparse (exact" in message and "topk:F (0 < F ≤ 1" in message
        assert "significance:V (V > 0" in message
    assert str(refused.value).startswith("1 validation error for TrainingSpec\ncompress\n")  # the option, by name
    with pytest.raises((BadInputError, ValidationError), match="compress") as flagged:  # the CLI's flag
        options.training_spec(
            cli.build_parser().parse_args(
                ["run", "start", "--model", "m.keras", "--data", "d.npz", "--iterations", "3", "--compress", text]
            )
        )
    assert f"{text!r}: " in str(flagged.value)


def _spec(text: str) -> TrainingSpec:
    return TrainingSpec(compress=text)


def test_no_compression_is_the_dense_float32_format_byte_for_byte() -> None:
    vector = changes(3)
    plain = updates.encode(vector, samples=7)
    assert updates.encode(vector, 7, "gradient", updates.NONE, PLAN) == plain
    assert plain.metadata == {updates.METADATA: "1/0/0"} and len(plain.body) == HEADER_SIZE + 4 * SIZE
    assert [updates.part_range(PLAN, r, updates.NONE) for r in range(3)] == [
        updates.part_range(PLAN, r) for r in range(3)
    ]


def test_fp16_round_trip_at_half_the_bytes() -> None:
    vector = changes(4)
    vector[10], vector[11] = 1e6, -1e-9  # beyond float16's range: saturated; below its subnormals: zero
    data = encoded(FP16, vector)
    assert data.metadata == {updates.METADATA: "1/1/0"}
    assert len(data.body) == HEADER_SIZE + 2 * 110 + 4 * 3  # 110 trainable entries, 3 non-trainable
    decoded, samples = updates.decode(data.body, plan=PLAN, compression=FP16)
    assert samples == 7 and decoded.dtype == np.float32
    expected = np.clip(vector, -65504, 65504).astype(np.float16).astype(np.float32)
    expected[~TRAINABLE] = vector[~TRAINABLE]  # values, sent whole
    assert same_bits(decoded, expected)
    assert (decoded[10], decoded[11]) == (65504.0, 0.0)
    usual = TRAINABLE.copy()
    usual[[10, 11]] = False
    np.testing.assert_allclose(decoded[usual], vector[usual], rtol=1e-3, atol=1e-7)
    for shard, part in enumerate(parts_of(data.body, FP16)):
        layout = PLAN.shard(shard)
        assert same_bits(updates.decode_part(part, PLAN, shard, FP16), expected[layout.start : layout.stop])


def test_top_k_sends_the_largest_entries_of_each_part() -> None:
    vector = changes(5)
    data = encoded(TOPK, vector)
    assert data.metadata == {updates.METADATA: "1/2/0"}
    trainable_per_shard = [38, 35, 37]
    ks = [updates.top_k(TOPK, n) for n in trainable_per_shard]
    assert ks == [4, 4, 4]  # ⌈0.1·n⌉
    assert len(data.body) == HEADER_SIZE + 8 * sum(ks) + 4 * 3
    decoded, _ = updates.decode(data.body, plan=PLAN, compression=TOPK)
    for shard, part in enumerate(parts_of(data.body, TOPK)):
        layout = PLAN.shard(shard)
        own, got = vector[layout.start : layout.stop], updates.decode_part(part, PLAN, shard, TOPK)
        assert same_bits(got, decoded[layout.start : layout.stop])
        sent = np.flatnonzero(got[layout.trainable])
        largest = np.argsort(-np.abs(own[layout.trainable]))[: ks[shard]]
        assert sorted(sent) == sorted(largest), f"shard {shard}"
        assert same_bits(got[layout.trainable][sent], own[layout.trainable][sent])
        assert same_bits(got[~layout.trainable], own[~layout.trainable])  # non-trainable: whole


def test_top_k_counts_the_fraction_as_the_decimal_given() -> None:
    assert updates.top_k(updates.Compression.parse("topk:0.07"), 100) == 7  # 0.07·100 is 7.000000000000001
    assert updates.top_k(updates.Compression.parse("topk:0.01"), 25_000) == 250
    assert updates.top_k(updates.Compression.parse("topk:0.01"), 1) == 1
    assert updates.top_k(updates.Compression.parse("topk:1"), 9) == 9


def test_significance_sends_the_entries_that_changed_enough_relative_to_their_weight() -> None:
    vector, weights = changes(6), start_weights()
    vector[5] = 1e-5  # its weight is 0: 1e-5 / max(0, 1e-6) = 10 > 0.5
    data = encoded(SIGNIFICANCE, vector)
    assert data.metadata == {updates.METADATA: "1/3/0"}
    decoded, _ = updates.decode(data.body, plan=PLAN, compression=SIGNIFICANCE)
    significant = np.abs(vector) > 0.5 * np.maximum(np.abs(weights), updates.SIGNIFICANCE_EPS)
    expected = np.where(significant | ~TRAINABLE, vector, 0).astype(np.float32)
    assert same_bits(decoded, expected)
    assert 5 < (significant & TRAINABLE).sum() < 100 and significant[5]
    count = int((significant & TRAINABLE).sum())
    assert len(data.body) == HEADER_SIZE + 8 * 4 + 3 * 4 + 8 * count + 4 * 3  # table, counts, pairs, values
    for shard, part in enumerate(parts_of(data.body, SIGNIFICANCE)):
        layout = PLAN.shard(shard)
        assert same_bits(updates.decode_part(part, PLAN, shard, SIGNIFICANCE), expected[layout.start : layout.stop])


def test_sparse_sends_every_nonzero_trainable_entry_exactly() -> None:
    """An embedding-like update: most rows zero. What the reducers decode is the update, bit for bit (a zero left
    out decodes as +0, as a reducer's mean adds it), at 8 bytes per nonzero trainable entry."""
    vector = changes(8)
    rows = np.random.default_rng(9).random(SIZE) < 0.8
    vector[rows & TRAINABLE] = 0.0
    vector[6] = -0.0  # a negative zero is left out too
    vector[~TRAINABLE] = 0.0  # a non-trainable value of zero is sent all the same, whole
    data = encoded(SPARSE, vector)
    assert data.metadata == {updates.METADATA: "1/4/0"}
    decoded, samples = updates.decode(data.body, plan=PLAN, compression=SPARSE)
    assert samples == 7 and np.array_equal(decoded, vector) and decoded[6] == 0
    count = int(((vector != 0) & TRAINABLE).sum())
    assert 5 < count < 40
    assert len(data.body) == HEADER_SIZE + 8 * 4 + 3 * 4 + 8 * count + 4 * 3  # table, counts, pairs, values
    for shard, part in enumerate(parts_of(data.body, SPARSE)):
        layout = PLAN.shard(shard)
        assert np.array_equal(updates.decode_part(part, PLAN, shard, SPARSE), vector[layout.start : layout.stop])
    assert not SPARSE.lossy and not SPARSE.sparse  # exact: no residual, no warm-up


def test_a_significance_part_may_hold_nothing_but_its_count() -> None:
    data = encoded(SIGNIFICANCE, np.zeros(SIZE, dtype=np.float32)).body
    parts = parts_of(data, SIGNIFICANCE)
    assert [len(p) for p in parts] == [4, 4 + 12, 4]
    assert not updates.decode(data, plan=PLAN, compression=SIGNIFICANCE)[0].any()


@pytest.mark.parametrize("compression", [FP16, TOPK, SIGNIFICANCE, SPARSE], ids=str)
def test_an_encoding_the_run_does_not_send_is_refused_by_name(compression: updates.Compression) -> None:
    data = encoded(compression)
    for expected in {updates.NONE, FP16, TOPK, SIGNIFICANCE, SPARSE} - {compression}:
        named = (
            f"the update's encoding is {compression.encoding} \\({updates.ENCODINGS[compression.encoding]}\\),"
            f" but the run's compress option {expected} sends encoding {expected.encoding}"
        )
        with pytest.raises(UpdateFormatError, match=named):
            updates.check(data.metadata, "gradient", "updates/00001.bin", expected)
        with pytest.raises(UpdateFormatError, match=named):
            updates.decode(data.body, plan=PLAN, compression=expected)
    updates.check(data.metadata, "gradient", "part", compression)
    with pytest.raises(UpdateFormatError, match="holds a gradient, but the run averages a weight change"):
        updates.check(data.metadata, "weight change", "part", compression)


def _forge_pairs(part: bytes, offset: int, indices: list[int]) -> bytes:
    """``part`` with the indices of its first pairs (from byte ``offset``) replaced."""
    forged = bytearray(part)
    for number, index in enumerate(indices):
        struct.pack_into("<I", forged, offset + 8 * number, index)
    return bytes(forged)


@pytest.mark.parametrize("compression", [TOPK, SIGNIFICANCE, SPARSE], ids=str)
@pytest.mark.parametrize(
    ("indices", "named"),
    [
        ([0, 38], "index 38 lies outside the part's 38 entries"),
        ([3, 2**32 - 1], "index 4294967295 lies outside"),
        ([5, 5], "index 5 repeats or comes out of order"),
        ([9, 4], "index 4 repeats or comes out of order"),
    ],
)
def test_a_sparse_part_whose_indices_do_not_fit_is_refused_before_use(
    compression: updates.Compression, indices: list[int], named: str
) -> None:
    vector = changes(7)
    vector[[1, 2, 3]] = 50.0  # significant, and the largest: each part holds at least two pairs
    part = parts_of(encoded(compression, vector).body, compression)[0]
    forged = _forge_pairs(part, 4 if compression.tabled else 0, indices)
    with pytest.raises(UpdateFormatError, match=f"part of shard 0: {named}"):
        updates.decode_part(forged, PLAN, 0, compression)


@pytest.mark.parametrize("compression", [TOPK, SIGNIFICANCE, SPARSE], ids=str)
def test_a_sparse_pair_may_not_name_a_non_trainable_entry(compression: updates.Compression) -> None:
    vector = np.zeros(SIZE, dtype=np.float32)
    vector[[40, 41, 42, 43]] = 50.0  # shard 1 (38..75): 4 pairs; its non-trainable entries are 32..34 of the part
    part = parts_of(encoded(compression, vector).body, compression)[1]
    forged = _forge_pairs(part, 4 if compression.tabled else 0, [2, 3, 4, 33])
    with pytest.raises(UpdateFormatError, match="index 33 is a non-trainable entry"):
        updates.decode_part(forged, PLAN, 1, compression)


@pytest.mark.parametrize("compression", [updates.NONE, FP16, TOPK, SIGNIFICANCE, SPARSE], ids=str)
@pytest.mark.parametrize("change", [-1, 1, -8, 8])
def test_a_part_whose_length_does_not_match_is_refused(compression: updates.Compression, change: int) -> None:
    part = parts_of(encoded(compression).body, compression)[1]
    forged = part[:change] if change < 0 else part + b"\0" * change
    with pytest.raises(UpdateFormatError, match=r"part of shard 1 has \d+ bytes, expected"):
        updates.decode_part(forged, PLAN, 1, compression)


def test_a_significance_part_may_not_declare_more_pairs_than_its_trainable_entries() -> None:
    part = parts_of(encoded(SIGNIFICANCE).body, SIGNIFICANCE)[0]
    with pytest.raises(UpdateFormatError, match="declares 39 pairs, but the shard has 38 trainable entries"):
        updates.decode_part(struct.pack("<I", 39) + part[4:], PLAN, 0, SIGNIFICANCE)
    with pytest.raises(UpdateFormatError, match="too few for its count"):
        updates.decode_part(b"\1\0", PLAN, 0, SIGNIFICANCE)


@pytest.mark.parametrize(
    ("entries", "size"),
    [
        ((0, 40), None),  # inside the header
        ((64, 60), None),  # ends before it starts
        ((64, 64 + 3), None),  # shorter than its count
        ((64, 64 + 4 + 5), None),  # not a whole number of pairs
        ((64, 64 + 4 + 8 * 39), None),  # more pairs than trainable entries
        ((64, 64 + 4 + 8), 70),  # beyond the object's end
    ],
)
def test_a_significance_table_that_cannot_be_right_is_refused(entries: tuple[int, int], size: int | None) -> None:
    with pytest.raises(UpdateFormatError, match="the part table puts shard 0's part at bytes"):
        updates.significant_part_range(struct.pack("<QQ", *entries), PLAN, 0, size)
    assert updates.significant_part_range(struct.pack("<QQ", 64, 64 + 4 + 8), PLAN, 0, 76) == (64, 75)
    with pytest.raises(UpdateFormatError, match="entries of shard 0 have 8 bytes, expected 16"):
        updates.significant_part_range(b"\0" * 8, PLAN, 0, None)


@pytest.mark.parametrize("compression", [FP16, TOPK, SIGNIFICANCE, SPARSE], ids=str)
def test_whole_compressed_objects_that_do_not_add_up_are_refused(compression: updates.Compression) -> None:
    data = encoded(compression).body
    for forged in (data + b"\0" * 8, data[:-8]):
        with pytest.raises(UpdateFormatError):
            updates.decode(forged, plan=PLAN, compression=compression)
    other = ShardPlan.build([VariableSpec(name="a", shape=(5,), trainable=True)], 1)
    with pytest.raises(UpdateFormatError, match="declares 113 elements, the model has 5"):
        updates.decode(data, plan=other, compression=compression)
