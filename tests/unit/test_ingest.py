"""Ingest streams a source into a dataset (moto's S3): held-out split by index, the origin kept, an interrupted
upload (of a file, of Python batches or of a tf.data.Dataset) continued without sending its stored shards again, and
one of other data refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import numpy as np
import pytest
from moto import mock_aws

from slsml.aws.storage import ObjectStore
from slsml.data import datasets as data
from slsml.data import ingest, sources
from slsml.spec import keys
from slsml.spec.errors import BadInputError

from . import cloud

BUCKET = "slsml-unit-tests"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def puts(client: object) -> list[str]:
    """The keys of every PutObject the client sends from now on."""
    sent: list[str] = []
    client.meta.events.register("before-parameter-build.s3.PutObject", lambda params, **_: sent.append(params["Key"]))
    return sent


def stop_after(samples: int) -> Callable[[int], None]:
    """An ingest's progress that interrupts it (KeyboardInterrupt) once ``samples`` samples are read."""
    read = [0]

    def progress(count: int) -> None:
        read[0] += count
        if read[0] >= samples:
            raise KeyboardInterrupt

    return progress


def test_a_source_streams_into_a_dataset_with_its_origin(s3, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((3000, 6)).astype(np.float32), rng.integers(0, 5, 3000)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    store = ObjectStore(s3, BUCKET)
    source = sources.open_source(tmp_path / "d.npz")
    origin = ingest.origin_of(tmp_path / "d.npz", source, 0.25, 3)
    manifest = ingest.put(store, "d", source, test_fraction=0.25, seed=3, shard_mb=0.01, origin=lambda: origin)
    test = ingest.held_out(0, 3000, 0.25, 3, 3000)
    assert (manifest.train.count, manifest.test.count) == ((~test).sum(), test.sum())
    assert len(manifest.train.shards) > 3
    reader = data.DatasetReader(store, data.load_manifest(store, "d"))
    for split, rows in (("train", ~test), ("test", test)):
        got_x, got_y = reader.split(split)
        np.testing.assert_array_equal(got_x, x[rows])
        np.testing.assert_array_equal(got_y, y[rows])
    assert data.load_manifest(store, "d").origin == origin
    assert origin.sha256 == ingest.checksum(tmp_path / "d.npz") != ingest.checksum(tmp_path)


def test_an_interrupted_ingest_continues_and_other_data_is_refused(s3, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((4000, 10)).astype(np.float32), y=rng.integers(0, 3, 4000))
    store = ObjectStore(s3, BUCKET)
    with pytest.raises(KeyboardInterrupt):
        ingest.put(store, "d", sources.open_source(tmp_path / "d.npz"), shard_mb=0.02, progress=stop_after(2500))
    assert not store.exists(keys.dataset_manifest("d"))
    stored = {key for key in store.list_keys("datasets/d/")}
    assert stored
    sent = puts(s3)
    manifest = ingest.put(store, "d", sources.open_source(tmp_path / "d.npz"), shard_mb=0.02)
    assert set(sent).isdisjoint(stored) and keys.dataset_manifest("d") in sent
    assert manifest.train.count + manifest.test.count == 4000

    with pytest.raises(KeyboardInterrupt):
        ingest.put(store, "e", sources.open_source(tmp_path / "d.npz"), shard_mb=0.02, progress=stop_after(2500))
    other = r"dataset 'e': (train|test) shard \d+ stored by an earlier upload holds other data"  # the first one checked
    with pytest.raises(BadInputError, match=other):
        ingest.put(store, "e", sources.open_source(tmp_path / "d.npz"), seed=1, shard_mb=0.02)
    assert not store.exists(keys.dataset_manifest("e"))
    with pytest.raises(BadInputError, match=r"dataset 'd' already exists; .* remove it first \(`slsml data rm d`"):
        ingest.put(store, "d", sources.open_source(tmp_path / "d.npz"), shard_mb=0.02)


def test_an_interrupted_upload_of_python_batches_continues_and_other_batches_are_refused(s3) -> None:
    store = ObjectStore(s3, BUCKET)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((3000, 10)).astype(np.float32), rng.integers(0, 4, 3000)

    def batches(fail_at: int | None = None, end: int = 3000, changed: int = -1) -> Iterator[tuple]:
        for start in range(0, end, 200):
            if start == fail_at:
                raise ConnectionError("the source went away")
            batch = slice(start, min(start + 200, end))
            yield np.where((np.arange(3000) == changed)[batch, None], 0.5, x[batch]), y[batch]

    def put(name: str, own_test: bool = False, **how) -> data.DatasetManifest:
        """Ingest ``batches(**how)``: a held-out fraction of them the test split, or (``own_test``) 100 more."""
        source = sources.from_python(batches(**how))
        if own_test:
            source.test = sources.from_python(x[:100], y[:100])
        return ingest.put(store, name, source, shard_mb=0.01)

    with pytest.raises(ConnectionError):
        put("it", fail_at=2000)
    stored = set(store.list_keys("datasets/it/"))
    assert stored and keys.dataset_manifest("it") not in stored
    sent = puts(s3)
    manifest = put("it")
    assert set(sent).isdisjoint(stored) and sent[-1] == keys.dataset_manifest("it")  # the manifest last
    assert set(store.list_keys("datasets/it/")) == stored | set(sent)
    got_x, got_y = data.DatasetReader(store, manifest).split("train")
    train = ~ingest.held_out(0, 3000, 0.2, 0, 3000)
    np.testing.assert_array_equal(got_x, x[train])
    np.testing.assert_array_equal(got_y, y[train])

    def last_stored(name: str, own_test: bool = False) -> int:
        """The last train shard that an upload of ``name`` interrupted at sample 2,000 stored."""
        with pytest.raises(ConnectionError):
            put(name, own_test, fail_at=2000)
        stored = store.list_keys(keys.dataset_shards(name, "train"))
        return max(index for key in stored if (index := keys.dataset_shard_index(name, "train", key)) is not None)

    shard = last_stored("other")
    changed = int(np.flatnonzero(train)[shard * manifest.shard_records + 5])  # one sample of that shard
    with pytest.raises(BadInputError, match=rf"'other': train shard {shard} stored by an earlier upload holds other"):
        put("other", changed=changed)
    shard = last_stored("short", own_test=True)  # every sample a training sample
    with pytest.raises(BadInputError, match=rf"'short': train shard {shard} stored by an earlier upload lies past"):
        put("short", own_test=True, end=shard * manifest.shard_records)  # the samples of the shards before it
    assert not store.exists(keys.dataset_manifest("other")) and not store.exists(keys.dataset_manifest("short"))


def test_bad_input_midway_leaves_no_dataset_visible(s3) -> None:
    from slsml.data import catalog

    store = ObjectStore(s3, BUCKET)
    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((500, 8)).astype(np.float32), rng.integers(0, 2, 500)) for _ in range(6)]
    batches[4][0][123, 5] = np.inf
    with pytest.raises(BadInputError, match=r"the \(x, y\) batches \(samples 2\d{3}–\d+\): x contains NaN or Inf"):
        ingest.put(store, "bad", sources.from_python(batches), shard_mb=0.01)
    assert store.list_keys("datasets/bad/")  # shards went up before the bad batch came
    assert not catalog.exists(store, "bad") and catalog.listing(store) == []


