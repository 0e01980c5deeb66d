"""The block order (``shuffle blocks``): a data order whose reads stay large however big the data is.

Epoch e of a training split of N records: its records cut into blocks of c (``shuffle_block``) consecutive ones (records
[k·c, (k+1)·c), the last N mod c records left out), the blocks in a seeded permutation (seed, e), make one stream;
global batch p of the epoch is stream positions [p·B, (p+1)·B) (B: the global batch; the epoch's last batch is the
stream's positions left, smaller, as the exact order's last batch is: where they are fewer than the run's workers they
sit the epoch out), and worker w takes its contiguous slice of it, as in the exact order. So a worker's slice is whole
blocks (a part of one at its ends), each one ranged GET of consecutive records (two where a block crosses a shard's
end): about B/c GETs an iteration for exactly the bytes used, where the exact order sends one per sample. Every sample
but those left out is used once per epoch, and the batches depend on (seed, iteration) alone, not on the workers or on
what a process keeps: a run stopped and resumed, or scaled, goes on with the same batches, and Lambda may send a worker
slot to any container (no container keeps a slot's stream: a stream through a shuffle buffer would be read again by
every container a slot lands on).

Statistically, the c records of a block always train together, in one batch and one worker's slice; the blocks of a
batch come from B/c places spread over the whole split. Data stored in class order (an image folder, class by class)
gives batches of B/c runs of one class each: a smaller ``shuffle_block`` mixes more at more GETs, and data shuffled
at ingest mixes fully.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slsml.spec.samples import epoch_batches

_BLOCKS = 1  # the seed's stream for the block permutation: (seed, _BLOCKS, epoch)


@dataclass(frozen=True)
class BlockOrder:
    count: int  # records of the split
    global_batch: int
    block: int  # c: records of a block
    seed: int
    least: int = 1  # the fewest samples the epoch's last, smaller batch is trained with (the run's workers)

    @property
    def streamed(self) -> int:
        """Records of the stream: the split's whole blocks."""
        return (self.count // self.block) * self.block

    @property
    def per_epoch(self) -> int:
        """Global batches an epoch (``samples.epoch_batches``)."""
        return epoch_batches(self.streamed, self.global_batch, self.least)

    def size(self, number: int) -> int:
        """The samples of global batch ``number``: the global batch, less in an epoch's last one."""
        return min(self.global_batch, self.streamed - number % self.per_epoch * self.global_batch)

    def batch(self, number: int, positions: np.ndarray) -> np.ndarray:
        """The split indices of positions ``positions`` (0 … ``size(number)`` − 1) of global batch ``number``."""
        epoch, p = divmod(number, self.per_epoch)
        blocks = np.random.default_rng([self.seed, _BLOCKS, epoch]).permutation(self.count // self.block)
        stream = p * self.global_batch + np.asarray(positions, dtype=np.int64)
        return blocks[stream // self.block] * self.block + stream % self.block
