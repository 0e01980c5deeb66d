"""Datasets in S3 (moto) and the deterministic data order."""

from __future__ import annotations

import io
from collections.abc import Iterator

import boto3
import numpy as np
import pytest
from moto import mock_aws

from slsml.aws.storage import ObjectStore
from slsml.data import datasets as data
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError

BUCKET = "slsml-unit-tests"


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectStore]:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield ObjectStore(s3, BUCKET)


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
    assert per_epoch == 10
    epochs = []
    for epoch in range(3):
        order = np.concatenate(
            [data.global_batch_indices(count, batch, 1, epoch * per_epoch + i) for i in range(per_epoch)]
        )
        assert len(np.unique(order)) == len(order) == per_epoch * batch, f"epoch {epoch} repeats samples"
        epochs.append(order)
    assert not np.array_equal(epochs[0], epochs[1])
    assert not np.array_equal(epochs[1], epochs[2])


def test_global_batch_larger_than_the_data_is_refused() -> None:
    with pytest.raises(BadInputError, match="larger than the training set"):
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


def test_reader_takes_rows_across_shards(store: ObjectStore) -> None:
    x, y, x_test, y_test = arrays(0)
    manifest = data.put_dataset(store, "digits-1", x, y, x_test, y_test, shard_size=7)
    assert manifest.train.count == 50 and manifest.train.shards == 8
    assert manifest.test.count == 9 and manifest.test.shards == 2
    assert manifest.x_shape == (3, 2) and manifest.classes == 4
    assert manifest.x_range == (float(min(x.min(), x_test.min())), float(max(x.max(), x_test.max())))

    reader = data.DatasetReader(store, data.load_manifest(store, "digits-1"))
    rng = np.random.default_rng(1)
    for _ in range(5):
        indices = rng.choice(50, size=20, replace=True)  # unsorted, with repeats
        assert len(np.unique(indices // 7)) >= 3
        x_got, y_got = reader.take("train", indices)
        assert x_got.dtype == x.dtype and y_got.dtype == y.dtype
        np.testing.assert_array_equal(x_got, x[indices])
        np.testing.assert_array_equal(y_got, y[indices])
    test_indices = np.array([8, 0, 6, 7])
    x_got, y_got = reader.take("test", test_indices)
    np.testing.assert_array_equal(x_got, x_test[test_indices])
    np.testing.assert_array_equal(y_got, y_test[test_indices])
    x_all, y_all = reader.split("train")
    np.testing.assert_array_equal(x_all, x)
    np.testing.assert_array_equal(y_all, y)

    gets = []
    real_get = store.s3.get_object
    store.s3.get_object = lambda **kwargs: gets.append(kwargs["Key"]) or real_get(**kwargs)
    reader.take("train", np.arange(50))  # every shard is cached by now
    assert gets == []


def test_put_dataset_refuses_an_existing_name(store: ObjectStore) -> None:
    first = arrays(0)
    data.put_dataset(store, "mine", *first, shard_size=7)
    objects = {key: store.get(key) for key in store.list_keys("datasets/mine/")}

    with pytest.raises(BadInputError, match="'mine' already exists"):
        data.put_dataset(store, "mine", *arrays(1), shard_size=7)

    assert {key: store.get(key) for key in store.list_keys("datasets/mine/")} == objects
    reader = data.DatasetReader(store, data.load_manifest(store, "mine"))
    np.testing.assert_array_equal(reader.split("train")[0], first[0])
    np.testing.assert_array_equal(reader.split("test")[1], first[3])


def test_put_dataset_does_not_serve_shards_left_by_an_interrupted_upload(store: ObjectStore) -> None:
    """An upload that died after some shards (no manifest yet) must not leave them in the next upload's dataset."""
    stale = io.BytesIO()
    np.savez(stale, x=np.full((7, 3, 2), 99.0, np.float32), y=np.zeros(7, np.int64))
    store.put_new(keys.dataset_shard("retry", "train", 0), stale.getvalue())

    x, y, x_test, y_test = arrays(2)
    try:
        manifest = data.put_dataset(store, "retry", x, y, x_test, y_test, shard_size=7)
    except BadInputError:
        return  # refusing is acceptable too
    x_got, _ = data.DatasetReader(store, manifest).split("train")
    np.testing.assert_array_equal(x_got, x, err_msg="the dataset serves a stale shard of an earlier upload")


@pytest.mark.parametrize(
    ("name", "mangle", "message"),
    [
        ("Bad_Name", lambda a: a, "dataset name 'Bad_Name'"),
        ("", lambda a: a, "dataset name ''"),
        ("-lead", lambda a: a, "dataset name '-lead'"),
        ("x" * 64, lambda a: a, "must be 1-63"),
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
    data.put_dataset(store, "first", *original, shard_size=7)
    before = {key: store.get(key) for key in store.list_keys("")}

    with pytest.raises(BadInputError) as raised:
        data.put_dataset(store, name, *mangle(arrays(3)), shard_size=7)
    assert message in str(raised.value)

    assert {key: store.get(key) for key in store.list_keys("")} == before, "a refused upload wrote objects"
    reader = data.DatasetReader(store, data.load_manifest(store, "first"))
    np.testing.assert_array_equal(reader.split("train")[0], original[0])
