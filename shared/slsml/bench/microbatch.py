"""Benchmark ``micro-batches``: a worker's step over shares of several multiples (default 1, 4 and 16) of the
micro-batch that fits its memory, side by side: time per sample and peak resident set. The micro-batch is the worker's
own (``slsml.rounds.sizing.WorkerMemory`` of the model at the function's memory, its warm cache a share
``slsml.aws.cache.MEMORY_SHARE`` of it), unless one is given.

Each multiple is a process of its own (spawned), so that its peak resident set (Linux's ``VmHWM``, reset once the
model is built and one micro-batch has traced the step) is its own, and its resident set once it imported TensorFlow
is read: the runtime, which differs from one machine to the next, is counted at the sizing's figure
(``sizing.TF_IMPORTS_MB``) where a peak is judged against the sizing, so that the verdict is the step's. In it:
random samples of its share held in memory, and each step a ``Stream`` of the share's micro-batches read from them
ahead of the one computing and ``step_update`` adding up their gradients, as the worker computes a step. The
processes take their steps by turns, in an order that rotates each round, so that the machine's other load falls on
every multiple alike; a multiple's step time is the median of its steps, and its time per sample that over its share."""

from __future__ import annotations

import json
import multiprocessing
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import suppress
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from slsml.aws import cache
from slsml.local import memory
from slsml.rounds import accumulate, sizing, stream
from slsml.spec.deployment import DEFAULT_FUNCTIONS
from slsml.spec.errors import BadInputError, SlsmlError
from slsml.spec.shardplan import ShardPlan
from slsml.training import modelio

MEMORY_MB = DEFAULT_FUNCTIONS["worker"].memory_mb
MULTIPLES, REPEATS = (1, 4, 16), 3
SHAPE, CLASSES = (64, 64, 3), 10  # the default model's: ResNet-50 on 64×64 RGB images of 10 classes
DEFAULT_LOSS = json.dumps("sparse_categorical_crossentropy")
TIME_WITHIN = 1.15  # the largest multiple's time per sample against the smallest's, at most
READY_S = 900.0  # how long a case's process may take to build its model and trace its step

Progress = Callable[[str, int, int], None]  # (case, steps taken, steps)


class MicroBatchCase(BaseModel):
    multiple: int
    share: int  # samples of the step: multiple × micro-batch
    micro_batches: int  # of each step, as its stream cut it
    step_s: list[float]  # each step's seconds, in the order taken
    median_step_s: float
    ms_per_sample: float  # the median step over the share
    ratio: float  # ms_per_sample against the smallest multiple's
    peak_rss_mb: float | None  # its process's peak over its steps (MB of 2²⁰ bytes); None where none is kept
    imports_mb: float  # its process's resident set once it imported TensorFlow, before its model
    # the peak with the runtime counted at the sizing's figure: peak_rss_mb − imports_mb + sizing.TF_IMPORTS_MB
    sized_peak_mb: float | None


class MicroBatchReport(BaseModel):
    model: str
    weights: int
    sample_bytes: int  # what one sample adds to a step (``sizing.sample_bytes``)
    memory_mb: int  # the worker function's
    cache_mb: float  # its warm cache's bound
    fitting: int  # the micro-batch ``WorkerMemory`` gives
    micro_batch: int  # the one measured: ``fitting`` unless one was given
    # the sizing's estimate of a case's peak: its step in several micro-batches, the model, no warm cache beside it
    estimated_peak_mb: float
    repeats: int
    cases: list[MicroBatchCase]
    time_ratio: float  # the largest multiple's ms per sample against the smallest's
    time_within: bool  # time_ratio ≤ TIME_WITHIN
    peaks_within: bool  # every peak within the function's memory
    # every sized peak, the warm cache full beside it (the model's weights one of its entries), within that memory
    peaks_within_cache_full: bool
    peaks_within_estimate: bool  # every sized peak within the sizing's estimate


def build_model(path: Path | None) -> tuple[Any, str]:
    """The model at ``path`` (a ``.keras`` file, compiled with its loss) and its loss as a run stores it; None: the
    default, ResNet-50 on ``SHAPE`` images of ``CLASSES`` classes, random weights drawn alike in every process."""
    import keras

    if path is None:
        keras.utils.set_random_seed(0)
        return keras.applications.ResNet50(weights=None, input_shape=SHAPE, classes=CLASSES), DEFAULT_LOSS
    model = modelio.load_model(path.read_bytes(), str(path))
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise BadInputError(f"{path}: the benchmark draws samples for a model of one input and one output")
    return model, modelio.loss_config(model, None)


