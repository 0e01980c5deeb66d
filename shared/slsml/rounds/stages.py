"""A model's pipeline stages in figures: the blocks it can be cut into (the layers between two neighbouring cut
points), each stage's memory, and the split into S stages that balances their compute within a function's memory.
The Keras side (finding the cut points, building the stages, their gradients) is ``slsml.training.stages``; the
plan's figures of a pipeline round are ``slsml.cost.stages``.

A stage keeps one micro-batch's layer outputs at a time: at the backward pass it computes its forward pass again from
its stored input (GPipe's re-materialization), so its memory is that of a worker whose model is the stage's weights
and whose sample is the stage's layer outputs (``sizing.WorkerMemory``), whatever the micro-batches of a round."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from slsml.aws.storage import PART_BYTES, UPLOADS_IN_FLIGHT
from slsml.rounds import sizing

POLL_S = 0.02  # how often a stage function looks for what it waits on (``slsml.pipeline.staged``)
RUN_CHECK_S = 2.0  # of a stage function's polls, between its reads of whether its run still trains its round
# a stage's training step computes its forward pass twice (once as micro-batches flow forward, once again at the
# backward pass, from its stored input): a forward is a third of a step (forward 1, backward 2 multiply-adds)
RECOMPUTE_SHARE = 4 / 3
# what a stage holds beside its weights' sums as it stores its part of the update (``ObjectStore.put_own_streamed``):
# the parts in flight, the one sent next and the one it fills; a part stored in one PUT is joined first (its bytes)
UPLOAD_BYTES = (UPLOADS_IN_FLIGHT + 2) * PART_BYTES


@dataclass(frozen=True)
class Block:
    """Layers between two neighbouring cut points: the least a stage holds."""

    first: str  # its first layer's name
    last: str  # its last layer's name
    weight_bytes: int  # its float32 weights, trained or not
    outputs: tuple[int, ...]  # values of one sample's output of each of its layers
    input_values: int  # values of one sample's input to it (the activation handed to it)
    flops: int  # a training step's floating-point operations of one sample (``slsml.cost.flops``)


@dataclass(frozen=True)
class Stage:
    """Consecutive blocks run by one stage function."""

    blocks: tuple[Block, ...]

    @property
    def weight_bytes(self) -> int:
        return sum(b.weight_bytes for b in self.blocks)

    @property
    def flops(self) -> int:
        return sum(b.flops for b in self.blocks)

    @property
    def sample_bytes(self) -> int:
        """What one sample adds to the stage's step (``sizing.step_bytes`` of its layers and its input)."""
        return sizing.step_bytes([o for b in self.blocks for o in b.outputs], self.blocks[0].input_values)

    @property
    def activation_bytes(self) -> int:
        """One sample's output handed to the next stage (float32), and its gradient handed back."""
        return 4 * self.blocks[-1].outputs[-1]

    def memory(self, memory_mb: float, cache_mb: float) -> sizing.WorkerMemory:
        """The stage's memory in a function of ``memory_mb`` with a warm cache of ``cache_mb``."""
        return sizing.WorkerMemory(memory_mb, cache_mb, self.weight_bytes, self.sample_bytes)


def bubble(stages: int, micro_batches: int) -> float:
    """The share of a GPipe round its stages stand idle: (S−1)/(M+S−1), the pipeline filling and draining."""
    return (stages - 1) / (micro_batches + stages - 1)


def balance(blocks: Sequence[Block], count: int, fits: Callable[[Stage], bool]) -> list[Stage] | None:
    """The split of ``blocks`` into ``count`` consecutive stages whose largest compute (FLOPs) is least, each stage
    one that ``fits``; None where no split into ``count`` fits (or there are fewer blocks)."""
    n = len(blocks)
    if not 1 <= count <= n:
        return None
    best: dict[tuple[int, int], tuple[int, list[int]] | None] = {}  # (first block, stages) → (largest FLOPs, cuts)

    def split(first: int, stages: int) -> tuple[int, list[int]] | None:
        if (first, stages) in best:
            return best[first, stages]
        answer: tuple[int, list[int]] | None = None
        last_stop = n if stages == 1 else n - stages + 1
        for stop in range(first + 1, last_stop + 1):
            if stages == 1 and stop != n:
                continue
            stage = Stage(tuple(blocks[first:stop]))
            if not fits(stage):
                break  # longer stages from ``first`` only take more memory
            rest = (0, []) if stages == 1 else split(stop, stages - 1)
            if rest is not None and (answer is None or max(stage.flops, rest[0]) < answer[0]):
                answer = (max(stage.flops, rest[0]), [stop, *rest[1]])
        best[first, stages] = answer
        return answer

    found = split(0, count)
    if found is None:
        return None
    bounds = [0, *found[1]]
    return [Stage(tuple(blocks[a:b])) for a, b in itertools.pairwise(bounds)]


def held(stage: Stage, whole: sizing.WorkerMemory) -> sizing.WorkerMemory:
    """A stage function's memory as the pipeline runs one (``slsml.pipeline.staged``): a worker's (``whole``: the
    function's memory, its warm cache and what a worker holds besides) whose model is the stage's own weights
    (``slsml.pipeline.steps.warm.stage_trainer_for``), whose sample is the stage's layer outputs, and which holds what
    it stores its part of the update through (``UPLOAD_BYTES``, or the part's bytes where they are fewer)."""
    storing = min(UPLOAD_BYTES, stage.weight_bytes)
    return replace(
        whole, model_bytes=stage.weight_bytes, sample_bytes=stage.sample_bytes, other_bytes=whole.other_bytes + storing
    )


def deployed(blocks: Sequence[Block], count: int, whole: sizing.WorkerMemory) -> list[Stage] | None:
    """The split a run's start makes of ``blocks`` into ``count`` stages (``balance``), each stage function's step
    fitting as it is run (``held``); None where none fits."""
    return balance(blocks, count, lambda stage: held(stage, whole).micro_batch() >= 1)


def unfit(blocks: Sequence[Block], count: int | None, whole: sizing.WorkerMemory) -> str:
    """Why no split of ``blocks`` into ``count`` stages (None: into any count, as the plan looks for one) fits stage
    functions as they are run (``deployed``), in one line: the fewest stages that fit, or, where none do, the block
    whose step needs the most memory in a stage of its own."""
    memory = f"a worker of {whole.memory_mb:,.0f} MB"
    if count:
        fits = (n for n in range(count + 1, len(blocks) + 1) if deployed(blocks, n, whole) is not None)
        if (fewest := next(fits, None)) is not None:
            return (
                f"--pipeline-stages {count}: no split into {count} stages fits {memory}, each stage's function"
                f" holding its own stage's weights; {fewest} stages fit: give --pipeline-stages {fewest} or more, or"
                " the worker function more memory (--memory worker=MB)"
            )

    def need(block: Block) -> float:
        return held(Stage((block,)), whole).needed_mb(1, micro_batches=2)

    heaviest = max(blocks, key=need)
    layers = (
        f"layer {heaviest.first!r} needs"
        if heaviest.first == heaviest.last
        else f"layers {heaviest.first!r} to {heaviest.last!r}, which no cut divides, need"
    )
    split = f"--pipeline-stages {count}: no split into {count} stages" if count else "no split of the model into stages"
    return (
        f"{split} fits {memory}: each stage's function holds its own stage's weights, and {layers}"
        f" ~{need(heaviest):,.0f} MB for one sample in a stage of their own: give the worker function more memory"
        " (--memory worker=MB)"
    )
