"""Benchmark ``stages``: a model that fits both one bigger function and S pipeline stages of smaller ones, its step
computed both ways in this process on one thread (a vCPU), the same batches by turns, side by side: time per sample
and dollars of a round on Lambda, and the stages' gradient against the whole model's on the same micro-batches.

The whole model's step is ``slsml.training.stages.step`` of one stage (a plain step); the stages' is the same of
the model's split (``slsml.training.stages.split``, balanced by ``slsml.rounds.stages.balance``), the batch in
micro-batches; each stage's seconds are its own. On Lambda, each is converted to the function's vCPUs
(``slsml.cost.timing``) and priced as the plan prices it (``slsml.cost.stages``): the bigger function reads the
model and writes its update; the pipeline's round is its slowest stage's M+S−1 slots each way and the hops between
them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from slsml.accounting import prices
from slsml.accounting.prices import PriceTable
from slsml.aws.cache import MEMORY_SHARE
from slsml.cost import stages as staged
from slsml.cost.parameters import Parameters
from slsml.cost.timing import speedup, vcpus
from slsml.cost.workload import MEMORY_CHOICES_MB
from slsml.rounds import accumulate
from slsml.rounds.stages import Stage, balance
from slsml.spec.errors import BadInputError

STAGES, MEMORY_MB, BATCH, MICRO_BATCH, REPEATS = 4, 2048, 256, 32, 3
WIDTH, DEPTH, FEATURES, CLASSES = 2048, 8, 512, 10  # the default model: a chain of Dense layers

Progress = Callable[[str, int, int], None]  # (case, steps taken, steps)


class Case(BaseModel):
    name: str
    functions: int  # per pipeline (a worker)
    memory_mb: int  # each function's
    measured_step_s: float  # the median step here, one thread
    per_stage_s: list[float]  # its share of each stage (one for the whole model), median step
    round_s: float  # on Lambda: the step on the function's vCPUs, with its reads, writes and hops
    ms_per_sample: float
    dollars_per_round: float
    dollars_per_million_samples: float


class StagesReport(BaseModel):
    model: str
    weights: int
    batch: int
    micro_batch: int
    stages: int
    split: list[str]  # each stage's first and last layer
    repeats: int
    cases: list[Case]
    # the stages' gradient against the whole model's on the same micro-batches, largest absolute difference
    max_gradient_difference: float
    gradient_scale: float  # the whole model's gradient, largest absolute value


def build_model(path: Path | None) -> tuple[Any, Any]:
    """The model at ``path`` (a ``.keras`` file compiled with its loss) and its loss; None: the default chain of
    ``DEPTH`` Dense layers ``WIDTH`` wide on ``FEATURES`` features, ``CLASSES`` classes."""
    import keras

    from slsml.training import modelio

    if path is not None:
        model = modelio.load_model(path.read_bytes(), where=str(path))
        return model, modelio.training_loss(modelio.loss_config(model, None), model)
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(WIDTH, activation="relu", name=f"dense_{i}") for i in range(DEPTH)]
    model = keras.Sequential([keras.Input((FEATURES,)), *layers, keras.layers.Dense(CLASSES, name="logits")])
    return model, keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def stages_against_bigger(
    path: Path | None,
    count: int,
    memory_mb: int,
    batch: int,
    micro_batch: int,
    repeats: int,
    show: Progress,
    p: Parameters | None = None,
    price_table: PriceTable | None = None,
) -> StagesReport:
    """The model's step whole and in ``count`` stages of ``memory_mb`` functions (``micro_batch`` samples at a
    time), ``repeats`` steps each by turns. BadInputError where the model cannot be cut into ``count`` stages, the
    stages do not fit ``memory_mb``, or the whole model fits no Lambda function."""
    from slsml.cost.modelinfo import pin_one_thread

    pin_one_thread()
    from slsml.training import stages

    p, price_table = p or Parameters(), price_table or prices.load(None)
    model, loss_fn = build_model(path)
    if (why := stages.refusal(model, count)) is not None:
        raise BadInputError(why)
    blocks = staged.blocks_of(model)
    cache = MEMORY_SHARE * memory_mb
    split = balance(blocks, count, lambda stage: stage.memory(memory_mb, cache).micro_batch() >= micro_batch)
    if split is None:
        raise BadInputError(
            f"--stages {count}: no split into {count} stages fits a micro-batch of {micro_batch} in {memory_mb:,} MB"
            " (give more --memory, more --stages or a smaller --micro-batch)"
        )
    whole = Stage(tuple(blocks))
    bigger = next(
        (m for m in MEMORY_CHOICES_MB if whole.memory(m, MEMORY_SHARE * m).micro_batch() >= batch),
        None,
    )
    if bigger is None:
        raise BadInputError(f"the model's step of {batch} samples fits no Lambda function: give a smaller --batch")
    parts = stages.split(model, [len(s.blocks) for s in split])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, *model.input_shape[1:])).astype(np.float32)
    y = rng.integers(0, model.output_shape[-1], batch)
    sizes = accumulate.sizes(batch, micro_batch)
    starts = np.cumsum([0, *sizes[:-1]])
    pieces = [(x[a : a + n], y[a : a + n]) for a, n in zip(starts, sizes, strict=True)]
    untrained = [np.asarray(v.numpy()) for v in model.non_trainable_weights]
    runs: dict[str, list[Any]] = {"whole": [], "stages": []}
    for repeat in range(repeats + 1):  # the first traces: not counted
        for name in ("whole", "stages") if repeat % 2 == 0 else ("stages", "whole"):
            for v, value in zip(model.non_trainable_weights, untrained, strict=True):
                v.assign(value)
            done = stages.step([model], loss_fn, [(x, y)]) if name == "whole" else stages.step(parts, loss_fn, pieces)
            if repeat:
                runs[name].append(done)
            show(name, repeat, repeats)
    for v, value in zip(model.non_trainable_weights, untrained, strict=True):
        v.assign(value)
    # the whole model on the same micro-batches: the stages' gradient is to equal it to round-off
    whole_gradient = np.concatenate([g.ravel() for g in stages.step([model], loss_fn, pieces).gradients[0]])
    staged_gradient = np.concatenate([g.ravel() for each in runs["stages"][0].gradients for g in each])
    M = len(pieces)

    def median_of(name: str) -> tuple[float, list[float]]:
        steps = runs[name]
        middle = sorted(range(len(steps)), key=lambda i: sum(steps[i].seconds))[len(steps) // 2]
        return sum(steps[middle].seconds), steps[middle].seconds

    whole_s, whole_parts = median_of("whole")
    staged_s, staged_parts = median_of("stages")
    model_bytes = 4 * model.count_params()
    on_bigger = whole_s / speedup(vcpus(bigger), p.vcpu_efficiency)
    bigger_round = staged.round_seconds(p, model_bytes, 1, 1, on_bigger, 0)
    bigger_dollars = staged.round_dollars(price_table, {}, 1, 1, bigger_round, bigger)
    per_micro = max(staged_parts) / M / speedup(vcpus(memory_mb), p.vcpu_efficiency)
    handed = max(s.activation_bytes for s in split[:-1]) * micro_batch
    heaviest = max(s.weight_bytes for s in split)
    parts = [s.weight_bytes for s in split]
    staged_round = staged.round_seconds(p, heaviest, M, len(split), per_micro, handed)
    S = len(split)
    idle = S * staged_round - sum(staged_parts) / speedup(vcpus(memory_mb), p.vcpu_efficiency)
    requests = staged.round_requests(p, M, S, 1, idle, parts)
    staged_dollars = staged.round_dollars(price_table, requests, S, 1, staged_round, memory_mb)
    cases = [
        _case("one bigger function", 1, bigger, whole_s, whole_parts, bigger_round, bigger_dollars, batch),
        _case(f"{S} stages", S, memory_mb, staged_s, staged_parts, staged_round, staged_dollars, batch),
    ]
    return StagesReport(
        model=model.name if path is None else path.name,
        weights=model.count_params(),
        batch=batch,
        micro_batch=micro_batch,
        stages=len(split),
        split=[f"{s.blocks[0].first}…{s.blocks[-1].last}" for s in split],
        repeats=repeats,
        cases=cases,
        max_gradient_difference=float(np.max(np.abs(staged_gradient - whole_gradient))),
        gradient_scale=float(np.max(np.abs(whole_gradient))),
    )


def _case(
    name: str,
    functions: int,
    memory_mb: int,
    step_s: float,
    parts: list[float],
    round_s: float,
    dollars: float,
    batch: int,
) -> Case:
    return Case(
        name=name,
        functions=functions,
        memory_mb=memory_mb,
        measured_step_s=step_s,
        per_stage_s=parts,
        round_s=round_s,
        ms_per_sample=1000 * round_s / batch,
        dollars_per_round=dollars,
        dollars_per_million_samples=dollars / batch * 1e6,
    )