def worker_memory(model: Any, memory_mb: int) -> sizing.WorkerMemory:
    """The memory of a worker of ``memory_mb`` training ``model`` by gradient averaging, as the worker sizes it."""
    size = ShardPlan.build(modelio.variable_specs(model), 1).size
    return sizing.WorkerMemory(memory_mb, cache.MEMORY_SHARE * memory_mb, 4 * size, sizing.sample_bytes(model))


def samples(model: Any, loss: str, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random inputs in [0, 1) and labels: class ids under a sparse loss, else values in [0, 1)."""
    rng = np.random.default_rng(seed)
    x = rng.random((count, *(d or 1 for d in model.input_shape[1:])), dtype=np.float32)
    outputs = tuple(d or 1 for d in model.output_shape[1:])
    sparse = "sparse" in loss
    y = rng.integers(0, outputs[-1], (count, *outputs[:-1])) if sparse else rng.random((count, *outputs), np.float32)
    return x, y


def _case(connection: Connection, path: Path | None, share: int, micro_batch: int) -> None:
    """A case's process: read its resident set once TensorFlow is imported, build the model, trace a micro-batch's
    step, reset the peak and answer ``"ready"`` with that resident set; then on each ``"step"`` time one step of
    ``share`` samples and answer (seconds, micro-batches); on ``"peak"`` answer the peak and end."""
    try:
        import keras  # noqa: F401  (TensorFlow with it: the runtime, read before the model)

        imports = memory.resident_bytes()
        model, loss = build_model(path)
        trainer = modelio.Trainer(model, ShardPlan.build(modelio.variable_specs(model), 1), loss)
        x, y = samples(model, loss, share)
        first = accumulate.sizes(share, micro_batch)[0]
        trainer.compute_update(x[:first], y[:first])
        indices = np.arange(share)
        memory.reset_peak()
        connection.send(("ready", imports))
        while connection.recv() == "step":
            started = time.perf_counter()
            with stream.Stream(lambda taken: (x[taken], y[taken], None), [indices], micro_batch) as read:
                accumulate.step_update(trainer, read.steps[0])
            connection.send(("step", (time.perf_counter() - started, len(read.steps[0]))))
        connection.send(("peak", memory.peak_bytes()))
    except EOFError:  # the benchmark ended before this case's steps did
        pass
    except BaseException:
        with suppress(OSError):
            connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()


class _Process:
    """A case's process and its end of the pipe."""

    def __init__(self, context: Any, path: Path | None, multiple: int, micro_batch: int) -> None:
        self.multiple = multiple
        self.connection, theirs = context.Pipe()
        self.process = context.Process(
            target=_case, args=(theirs, path, multiple * micro_batch, micro_batch), daemon=True
        )
        self.process.start()
        theirs.close()

    def answer(self, expected: str, timeout: float | None = None) -> Any:
        if timeout is not None and not self.connection.poll(timeout):
            raise SlsmlError(f"the {self.multiple}× case's process did not answer within {timeout:.0f} s")
        try:
            tag, value = self.connection.recv()
        except EOFError:
            self.process.join(5)
            raise SlsmlError(f"the {self.multiple}× case's process ended (exit code {self.process.exitcode})") from None
        if tag == "error":
            raise SlsmlError(f"the {self.multiple}× case failed:\n{value}")
        if tag != expected:
            raise SlsmlError(f"the {self.multiple}× case answered {tag!r}, not {expected!r}")
        return value

    def end(self) -> None:
        self.connection.close()
        self.process.join(10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()


def micro_batches(
    path: Path | None = None,
    memory_mb: int = MEMORY_MB,
    multiples: Sequence[int] = MULTIPLES,
    repeats: int = REPEATS,
    micro_batch: int | None = None,
    show: Progress = lambda case, done, total: None,
) -> MicroBatchReport:
    """The worker's step of ``path``'s model (None: the default) over shares of each of ``multiples`` times the
    micro-batch that fits ``memory_mb`` (or ``micro_batch``), ``repeats`` steps each, one process per multiple."""
    model, _ = build_model(path)
    budget = worker_memory(model, memory_mb)
    if (refusal := budget.refusal()) is not None:
        raise BadInputError(refusal)
    if not budget.sample_bytes and micro_batch is None:
        raise BadInputError(
            f"{path}: what a sample adds to a step is not known (a subclassed model): give a micro-batch"
        )
    micro = micro_batch or budget.micro_batch()
    multiples = sorted(set(multiples))
    names = {m: f"{m}× ({m * micro:,} samples)" for m in multiples}
    context = multiprocessing.get_context("spawn")
    processes: list[_Process] = []
    try:
        for multiple in multiples:
            processes.append(_Process(context, path, multiple, micro))
            show(names[multiple], 0, repeats)
        imports = {process.multiple: process.answer("ready", READY_S) for process in processes}
        taken: dict[int, list[tuple[float, int]]] = {m: [] for m in multiples}
        for round_ in range(repeats):
            turn = round_ % len(processes)
            for process in processes[turn:] + processes[:turn]:
                process.connection.send("step")
                taken[process.multiple].append(process.answer("step"))
                show(names[process.multiple], round_ + 1, repeats)
        peaks: dict[int, int | None] = {}
        for process in processes:
            process.connection.send("peak")
            peaks[process.multiple] = process.answer("peak")
    finally:
        for process in processes:
            process.end()
    return _report(path, budget, micro, repeats, taken, peaks, imports)


def _report(
    path: Path | None,
    budget: sizing.WorkerMemory,
    micro: int,
    repeats: int,
    taken: dict[int, list[tuple[float, int]]],
    peaks: dict[int, int | None],
    imports: dict[int, int],
) -> MicroBatchReport:
    medians = {multiple: statistics.median(seconds for seconds, _ in steps) for multiple, steps in taken.items()}
    per_sample = {multiple: 1e3 * median / (multiple * micro) for multiple, median in medians.items()}
    smallest = per_sample[min(per_sample)]
    peaks_mb = {multiple: None if peak is None else round(peak / memory.MB, 1) for multiple, peak in peaks.items()}
    imports_mb = {multiple: round(resident / memory.MB, 1) for multiple, resident in imports.items()}
    sized_mb = {
        multiple: None if peak is None else round(peak - imports_mb[multiple] + sizing.TF_IMPORTS_MB, 1)
        for multiple, peak in peaks_mb.items()
    }
    cases = [
        MicroBatchCase(
            multiple=multiple,
            share=multiple * micro,
            micro_batches=steps[0][1],
            step_s=[round(seconds, 4) for seconds, _ in steps],
            median_step_s=round(medians[multiple], 4),
            ms_per_sample=round(per_sample[multiple], 4),
            ratio=round(per_sample[multiple] / smallest, 3),
            peak_rss_mb=peaks_mb[multiple],
            imports_mb=imports_mb[multiple],
            sized_peak_mb=sized_mb[multiple],
        )
        for multiple, steps in sorted(taken.items())
    ]
    memory_mb = int(budget.memory_mb)
    estimated = budget.needed_mb(micro, micro_batches=2) - budget.cache_mb + budget.model_bytes / memory.MB
    return MicroBatchReport(
        model=f"ResNet-50, {SHAPE[0]}×{SHAPE[1]}×{SHAPE[2]} inputs, {CLASSES} classes" if path is None else str(path),
        weights=int(budget.model_bytes) // 4,
        sample_bytes=int(budget.sample_bytes),
        memory_mb=memory_mb,
        cache_mb=budget.cache_mb,
        fitting=budget.micro_batch(),
        micro_batch=micro,
        estimated_peak_mb=round(estimated, 1),
        repeats=repeats,
        cases=cases,
        time_ratio=cases[-1].ratio,
        time_within=cases[-1].ratio <= TIME_WITHIN,
        peaks_within=all(p is not None and p <= memory_mb for p in peaks_mb.values()),
        peaks_within_cache_full=all(
            p is not None and p - budget.model_bytes / memory.MB + budget.cache_mb <= memory_mb
            for p in sized_mb.values()
        ),
        peaks_within_estimate=all(p is not None and p <= estimated for p in sized_mb.values()),
    )
