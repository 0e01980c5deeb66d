"""An epoch as Keras counts it: ⌈n/B⌉ global batches, the last one smaller, each sample once; the run, its block
order and the plan count the same iterations."""

from __future__ import annotations

import argparse

import numpy as np

from slsml.cost import planreport
from slsml.data import datasets as data
from slsml.data.blockorder import BlockOrder
from slsml.pipeline import launch
from slsml.spec.config import TrainingSpec
from slsml.spec.samples import epoch_batches


def test_an_epoch_trains_its_last_smaller_batch_and_every_sample_once() -> None:
    assert epoch_batches(455, 64) == 8 and epoch_batches(448, 64) == 7
    assert epoch_batches(449, 64, least=4) == 7  # one sample left for four workers: it sits the epoch out
    batches = [data.global_batch_indices(455, 64, 0, i) for i in range(16)]
    assert [len(b) for b in batches[:8]] == [64] * 7 + [7]
    assert sorted(np.concatenate(batches[:8]).tolist()) == list(range(455))
    assert sorted(np.concatenate(batches[8:]).tolist()) == list(range(455))  # the next epoch's permutation
    spec = TrainingSpec(global_batch=64, workers=4, epochs=3)
    assert launch.with_epochs(spec, 455).iterations == 24
    slices = [data.round_batches(spec, 455, 4, w, 7)[0] for w in range(4)]
    assert [len(s) for s in slices] == [2, 2, 2, 1]


def test_the_block_order_takes_the_streams_last_positions_as_a_smaller_batch() -> None:
    order = BlockOrder(count=455, global_batch=64, block=8, seed=0, least=2)  # 448 streamed: 7 whole batches
    assert order.per_epoch == 7
    order = BlockOrder(count=470, global_batch=64, block=8, seed=0, least=2)  # 464: 7 batches and one of 16
    assert order.per_epoch == 8 and order.size(7) == 16 and order.size(8) == 64
    taken = [order.batch(n, np.arange(order.size(n))) for n in range(8)]
    assert len(np.unique(np.concatenate(taken))) == 464


def test_the_plan_counts_an_epochs_iterations_as_the_run_does() -> None:
    args = argparse.Namespace(epochs=3, iterations=None, samples=455, batch=64, workers=4)
    assert (
        planreport.iterations(args)
        == launch.with_epochs(TrainingSpec(global_batch=64, workers=4, epochs=3), 455).iterations
    )