def test_the_origin_covers_the_files_a_source_reads_and_how(tmp_path: Path) -> None:
    x, y = np.arange(60, dtype=np.float32).reshape(20, 3), np.arange(20) % 2
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "y2.npy", 1 - y)

    def origin(labels: str, fraction: float = 0.2):
        source = sources.open_source(tmp_path / "x.npy", labels_file=tmp_path / labels)
        return ingest.origin_of(tmp_path / "x.npy", source, fraction, seed=0)

    assert origin("y.npy") == origin("y.npy")
    assert origin("y.npy").sha256 != origin("y2.npy").sha256
    assert origin("y.npy") != origin("y.npy", fraction=0.3)


def test_sample_weights_of_an_npz_and_of_a_table_column_are_stored_with_their_samples(s3, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(4)
    x, y, w = rng.standard_normal((2500, 3)).astype(np.float32), rng.integers(0, 3, 2500), rng.uniform(0, 4, 2500)
    np.savez(tmp_path / "w.npz", x=x, y=y, w=w)
    pq.write_table(
        pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": y, "importance": w}), tmp_path / "w.parquet"
    )
    store = ObjectStore(s3, BUCKET)
    test = ingest.held_out(0, 2500, 0.2, 0, 2500)
    for name, path, options in (
        ("npz", "w.npz", {}),
        ("table", "w.parquet", {"label": "label", "weight": "importance"}),
    ):
        source = sources.open_source(tmp_path / path, **options)
        manifest = ingest.put(store, name, source, test_fraction=0.2, seed=0, shard_mb=0.01)
        assert manifest.weighted and manifest.record_bytes == 12 + 8 + 4
        reader = data.DatasetReader(store, data.load_manifest(store, name))
        for split, rows in (("train", ~test), ("test", test)):
            got_x, got_y, got_w = reader.take_weighted(split, np.arange(rows.sum())[::-1])
            np.testing.assert_array_equal(got_x, x[rows][::-1])  # the weight column is no feature
            np.testing.assert_array_equal(got_y, y[rows][::-1])
            np.testing.assert_array_equal(got_w, w[rows][::-1].astype(np.float32))
    assert data.DatasetReader(store, data.load_manifest(store, "npz")).take_weighted("train", [0])[2] is not None


@pytest.mark.parametrize(
    ("w", "message"),
    [
        (np.full(40, -1.0), r"sample weights must be finite numbers from 0 \(sample 0's is -1.0\)"),
        (np.full(39, 1.0), r"w \(sample weights\) has shape \(39,\), where x has 40 samples"),
        (np.where(np.arange(40) == 7, np.nan, 1.0), r"sample 7's is nan"),
    ],
)
def test_bad_sample_weights_are_refused_in_one_line_and_nothing_is_stored(s3, tmp_path: Path, w, message) -> None:
    x, y = np.zeros((40, 2), np.float32), np.zeros(40, np.int64)
    np.savez(tmp_path / "bad.npz", x=x, y=y, w=w)
    store = ObjectStore(s3, BUCKET)
    with pytest.raises(BadInputError, match=message):
        ingest.put(store, "bad", sources.open_source(tmp_path / "bad.npz"))
    assert not store.exists(keys.dataset_manifest("bad"))


def test_named_arrays_put_from_python_and_from_an_npz_are_read_back_by_name(s3, tmp_path: Path) -> None:
    """x and y as named arrays (a model of several inputs and outputs): each sample's record holds all of its arrays
    at fixed offsets, the manifest lists them, and a sample reads back whole by one ranged GET."""
    rng = np.random.default_rng(4)
    x = {"image": rng.random((60, 4, 4, 1), dtype=np.float32), "tokens": rng.integers(0, 300, (60, 5))}
    y = {"label": rng.integers(0, 3, 60), "size": rng.random(60, dtype=np.float32)}
    store = ObjectStore(s3, BUCKET)
    first = {k: v[:45] for k, v in x.items()}, {k: v[:45] for k, v in y.items()}
    rest = {k: v[45:] for k, v in x.items()}, {k: v[45:] for k, v in y.items()}
    manifest = data.put_dataset(store, "named", *first, *rest, shard_mb=0.001)
    assert [(a.name, a.shape, a.dtype, a.range) for a in manifest.x_arrays] == [
        ("image", (4, 4, 1), "float32", (float(x["image"].min()), float(x["image"].max()))),
        ("tokens", (5,), "int64", (float(x["tokens"].min()), float(x["tokens"].max()))),
    ]
    assert [a.name for a in manifest.y_arrays] == ["label", "size"] and manifest.x_shape is None
    assert manifest.record_bytes == 4 * 16 + 8 * 5 + 8 + 4 and len(manifest.train.shards) > 1
    reader = data.DatasetReader(store, data.load_manifest(store, "named"))
    picked = np.array([44, 3, 17])
    with cloud.gets_sent(store) as sent:
        got_x, got_y = reader.take("train", picked[:1])
    assert len(sent) == 1 and sent[0][1] is not None, "one ranged GET"
    got_x, got_y = reader.take("train", picked)
    for name in x:
        np.testing.assert_array_equal(got_x[name], x[name][picked])
    for name in y:
        np.testing.assert_array_equal(got_y[name], y[name][picked])
    test_x, _ = reader.split("test")
    np.testing.assert_array_equal(test_x["tokens"], x["tokens"][45:])

    np.savez(
        tmp_path / "n.npz",
        **{f"x_{k}": v for k, v in x.items()},
        **{f"y_{k}": v for k, v in y.items()},
        **{f"x_test_{k}": v[:7] for k, v in x.items()},
        **{f"y_test_{k}": v[:7] for k, v in y.items()},
    )
    stored = ingest.put(store, "named-npz", sources.open_source(tmp_path / "n.npz"))
    assert [a.name for a in stored.x_arrays] == ["image", "tokens"] and stored.test.count == 7
    got_x, got_y = data.DatasetReader(store, stored).split("train")
    np.testing.assert_array_equal(got_x["image"], x["image"])
    np.testing.assert_array_equal(got_y["label"], y["label"])
    streamed = ingest.put(store, "named-python", sources.from_python(x, y), test_fraction=0.25, shard_mb=0.001)
    test = ingest.held_out(0, 60, 0.25, 0, 60)
    assert (streamed.train.count, streamed.test.count) == ((~test).sum(), test.sum())
    got_x, _ = data.DatasetReader(store, streamed).split("test")
    np.testing.assert_array_equal(got_x["tokens"], x["tokens"][test])


def test_named_arrays_of_different_lengths_or_names_are_refused_with_nothing_stored(s3) -> None:
    store = ObjectStore(s3, BUCKET)
    x, y = {"a": np.zeros((5, 2), np.float32), "b": np.zeros((4,), np.float32)}, np.zeros(5, np.int64)
    with pytest.raises(BadInputError, match=r"^training data: the named arrays hold different numbers of samples"):
        data.put_dataset(store, "bad", x, y, {"a": x["a"][:2], "b": x["a"][:2, 0]}, y[:2])
    good = {"a": np.zeros((5, 2), np.float32), "b": np.zeros((5,), np.float32)}
    with pytest.raises(BadInputError, match=r"^train and test samples differ in shape: x a \(2,\) float32, b"):
        data.put_dataset(store, "bad", good, y, {"a": good["a"][:2], "c": good["b"][:2]}, y[:2])
    assert not store.list_keys("datasets/")


def test_an_interrupted_upload_of_a_tf_dataset_continues_from_the_same_call(s3) -> None:
    import tensorflow as tf

    store = ObjectStore(s3, BUCKET)
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((3000, 10)).astype(np.float32), rng.integers(0, 4, 3000)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(128)

    def put(name: str, batches: tf.data.Dataset, **how) -> data.DatasetManifest:
        return ingest.put(store, name, sources.from_python(batches), shard_mb=0.01, **how)

    with pytest.raises(KeyboardInterrupt):
        put("tf", dataset, progress=stop_after(2000))
    stored = set(store.list_keys("datasets/tf/"))
    assert len(stored) > 3 and keys.dataset_manifest("tf") not in stored
    sent = puts(s3)
    manifest = put("tf", dataset)  # the same call: the dataset read anew, its stored shards verified, not sent
    assert set(sent).isdisjoint(stored) and sent[-1] == keys.dataset_manifest("tf")
    assert set(store.list_keys("datasets/tf/")) == stored | set(sent)
    got_x, got_y = data.DatasetReader(store, manifest).split("train")
    train = ~ingest.held_out(0, 3000, 0.2, 0, 3000)
    np.testing.assert_array_equal(got_x, x[train])
    np.testing.assert_array_equal(got_y, y[train])

    # a dataset that reshuffles each time it is read gives other data: its stored shards are refused
    shuffled = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(3000, seed=1).batch(128)
    with pytest.raises(KeyboardInterrupt):
        put("shuffled", shuffled, progress=stop_after(2000))
    with pytest.raises(BadInputError, match=r"'shuffled': (train|test) shard \d+ stored by an earlier upload holds"):
        put("shuffled", shuffled)
    assert not store.exists(keys.dataset_manifest("shuffled"))


def test_an_npz_named_as_kerass_datasets_name_their_arrays_is_put_as_x_and_y(s3, tmp_path: Path) -> None:
    """``x_train``, ``y_train``, ``x_test``, ``y_test`` (as ``keras.datasets``' ``mnist.npz`` holds them) are the
    training and test parts, not an input named ``train``; where the parts are named unalike, the error names both."""
    rng = np.random.default_rng(5)
    x, y = rng.random((50, 3, 3), dtype=np.float32), rng.integers(0, 10, 50).astype(np.uint8)
    np.savez(tmp_path / "mnist.npz", x_train=x[:40], y_train=y[:40], x_test=x[40:], y_test=y[40:])
    store = ObjectStore(s3, BUCKET)
    stored = ingest.put(store, "mnist", sources.open_source(tmp_path / "mnist.npz"))
    assert stored.x_shape == (3, 3) and stored.train.count == 40 and stored.test.count == 10
    got_x, got_y = data.DatasetReader(store, stored).split("train")
    np.testing.assert_array_equal(got_x, x[:40])
    np.testing.assert_array_equal(got_y, y[:40])
    np.savez(tmp_path / "unalike.npz", x_tr=x[:40], y_tr=y[:40], x_test=x[40:], y_test=y[40:])
    with pytest.raises(
        BadInputError, match=r"x is one array where the dataset's first samples' is named arrays \('tr'\): give"
    ):
        ingest.put(store, "unalike", sources.open_source(tmp_path / "unalike.npz"))
