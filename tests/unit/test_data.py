"""Datasets in S3 (moto) and the deterministic data order."""

from __future__ import annotations

import hashlib
import json
import tracemalloc

import numpy as np
import pytest

from slsml.aws.cache import LRUCache
from slsml.aws.storage import ObjectStore
from slsml.data import catalog, writer
from slsml.data import datasets as data
from slsml.data.manifest import DatasetOrigin
from slsml.data.writer import DatasetWriter
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError

from . import cloud


def arrays(seed: int, train: int = 50, test: int = 9) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((train + test, 3, 2)).astype(np.float32)
    y = rng.integers(0, 4, train + test).astype(np.int64)
    y[0] = 3
    return x[:train], y[:train], x[train:], y[train:]


# ---- data order ---------------------------------------------------------------------------------


def test_global_batch_is_deterministic() -> None:
    for iteration in (0, 3, 11, 250):
        first = data.global_batch_indices(103, 10, seed=5, iteration=iteration)
        again = data.global_batch_indices(103, 10, seed=5, iteration=iteration)
        np.testing.assert_array_equal(first, again)
        assert first.shape == (10,) and np.issubdtype(first.dtype, np.integer)
        assert ((first >= 0) & (first < 103)).all()
    assert not np.array_equal(
        data.global_batch_indices(103, 10, seed=5, iteration=0), data.global_batch_indices(103, 10, seed=6, iteration=0)
    )
    assert not np.array_equal(
        data.global_batch_indices(103, 10, seed=5, iteration=0), data.global_batch_indices(103, 10, seed=5, iteration=1)
    )


def test_each_epoch_is_a_permutation_and_epochs_differ() -> None:
    count, batch = 103, 10
    per_epoch = data.iterations_per_epoch(count, batch)
    assert per_epoch == 11  # ⌈103 / 10⌉, as Keras counts an epoch: the last batch the 3 samples left
    assert data.iterations_per_epoch(count, batch, least=3) == 11 and data.iterations_per_epoch(count, batch, 4) == 10
    epochs = []
    for epoch in range(3):
        batches = [data.global_batch_indices(count, batch, 1, epoch * per_epoch + i) for i in range(per_epoch)]
        assert [len(b) for b in batches] == [10] * 10 + [3]
        order = np.concatenate(batches)
        assert len(np.unique(order)) == len(order) == count, f"epoch {epoch} repeats or misses samples"
        epochs.append(order)
    short = [data.global_batch_indices(count, batch, 1, i, least=4) for i in range(11)]
    assert [len(b) for b in short] == [10] * 11  # the 3 left, fewer than 4 workers, sit the epoch out
    np.testing.assert_array_equal(short[10], data.global_batch_indices(count, batch, 1, 11)[:10])  # epoch 1 begins
    assert not np.array_equal(epochs[0], epochs[1])
    assert not np.array_equal(epochs[1], epochs[2])


def test_global_batch_larger_than_the_data_is_refused() -> None:
    with pytest.raises(BadInputError, match=r"larger than the training set \(9 samples\): give --batch 9 or less$"):
        data.global_batch_indices(9, 10, seed=0, iteration=0)


def test_global_batch_indices_accept_every_seed_a_training_spec_accepts() -> None:
    """A run's seed comes from TrainingSpec (CLI --seed); the worker feeds it to global_batch_indices."""
    try:
        spec = TrainingSpec(seed=-1)
    except ValueError:
        return  # negative seeds refused up front: fine
    batch = data.global_batch_indices(100, 10, seed=spec.seed, iteration=0)
    assert len(np.unique(batch)) == 10


def test_worker_slices_concatenate_to_the_batch() -> None:
    batch = data.global_batch_indices(200, 37, seed=2, iteration=4)
    for workers in (1, 2, 3, 5, 8, 37):
        slices = [data.worker_indices(batch, workers, w) for w in range(workers)]
        np.testing.assert_array_equal(np.concatenate(slices), batch)
        sizes = [len(s) for s in slices]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, sizes


# ---- datasets in S3 -----------------------------------------------------------------------------

RECORD = 3 * 2 * 4 + 8  # x (3, 2) float32, y int64
SEVEN = 7 * RECORD / 2**20  # shards of 7 records


