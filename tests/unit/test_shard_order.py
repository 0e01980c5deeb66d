"""The shard order: every record once per epoch, the same batches whatever the workers, and a reader that fetches
each lane's window once."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import numpy as np
import pytest
from moto import mock_aws
from pydantic import ValidationError

from slsml.aws.cache import LRUCache
from slsml.aws.storage import ObjectStore
from slsml.data import datasets as data
from slsml.data.shardorder import ShardOrder
from slsml.spec.config import TrainingSpec

COUNTS = (40, 40, 40, 40, 23)  # records of 5 shards of 40, the last shorter: 183


def order(seed: int = 3, batch: int = 8, buffer: int = 4) -> ShardOrder:
    return ShardOrder(COUNTS, 40, batch, buffer, seed)


def epoch_batches(o: ShardOrder, epoch: int) -> list[np.ndarray]:
    return [o.batch(epoch * o.lane_length + p, np.arange(o.global_batch)) for p in range(o.lane_length)]


def test_every_record_is_used_once_an_epoch_and_epochs_differ() -> None:
    o = order()
    assert o.lane_length == 183 // 8 == 22
    valid = {shard * 40 + r for shard, n in enumerate(COUNTS) for r in range(n)}
    epochs = []
    for epoch in range(3):
        used = np.concatenate(epoch_batches(o, epoch))
        assert len(used) == len(set(used.tolist())) == 22 * 8, f"epoch {epoch} repeats a record"
        assert set(used.tolist()) <= valid
        epochs.append(used)
    assert not np.array_equal(epochs[0], epochs[1]) and set(epochs[0]) != set(epochs[1])  # other records sit out
    assert not np.array_equal(epochs[0], np.concatenate(epoch_batches(order(seed=4), 0)))
    np.testing.assert_array_equal(epochs[0], np.concatenate(epoch_batches(order(), 0)))  # seeded


def test_a_batch_takes_one_record_of_each_lane_and_a_lane_walks_its_stretch() -> None:
    o = order()
    first = o.batch(0, np.arange(8))
    assert len({int(i) // 40 for i in first}) >= 4, "a batch mixes records of most shards"
    lane = np.array([o.batch(p, np.array([2]))[0] for p in range(o.lane_length)])
    for window in range(0, o.lane_length, o.buffer):  # each window: consecutive records, shuffled
        part = np.sort(lane[window : window + o.buffer])
        positions = {i // 40 for i in part}
        assert len(positions) <= 2 and len(part) == len(set(part.tolist()))


@pytest.mark.parametrize("workers", [1, 3, 5, 8])
def test_the_batches_do_not_depend_on_the_workers(workers: int) -> None:
    o = order()
    spec = TrainingSpec(workers=workers, global_batch=8, shuffle="shards", shuffle_buffer=4, seed=3,
                        algorithm="average", local_steps=3)
    for iteration in (0, 7, 15):
        slices = [data.round_batches(spec, 183, workers, w, iteration, o) for w in range(workers)]
        for k, number in enumerate(data.round_numbers(spec, iteration)):
            np.testing.assert_array_equal(np.concatenate([s[k] for s in slices]), o.batch(number, np.arange(8)))


def test_the_spec_names_what_the_shard_order_does_not_take() -> None:
    with pytest.raises(ValidationError, match="shuffle is an option of algorithm gradient or average only"):
        TrainingSpec(algorithm="admm", shuffle="shards")
    with pytest.raises(ValidationError, match="shuffle_buffer applies to shuffle shards only"):
        TrainingSpec(shuffle_buffer=16)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectStore]:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="shard-order")
        yield ObjectStore(s3, "shard-order")


def test_a_reader_fetches_each_lanes_window_once(store: ObjectStore) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((183, 3)).astype(np.float32), rng.integers(0, 5, 183)
    record = 3 * 4 + 8
    manifest = data.put_dataset(store, "lanes", x, y, x[:5], y[:5], shard_mb=40 * record / 2**20)
    spec = TrainingSpec(workers=2, global_batch=8, shuffle="shards", shuffle_buffer=4, seed=3)
    o = data.shard_order(spec, manifest)
    assert o == order()
    reader = data.DatasetReader(store, manifest, LRUCache(183 * record))  # the split is past half of it
    assert not reader.cached("train")
    gets = []
    real_get = store.s3.get_object
    store.s3.get_object = lambda **kwargs: gets.append(kwargs["Key"]) or real_get(**kwargs)
    lanes = data.worker_indices(np.arange(8), 2, 1)
    for number in range(8):  # two windows of 4 batches each
        x_got, y_got = reader.take_lanes(o, number, lanes)
        expected = o.batch(number, lanes)
        np.testing.assert_array_equal(x_got, x[expected])
        np.testing.assert_array_equal(y_got, y[expected])
        if number % 4 == 0:
            windows = [o.window(*o.locate(number)[:1], int(lane), number // 4) for lane in lanes]
            reads = len(data.coalesce(np.concatenate(windows), 40))
            assert len(gets) == reads <= 2 * len(lanes), (number, gets)  # a GET or two per lane's window
            gets.clear()
        else:
            assert gets == [], f"batch {number} read again what its lanes' windows hold"
