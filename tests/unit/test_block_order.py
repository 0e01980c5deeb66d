"""The block order: every sample of whole blocks once per epoch, the same batches whatever the workers, and a
worker's slice read as one ranged GET per block."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from slsml.aws.storage import ObjectStore
from slsml.data import datasets as data
from slsml.data.blockorder import BlockOrder
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError

from . import cloud

COUNT = 183


def order(seed: int = 3, batch: int = 8, block: int = 4, least: int = 1) -> BlockOrder:
    return BlockOrder(COUNT, batch, block, seed, least)


def epoch_batches(o: BlockOrder, epoch: int) -> list[np.ndarray]:
    numbers = range(epoch * o.per_epoch, (epoch + 1) * o.per_epoch)
    return [o.batch(number, np.arange(o.size(number))) for number in numbers]


def test_every_sample_of_whole_blocks_is_used_once_an_epoch_and_epochs_differ() -> None:
    o = order()
    assert o.per_epoch == 23  # ⌈180 / 8⌉: the 180 records of whole blocks, the last batch the 4 left
    assert [len(b) for b in epoch_batches(o, 1)] == [8] * 22 + [4]
    assert [o.size(n) for n in (21, 22, 23, 45)] == [8, 4, 8, 4]
    assert order(least=4).per_epoch == 23 and order(least=5).per_epoch == 22  # fewer than the workers sit out
    assert [len(b) for b in epoch_batches(order(least=5), 1)] == [8] * 22
    epochs = []
    for epoch in range(3):
        used = np.concatenate(epoch_batches(o, epoch))
        assert len(used) == len(set(used.tolist())) == (183 // 4) * 4, f"epoch {epoch} repeats or misses a sample"
        assert used.min() >= 0 and used.max() < (183 // 4) * 4  # the last 183 mod 4 sit every epoch out
        epochs.append(used)
    assert not np.array_equal(epochs[0], epochs[1]) and set(epochs[0].tolist()) == set(range((183 // 4) * 4))
    kept = [set(np.concatenate(epoch_batches(order(least=5), epoch)).tolist()) for epoch in range(2)]
    assert kept[0] != kept[1] and len(kept[0]) == 176  # the last batch's block, another each epoch, sits out
    assert not np.array_equal(epochs[0], np.concatenate(epoch_batches(order(seed=4), 0)))
    np.testing.assert_array_equal(epochs[0], np.concatenate(epoch_batches(order(), 0)))  # seeded


def test_a_batch_is_whole_blocks_from_across_the_split() -> None:
    o = order(batch=16, block=4)
    for number in range(5):
        batch = o.batch(number, np.arange(16))
        runs = batch.reshape(4, 4)
        assert (np.diff(runs, axis=1) == 1).all() and (runs[:, 0] % 4 == 0).all(), "each block: 4 consecutive"
    spread = np.concatenate(epoch_batches(o, 0)[:3])
    assert np.ptp(spread) > COUNT // 2, "the first batches draw from across the split"


@pytest.mark.parametrize("max_workers", [4, 8])
@pytest.mark.parametrize("workers", [1, 3, 4])
def test_the_batches_do_not_depend_on_the_workers(workers: int, max_workers: int) -> None:
    """A run's batches are those of its order whatever the workers it is scaled to: the order takes the most workers
    the run asks for (``max_workers``), which keep the epoch's last 4 samples with 4 and leave them out with 8."""
    spec = TrainingSpec(
        workers=workers,
        max_workers=max_workers,
        global_batch=8,
        shuffle="blocks",
        shuffle_block=4,
        seed=3,
        algorithm="average",
        local_steps=3,
    )
    o, reference = data.block_order(spec, COUNT), order(least=max_workers)
    assert o == reference
    for iteration in (0, 7, 15):  # 7, 15: global batches 21-23 and 45-47, across an epoch's end
        slices = [data.round_batches(spec, COUNT, workers, w, iteration, o) for w in range(workers)]
        for k, number in enumerate(data.round_numbers(spec, iteration)):
            expected = reference.batch(number, np.arange(reference.size(number)))
            np.testing.assert_array_equal(np.concatenate([s[k] for s in slices]), expected)
            assert len(expected) == (4 if max_workers == 4 and number % 23 == 22 else 8), number


def test_the_spec_names_what_the_block_order_does_not_take() -> None:
    with pytest.raises(ValidationError, match="shuffle is an option of algorithm gradient or average only"):
        TrainingSpec(algorithm="admm", shuffle="blocks")
    with pytest.raises(ValidationError, match="shuffle_block applies to shuffle blocks only"):
        TrainingSpec(shuffle_block=8)
    with pytest.raises(
        BadInputError,
        match=r"global batch 64 is larger than the training set in blocks of 16 \(48 samples\): give --batch 48 or"
        " less$",
    ):
        data.block_order(TrainingSpec(global_batch=64, shuffle="blocks"), 63)
    edge = data.block_order(TrainingSpec(global_batch=48, shuffle="blocks"), 63)  # a batch of every whole block
    assert edge is not None and edge.per_epoch == 1 and edge.size(0) == 48


def test_a_workers_slice_is_a_ranged_get_per_block(store: ObjectStore) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((COUNT, 3)).astype(np.float32), rng.integers(0, 5, COUNT)
    record = 3 * 4 + 8
    manifest = data.put_dataset(store, "blocks", x, y, x[:5], y[:5], shard_mb=40 * record / 2**20)
    spec = TrainingSpec(workers=2, global_batch=8, shuffle="blocks", shuffle_block=4, seed=3)
    o = data.block_order(spec, manifest.train.count)
    reader = data.DatasetReader(store, manifest)
    for number in range(8):
        (indices,) = data.round_batches(spec, manifest.train.count, 2, 1, number, o)
        with cloud.gets_sent(store) as gets:
            x_got, y_got = reader.take("train", indices)
        np.testing.assert_array_equal(x_got, x[indices])
        np.testing.assert_array_equal(y_got, y[indices])
        first = int(indices[0])
        crosses = first // 40 != (first + 3) // 40  # the block crosses a shard's end
        assert len(gets) == 1 + crosses and len(indices) == 4, (number, gets)