def test_reader_takes_rows_across_shards(store: ObjectStore) -> None:
    x, y, x_test, y_test = arrays(0)
    manifest = data.put_dataset(store, "digits-1", x, y, x_test, y_test, shard_mb=SEVEN)
    assert manifest.train.count == 50 and len(manifest.train.shards) == 8
    assert manifest.test.count == 9 and len(manifest.test.shards) == 2
    assert manifest.x_shape == (3, 2) and manifest.classes == 4 and manifest.record_bytes == RECORD
    assert manifest.x_range == (float(min(x.min(), x_test.min())), float(max(x.max(), x_test.max())))
    for index, entry in enumerate(manifest.train.shards):
        body = store.get(keys.dataset_shard("digits-1", "train", index))
        assert (entry.bytes, entry.sha256) == (len(body), hashlib.sha256(body).hexdigest())
    for split in ("train", "test"):  # each shard under a prefix of its own
        stored = store.list_keys(keys.dataset_shards("digits-1", split))
        assert len({key.rsplit("/", 1)[0] for key in stored}) == len(stored) == len(manifest.split(split).shards)

    loaded = data.load_manifest(store, "digits-1")
    cached, ranged = data.DatasetReader(store, loaded, LRUCache(None)), data.DatasetReader(store, loaded)
    assert cached.cached("train") and not ranged.cached("train")
    rng = np.random.default_rng(1)
    for _ in range(5):
        indices = rng.choice(50, size=20, replace=True)  # unsorted, with repeats
        assert len(np.unique(indices // 7)) >= 3
        for reader in (cached, ranged):
            x_got, y_got = reader.take("train", indices)
            assert x_got.dtype == x.dtype and y_got.dtype == y.dtype
            np.testing.assert_array_equal(x_got, x[indices])
            np.testing.assert_array_equal(y_got, y[indices])
    test_indices = np.array([8, 0, 6, 7])
    for reader in (cached, ranged):
        x_got, y_got = reader.take("test", test_indices)
        np.testing.assert_array_equal(x_got, x_test[test_indices])
        np.testing.assert_array_equal(y_got, y_test[test_indices])
        x_all, y_all = reader.split("train")
        np.testing.assert_array_equal(x_all, x)
        np.testing.assert_array_equal(y_all, y)

    with cloud.gets_sent(store) as gets:
        cached.take("train", np.arange(50))  # every shard is cached by now
    assert gets == []


def test_a_ranged_reader_gets_only_the_records_it_uses(store: ObjectStore) -> None:
    x, y, x_test, y_test = arrays(0)
    manifest = data.put_dataset(store, "ranged", x, y, x_test, y_test, shard_mb=SEVEN)
    reader = data.DatasetReader(store, manifest)
    indices = np.array([16, 3, 4, 5, 15, 13, 14, 4, 40])  # records 3-5 of shard 0, 13 | 14-16 across shards 1 and 2
    with cloud.gets_sent(store) as gets:
        x_got, _ = reader.take("train", indices)
    np.testing.assert_array_equal(x_got, x[indices])
    assert sorted(gets) == sorted(
        [
            (keys.dataset_shard("ranged", "train", 0), f"bytes={3 * RECORD}-{6 * RECORD - 1}"),
            (keys.dataset_shard("ranged", "train", 1), f"bytes={6 * RECORD}-{7 * RECORD - 1}"),
            (keys.dataset_shard("ranged", "train", 2), f"bytes=0-{3 * RECORD - 1}"),
            (keys.dataset_shard("ranged", "train", 5), f"bytes={5 * RECORD}-{6 * RECORD - 1}"),
        ]
    )
    assert data.coalesce(indices, 7) == [(0, 3, 6), (1, 6, 7), (2, 0, 3), (5, 5, 6)]


def test_only_a_split_that_fits_the_caches_share_for_data_is_cached(store: ObjectStore) -> None:
    x, y, x_test, y_test = arrays(0)
    manifest = data.put_dataset(store, "sized", x, y, x_test, y_test, shard_mb=SEVEN)
    train_bytes = 50 * RECORD
    fits = LRUCache(int(train_bytes / data.DATA_CACHE_SHARE))
    too_small = LRUCache(int(train_bytes / data.DATA_CACHE_SHARE) - 1)
    assert data.DatasetReader(store, manifest, fits).cached("train")
    reader = data.DatasetReader(store, manifest, too_small)
    assert not reader.cached("train") and reader.cached("test")
    reader.take("train", np.arange(20))
    assert len(too_small) == 0, "a split past the cache's share for data left shards in it"


def test_the_writer_takes_chunks_of_any_length_and_stores_the_same_dataset(store: ObjectStore) -> None:
    x, y, x_test, y_test = arrays(4)
    whole = data.put_dataset(store, "whole", x, y, x_test, y_test, shard_mb=SEVEN)
    stored = []
    with DatasetWriter(
        store, "chunked", (3, 2), "float32", (), "int64", shard_mb=SEVEN, uploads=2, progress=stored.append
    ) as writer:
        for start, stop in ((0, 1), (1, 1), (1, 20), (20, 23), (23, 50)):
            writer.write("train", x[start:stop], y[start:stop])
            writer.write("test", x_test[start // 6 : stop // 6], y_test[start // 6 : stop // 6])
        writer.write("test", x_test[8:], y_test[8:])
        chunked = writer.finish()
    assert chunked.model_dump(exclude={"name"}) == whole.model_dump(exclude={"name"})
    assert sum(stored) == whole.train.bytes + whole.test.bytes
    for split, info in (("train", whole.train), ("test", whole.test)):
        for index in range(len(info.shards)):
            assert store.get(keys.dataset_shard("chunked", split, index)) == store.get(
                keys.dataset_shard("whole", split, index)
            )


def test_the_writer_holds_at_most_a_shard_per_split_and_those_in_upload_however_many_it_writes(
    store: ObjectStore,
) -> None:
    held: list[int] = []  # the bytes allocated by the writer's module and not yet freed, as each shard is sent
    mine = [tracemalloc.Filter(True, writer.__file__)]

    def count(**_: object) -> None:
        held.append(sum(trace.size for trace in tracemalloc.take_snapshot().filter_traces(mine).traces))

    store.s3.meta.events.register("before-send.s3.PutObject", count)
    x = np.random.default_rng(0).integers(0, 256, (256, 32, 32, 3), dtype=np.uint8)
    y = np.arange(256) % 10
    out = DatasetWriter.like(store, "bounded", x, y, shard_mb=0.5)
    shard_bytes = out.shard_records * out.dtype.itemsize
    tracemalloc.start()
    try:
        with out:
            for chunk in range(40 * out.shard_records // len(x)):  # 40 shards, one in five of the test split
                out.write("test" if chunk % 5 == 0 else "train", x, y)
            manifest = out.finish()
    finally:
        tracemalloc.stop()
    shards = len(manifest.train.shards) + len(manifest.test.shards)
    assert len(held) == shards + 1 and shards > 5 * (2 + writer.UPLOADS)  # each shard, then the manifest
    # a buffer per split and the shards in upload, beside small objects (without the bound on uploads the writer
    # held 33 shards here)
    assert max(held) <= (2 + writer.UPLOADS) * shard_bytes + 2**16


def test_an_interrupted_upload_is_continued_without_sending_stored_shards_again(store: ObjectStore) -> None:
    x, y, x_test, y_test = arrays(5)
    with (
        pytest.raises(RuntimeError),
        DatasetWriter(store, "resumed", (3, 2), "float32", (), "int64", shard_mb=SEVEN, uploads=1) as writer,
    ):
        writer.write("train", x[:30], y[:30])
        raise RuntimeError("interrupted")
    assert not store.exists(keys.dataset_manifest("resumed"))
    with pytest.raises(NotFoundError, match="'resumed' does not exist"):
        data.load_manifest(store, "resumed")
    stored = set(store.list_keys("datasets/resumed/"))
    assert len(stored) >= 3  # shards 0-2 (and 3, unless its upload had not begun)

    puts = []
    real_put = store.s3.put_object
    store.s3.put_object = lambda **kwargs: puts.append(kwargs["Key"]) or real_put(**kwargs)
    manifest = data.put_dataset(store, "resumed", x, y, x_test, y_test, shard_mb=SEVEN)
    assert sorted(puts) == sorted(set(store.list_keys("datasets/resumed/")) - stored)
    assert keys.dataset_manifest("resumed") in puts and len(puts) == 1 + len(manifest.train.shards) + len(
        manifest.test.shards
    ) - len(stored)
    reader = data.DatasetReader(store, manifest, LRUCache(None))
    np.testing.assert_array_equal(reader.split("train")[0], x)  # the cached reader checks every shard's checksum


def test_a_stored_shard_that_does_not_match_its_manifest_is_named(store: ObjectStore) -> None:
    x, y, x_test, y_test = arrays(6)
    manifest = data.put_dataset(store, "tampered", x, y, x_test, y_test, shard_mb=SEVEN)
    store.s3.put_object(Bucket=store.bucket, Key=keys.dataset_shard("tampered", "train", 2), Body=b"\0" * (7 * RECORD))
    with pytest.raises(BadInputError, match="'tampered': train shard 2 is not the one its manifest lists"):
        data.DatasetReader(store, manifest, LRUCache(None)).take("train", np.arange(20))
    store.s3.put_object(Bucket=store.bucket, Key=keys.dataset_shard("tampered", "train", 3), Body=b"short")
    with pytest.raises(BadInputError, match="train shard 3 is shorter than its manifest says"):
        data.DatasetReader(store, manifest).take("train", np.array([22, 23]))


def test_a_manifest_that_does_not_add_up_is_refused() -> None:
    entry = {"records": 7, "bytes": 7 * RECORD, "sha256": "0" * 64, "etag": '"0"'}
    manifest = {
        "name": "m",
        "x_shape": [3, 2],
        "x_dtype": "float32",
        "y_shape": [],
        "y_dtype": "int64",
        "classes": 4,
        "record_bytes": RECORD,
        "shard_records": 7,
        "train": {"count": 14, "shards": [entry, entry]},
        "test": {"count": 7, "shards": [entry]},
    }
    assert data.DatasetManifest.model_validate(manifest).train.bytes == 14 * RECORD
    for change, says in (
        ({"record_bytes": 40}, "take 32 bytes, not 40"),
        ({"train": {"count": 15, "shards": [entry, entry]}}, "train shards hold 14 records, not 15"),
        ({"test": {"count": 6, "shards": [{**entry, "records": 6}]}}, "test shard 0 of 6 records"),
    ):
        with pytest.raises(ValueError, match=says):
            data.DatasetManifest.model_validate({**manifest, **change})


def test_a_dataset_of_the_old_format_is_named(store: ObjectStore) -> None:
    store.put_json_new(keys.dataset_manifest("old"), {"schema_version": 1, "name": "old"})
    with pytest.raises(BadInputError, match="'old' is stored in format 1"):
        data.load_manifest(store, "old")


def test_a_dataset_of_shards_under_one_prefix_is_refused_passed_over_and_removable(store: ObjectStore) -> None:
    origin = DatasetOrigin(format="npy", sha256="0" * 64, test_fraction=0.2, seed=0)
    for name in ("a-old", "b-new"):  # the same source, stored by an slsml of format 2 and by this one
        with DatasetWriter.like(store, name, *arrays(7)[:2], shard_mb=SEVEN) as writer:
            writer.write("train", *arrays(7)[:2])
            writer.write("test", *arrays(7)[2:])
            writer.finish(origin)
    old = store.get_json(keys.dataset_manifest("a-old")) | {"schema_version": 2}
    store.s3.put_object(Bucket=store.bucket, Key=keys.dataset_manifest("a-old"), Body=json.dumps(old).encode())
    with pytest.raises(BadInputError, match=r"'a-old' is stored in format 2, .*: remove it \(`slsml data rm a-old`"):
        data.load_manifest(store, "a-old")
    found = catalog.same_origin(store, origin)  # the old one is not the source's dataset: the new one is
    assert found is not None and found.name == "b-new"
    listed = catalog.listing(store)  # the old one is listed, with what to do, beside the readable one
    assert [d["name"] for d in listed] == ["a-old", "b-new"] and "`slsml data rm a-old`" in listed[0]["unreadable"]
    assert listed[1] == catalog.summary(found)
    objects = store.list_keys("datasets/a-old/")
    assert catalog.remove(store, "a-old") == len(objects) and not store.list_keys("datasets/a-old/")
    assert catalog.same_origin(store, origin) == found and [d["name"] for d in catalog.listing(store)] == ["b-new"]


def test_put_dataset_refuses_an_existing_name(store: ObjectStore) -> None:
    first = arrays(0)
    data.put_dataset(store, "mine", *first, shard_mb=SEVEN)
    objects = {key: store.get(key) for key in store.list_keys("datasets/mine/")}

    with pytest.raises(BadInputError, match="'mine' already exists"):
        data.put_dataset(store, "mine", *arrays(1), shard_mb=SEVEN)

    assert {key: store.get(key) for key in store.list_keys("datasets/mine/")} == objects
    reader = data.DatasetReader(store, data.load_manifest(store, "mine"))
    np.testing.assert_array_equal(reader.split("train")[0], first[0])
    np.testing.assert_array_equal(reader.split("test")[1], first[3])


def test_put_dataset_does_not_serve_shards_left_by_an_interrupted_upload(store: ObjectStore) -> None:
    """An upload of other data that died after some shards (no manifest yet) must not leave them in the next
    upload's dataset: the next upload is refused, naming the shard."""
    store.put_new(keys.dataset_shard("retry", "train", 0), np.full(7 * RECORD, 99, np.uint8).tobytes())
    with pytest.raises(BadInputError, match="'retry': train shard 0 stored by an earlier upload holds other data"):
        data.put_dataset(store, "retry", *arrays(2), shard_mb=SEVEN)
    assert not store.exists(keys.dataset_manifest("retry"))


@pytest.mark.parametrize(
    ("name", "mangle", "message"),
    [
        ("Bad_Name", lambda a: a, "dataset name 'Bad_Name'"),
        ("", lambda a: a, "dataset name ''"),
        ("-lead", lambda a: a, "dataset name '-lead'"),
        ("x" * 64, lambda a: a, "must be 1-63"),
        ("trailing\n", lambda a: a, "dataset name 'trailing\\n'"),
        ("short-y", lambda a: (a[0], a[1][:-1], a[2], a[3]), "training data: x has 50 samples but y has 49"),
        ("short-test", lambda a: (a[0], a[1], a[2][:3], a[3]), "test data: x has 3 samples but y has 9"),
        ("nan", lambda a: (np.where(np.arange(50)[:, None, None] == 4, np.nan, a[0]), *a[1:]), "NaN"),
        ("inf-test", lambda a: (*a[:2], np.full_like(a[2], np.inf), a[3]), "test data: x contains NaN or Inf"),
        ("empty", lambda a: (a[0][:0], a[1][:0], a[2], a[3]), "no samples"),
        ("strings", lambda a: (a[0], a[1].astype(str), a[2], a[3].astype(str)), "non-numeric"),
        ("shapes", lambda a: (a[0], a[1], a[2].reshape(9, 6), a[3]), "differ in shape"),
    ],
)
def test_put_dataset_refuses_bad_inputs(store: ObjectStore, name: str, mangle, message: str) -> None:
    original = arrays(0)
    data.put_dataset(store, "first", *original, shard_mb=SEVEN)
    before = {key: store.get(key) for key in store.list_keys("")}

    with pytest.raises(BadInputError) as raised:
        data.put_dataset(store, name, *mangle(arrays(3)), shard_mb=SEVEN)
    assert message in str(raised.value)

    assert {key: store.get(key) for key in store.list_keys("")} == before, "a refused upload wrote objects"
    reader = data.DatasetReader(store, data.load_manifest(store, "first"))
    np.testing.assert_array_equal(reader.split("train")[0], original[0])


def test_the_writer_names_a_chunk_unlike_the_dataset(store: ObjectStore) -> None:
    x, y, _, _ = arrays(0)
    with DatasetWriter(store, "typed", (3, 2), "float32", (), "int64", shard_mb=SEVEN) as writer:
        with pytest.raises(
            BadInputError,
            match=r"training data: x samples are float64\[3, 2\] where the dataset's "
            r"are float32\[3, 2\]",
        ):
            writer.write("train", x.astype(np.float64), y)
        with pytest.raises(
            BadInputError,
            match=r"test data: y samples are int64\[2\] where the dataset's are "
            r"int64\[\]",
        ):
            writer.write("test", x[:4], y[:8].reshape(4, 2))
        writer.write("train", x, y)
        with pytest.raises(BadInputError, match="test data: no samples"):
            writer.finish()
    assert not store.exists(keys.dataset_manifest("typed"))
