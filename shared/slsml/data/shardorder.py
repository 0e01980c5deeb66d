"""The shard order (``shuffle shards``): a data order for datasets far past the workers' memory.

Epoch e of a training split of N records: its shards in a seeded permutation (seed, e), each shard's records in
stored order, make one stream of N records. The stream is cut into B lanes (B: the global batch) of L = N // B
consecutive records each; the last N − B·L records of the stream sit the epoch out (different ones every epoch),
as the last N mod B samples of the exact order's permutation do. Global batch p of the epoch takes one record of
each lane, lane l's p-th in the lane's order: its records in windows of Q (``shuffle_buffer``) consecutive
ones, each window permuted by a seeded shuffle (seed, e, l, window). Worker w takes its contiguous slice of the
lanes, as it takes its slice of a batch in the exact order.

A worker reads a lane's window once (one ranged GET, two where it crosses a shard's end) and serves the next Q
iterations of that lane from it: bytes read are the bytes used, and requests drop Q-fold. Every record is used
once per epoch, and the order depends on (seed, iteration) alone, not on the workers: a run stopped and resumed,
or scaled, goes on with the same batches.

Statistically, each batch still mixes B places spread evenly over the shard-permuted stream, but a lane walks its
stretch of the stream in order: records stored within Q of each other are used within Q iterations of each other
(on one lane), not spread over the epoch as in the exact order, and records of one shard land on consecutive
lanes. For data stored in class order this correlates nearby batches; a larger ``shuffle_buffer`` weakens it, at
Q records per lane of the worker's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_SHARDS = 1  # the seed's stream for the shard permutation: (seed, _SHARDS, epoch)
_WINDOWS = 2  # and for the lanes' windows: (seed, _WINDOWS, epoch, lane, window)


@dataclass(frozen=True)
class ShardOrder:
    counts: tuple[int, ...]  # records of each shard of the split
    shard_records: int  # records of every shard but the last: a record's index is shard·shard_records + offset
    global_batch: int
    buffer: int  # Q: records of a lane's window
    seed: int

    @property
    def lane_length(self) -> int:
        """Records of a lane: the iterations of an epoch."""
        return sum(self.counts) // self.global_batch

    def locate(self, number: int) -> tuple[int, int, int]:
        """Batch ``number``'s (epoch, window, position within the window) on every lane."""
        epoch, position = divmod(number, self.lane_length)
        return epoch, *divmod(position, self.buffer)

    def window(self, epoch: int, lane: int, window: int) -> np.ndarray:
        """The split indices of ``lane``'s ``window`` in epoch ``epoch``, in the order the lane uses them."""
        first = lane * self.lane_length + window * self.buffer
        stop = min(first + self.buffer, (lane + 1) * self.lane_length)
        shuffle = np.random.default_rng([self.seed, _WINDOWS, epoch, lane, window]).permutation(stop - first)
        return self._indices(epoch, first + shuffle)

    def batch(self, number: int, lanes: np.ndarray) -> np.ndarray:
        """The split indices that ``lanes`` of batch ``number`` take."""
        epoch, window, position = self.locate(number)
        return np.array([self.window(epoch, int(lane), window)[position] for lane in lanes], dtype=np.int64)

    def _indices(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Split indices of stream positions of epoch ``epoch``."""
        shards = np.random.default_rng([self.seed, _SHARDS, epoch]).permutation(len(self.counts))
        starts = np.concatenate(([0], np.cumsum(np.asarray(self.counts)[shards])))
        k = np.searchsorted(starts, positions, side="right") - 1
        return shards[k] * self.shard_records + positions - starts[k]
