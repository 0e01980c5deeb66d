"""The plan of a model trained in pipeline stages (``slsml.rounds.stages``): each of W pipelines is S stage
functions alive for the round, a micro-batch's activations handed forward and its activation gradients handed back
through S3 (one PutObject, one announcement, one GetObject a hop); a GPipe round with a flush, each stage computing
its forward pass again at the backward pass. Its stage count (given, or the fewest whose stages fit the worker's
memory), each stage's memory and compute, the round's time, requests and dollars, its bubble, and which it would
pick: the stages, one bigger function holding the whole model, or a GPU worker, by dollars per sample among those that
fit."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from slsml.accounting import prices
from slsml.accounting.prices import PriceTable
from slsml.aws.cache import MEMORY_SHARE
from slsml.aws.storage import upload_parts
from slsml.cost import gpuworker
from slsml.cost.chain import added, creates
from slsml.cost.parameters import Parameters
from slsml.cost.timing import speedup, transfer, vcpus
from slsml.cost.workerround import hand_on_calls, invocations
from slsml.cost.workload import MEMORY_CHOICES_MB, Workload
from slsml.rounds import sizing
from slsml.rounds.stages import (
    POLL_S,
    RECOMPUTE_SHARE,
    RUN_CHECK_S,
    Block,
    Stage,
    bubble,
    deployed,
    held,
    unfit,
)
from slsml.spec.errors import BadInputError
from slsml.training import progress

MOST_MICRO_BATCHES = 1024  # of a pipeline's round, the plan weighs
HOP_REQUESTS = ("s3:PutObject", "s3:GetObject")  # a micro-batch's activation handed to a stage


class StageFigures(BaseModel):
    """One stage of the pipeline."""

    first_layer: str
    last_layer: str
    weight_bytes: int
    flops_share: float = Field(description="its share of a sample's training FLOPs (slsml.cost.flops)")
    fitting: int = Field(description="the most samples a micro-batch of it fits (slsml.rounds.sizing)")
    memory_needed_mb: float = Field(description="its step of the plan's micro-batch, the warm cache full")
    compute_s: float = Field(description="one micro-batch: forward, forward again and backward")
    activation_bytes: int = Field(description="one micro-batch's output handed on (and its gradient handed back)")


class HandOns(BaseModel):
    """A stage function's round that outlasts the Worker's timeout goes on in fresh invocations of the same attempt,
    handed on between its passes as its pace decides (``slsml.pipeline.staged.Pace``: a pass at least an invocation,
    and more while the time left is above ``progress.reserve_s``)."""

    timeout_s: float = Field(description="the Worker's timeout (at most Lambda's)")
    invocations: int = Field(description="the invocations of a stage function's round, the most of any stage (1: one)")
    progress_bytes: int = Field(description="the largest stage's progress: the float64 sums of its weights' values")
    handed_on: int = Field(description="every pipeline's stage functions' hand-ons in a round")
    requests: dict[str, int] = Field(description="what they add to a round's requests")
    seconds: float = Field(description="what they add to a round: the longest stage's hand-ons, one after another")


class Option(BaseModel):
    """One way to compute the workers' round: its time, dollars and whether it fits."""

    name: str
    fits: bool
    round_s: float | None = None
    dollars: float | None = None
    detail: str


class PipelinePlan(BaseModel):
    """A round of W pipelines of S stage functions."""

    stages: int
    given: bool = Field(description="--pipeline-stages, else the fewest that fit the worker's memory")
    memory_mb: int = Field(description="each stage function's")
    micro_batch: int
    micro_batches: int = Field(description="M: a pipeline's micro-batches per round (its worker's share)")
    bubble: float = Field(description="(S−1)/(M+S−1): the share of the round its stages stand idle")
    per_stage: list[StageFigures]
    hop_s: float = Field(description="a micro-batch's activation handed to the next stage: put, announce, get")
    round_s: float = Field(description="read each stage's weights, M+S−1 slots forward and back, write its update")
    activation_bytes_per_round: int = Field(description="every pipeline's, forward and back")
    requests_per_round: dict[str, int] = Field(description="the hops' and the hand-ons' requests, every pipeline")
    hand_ons: HandOns = Field(description="a stage's round past the Worker's timeout, in fresh invocations")
    dollars_per_round: float
    samples_per_round: int
    options: list[Option] = Field(description="stages, one bigger function, a GPU worker: the workers' round")
    deployed: list[int] = Field(
        description="the blocks of each stage, as a run's start splits the model (slsml.pipeline.staged.configured):"
        " each stage's function holds its own weights and stores its own part of the update"
    )
    pick: str = Field(description="what the plan would pick, and why")
    merger: str | None = Field(
        default=None,
        description="why the Merger cannot run this model, which it loads whole (the plan's quota memory: merger),"
        " whatever the stages; None: it can",
    )
    sources: dict[str, str]


def blocks_of(model: Any) -> list[Block]:
    """The blocks of the Keras ``model`` between its cut points (``slsml.training.stages.cut_points``), each with
    its weights, its layers' outputs and its training FLOPs of one sample (``slsml.cost.flops``)."""
    import numpy as np

    from slsml.cost import flops
    from slsml.training import stages

    def values(tensors: Sequence[Any]) -> int:  # of one sample
        return sum(math.prod(d or 1 for d in t.shape[1:]) for t in tensors)

    g = stages.graph(model)
    bounds = [0, *stages.cut_points(model), len(g.nodes)]
    found = []
    for start, stop in itertools.pairwise(bounds):
        block = stages.submodel(model, start, stop)
        sample = [np.zeros((1, *(d or 1 for d in t.shape[1:])), t.dtype) for t in block.inputs]
        found.append(
            Block(
                first=g.nodes[start].operation.name,
                last=g.nodes[stop - 1].operation.name,
                weight_bytes=4 * sum(math.prod(v.shape) for v in block.weights),
                outputs=tuple(values(n.outputs) for n in g.nodes[start:stop]),
                input_values=values(block.inputs),
                flops=flops.count(block, sample if len(sample) > 1 else sample[0]).training,
            )
        )
    return found


def hop_seconds(p: Parameters, handed: int, stages: int) -> float:
    """A micro-batch's ``handed`` bytes of activations handed to the next stage: stored, found by its poll (half a
    poll's wait), read."""
    moved = handed / (p.s3_write_mb_s * 1e6) + handed / (p.s3_read_mb_s * 1e6)
    return 0.0 if stages == 1 else 2 * p.s3_request_s + moved + POLL_S / 2


def round_seconds(
    p: Parameters, weight_bytes: int, micro_batches: int, stages: int, slowest_s: float, handed: int
) -> float:
    """A pipeline's round: its heaviest stage reading its ``weight_bytes`` and writing their part of the update, and
    M+S−1 slots forward and as many back (GPipe), each the slowest stage's micro-batch (``slowest_s``: forward, forward
    again and backward) and a hop each way of ``handed`` bytes."""
    weights_s = 2 * p.s3_request_s + weight_bytes / (p.s3_read_mb_s * 1e6) + weight_bytes / (p.s3_write_mb_s * 1e6)
    return weights_s + (micro_batches + stages - 1) * (slowest_s + 2 * hop_seconds(p, handed, stages))


def round_requests(
    p: Parameters,
    micro_batches: int,
    stages: int,
    pipelines: int,
    idle_s: float,
    parts: Sequence[int] = (),
    reducers: int = 0,
) -> dict[str, int]:
    """The requests of the stages' hand-offs in a round of ``pipelines`` pipelines, as ``slsml.pipeline.staged``
    sends them: each micro-batch's activation and its gradient put at every boundary and read once found; each stage
    after the first reads its input again at the backward pass; each stage stores its part of the update (``parts``:
    each stage's bytes, ``chain.creates``; one stored in parts looked for first, ``ObjectStore.put_own_streamed``),
    each later one a record naming it, which stage 0 reads; each of
    ``reducers`` reads, in place of its range of an update, the update's index and a range of each part its shard
    spans (its shard's and the parts' bounds meet at S−1 places at most); and the polls that find nothing, one a
    ``POLL_S`` and a request while a stage function waits (``idle_s``, every stage function's), and a read of the
    run's record every ``RUN_CHECK_S`` of polls (whether it still trains the round)."""
    hops, records = micro_batches * (stages - 1) * pipelines, (len(parts) - 1) * pipelines if parts else 0
    read = pipelines * (reducers + stages - 1) if reducers else 0  # more than an update's one range a reducer
    polls = round(idle_s / (POLL_S + p.s3_request_s))
    checks = math.floor(polls * POLL_S / RUN_CHECK_S)
    looked = pipelines * sum(upload_parts(size) > 1 for size in parts)  # a part stored in parts is looked for first
    requests = added(
        {"s3:PutObject": 2 * hops + records, "s3:GetObject": 3 * hops + records + read + polls},
        {"s3:HeadObject": looked} if looked else {},
        *(creates(pipelines, size) for size in parts),
    )
    return requests | ({"dynamodb:GetItem": checks} if checks else {})


def round_dollars(
    price_table: PriceTable,
    requests: dict[str, int],
    stages: int,
    pipelines: int,
    round_s: float,
    memory_mb: int,
    handed_on: int = 0,
) -> float:
    """A round's dollars: its ``stages`` × ``pipelines`` stage functions' GB-seconds and invocations (and the
    ``handed_on`` fresh invocations their rounds go on in), and its hand-offs' ``requests``."""
    functions = stages * pipelines
    billed = functions * prices.gb_seconds(round_s, memory_mb)
    return sum(price_table.cost(requests, gb_seconds=billed, invocations=functions + handed_on).values())


def hand_ons(
    p: Parameters,
    timeout_s: float,
    split: Sequence[Stage],
    micro_batches: int,
    round_s: float,
    pipelines: int,
    reducers: int,
) -> HandOns:
    """The hand-ons of a round of ``round_s`` in ``split``'s stage functions of ``timeout_s`` (``pipelines`` of each):
    each stage's passes (M forward and M backward, the last stage's M backward) share its round's time, and an
    invocation computes passes while the time left after them is above ``progress.reserve_s`` of its progress (its
    weights' float64 sums), one at least. Each hand-on stores the progress, records that the round goes on, publishes
    the stage's Work message, which is handled once, and the fresh invocation reads the progress and the weights
    entering the round (the manifest, ``reducers`` shards)."""
    stored = 2 * max(stage.weight_bytes for stage in split)
    counts = []
    for number in range(len(split)):
        passes = micro_batches * (1 if number == len(split) - 1 else 2)
        pass_s = round_s / passes
        usable = timeout_s - p.handler_s - progress.reserve_s(stored, pass_s, p.s3_write_mb_s)
        counts.append(invocations(passes, pass_s, usable)[0])
    handed = pipelines * sum(count - 1 for count in counts)
    requests: dict[str, int] = {}
    for operation, count, _ in hand_on_calls(stored, 2 + reducers):
        requests[operation] = requests.get(operation, 0) + handed * count
    hand_on_s = (
        transfer(1, stored, p.s3_request_s, p.s3_write_mb_s)
        + 4 * p.dynamodb_s
        + p.sns_publish_s
        + p.sns_lambda_s
        + p.handler_s
        + transfer(2 + reducers, stored, p.s3_request_s, p.s3_read_mb_s, parallel=2 + reducers)
    )
    return HandOns(
        timeout_s=timeout_s,
        invocations=max(counts),
        progress_bytes=stored,
        handed_on=handed,
        requests={k: v for k, v in requests.items() if v},
        seconds=(max(counts) - 1) * hand_on_s,
    )


def uniform_blocks(w: Workload, layers: int) -> list[Block]:
    """The blocks of a stack of ``layers`` equal dense layers of the workload's weights (``--dense-layers``): each
    of width √(params/layers), its output that wide."""
    if not 1 <= layers <= w.params:
        raise BadInputError(f"--dense-layers {layers}: a stack of 1 to {w.params:,} layers")
    width = max(1, round(math.sqrt(w.params / layers)))
    return [Block(f"dense_{i}", f"dense_{i}", 4 * w.params // layers, (width,), width, 1) for i in range(layers)]


def plan(
    w: Workload,
    p: Parameters,
    price_table: PriceTable,
    blocks: Sequence[Block],
    stages: int | None,
    timeout_s: float,
    gpu: Workload | None = None,
) -> PipelinePlan:
    """The pipeline plan of ``w``'s model as ``blocks`` in ``stages`` stages (None: the fewest that fit) in stage
    functions of ``timeout_s``, beside one bigger function and, with ``gpu`` (the same workload on GPU workers), a GPU
    worker. BadInputError in one line where no split fits."""
    memory = w.memory_mb["worker"]
    cache = MEMORY_SHARE * memory if w.cache_mb is None else w.cache_mb
    whole = sizing.WorkerMemory(memory, cache, sum(b.weight_bytes for b in blocks), 0.0)

    if stages is not None and stages > len(blocks):
        raise BadInputError(
            f"--pipeline-stages {stages}: the model's {len(blocks)} block{'s' * (len(blocks) > 1)} (the layers between"
            f" its cut points) make {len(blocks)} stage{'s' * (len(blocks) > 1)} at most: give --pipeline-stages"
            f" {len(blocks)}{' or fewer' * (len(blocks) > 1)}"
        )
    counts = [stages] if stages is not None else range(2, len(blocks) + 1)
    split = next((found for count in counts if (found := deployed(blocks, count, whole)) is not None), None)
    if split is None:
        raise BadInputError(unfit(blocks, stages, whole))
    S = len(split)
    share = math.ceil(w.global_batch / w.workers)
    fitting = [held(stage, whole).micro_batch() for stage in split]
    per_vcpu = speedup(vcpus(memory), p.vcpu_efficiency)
    total_flops = sum(s.flops for s in split) or 1
    heaviest = max(s.weight_bytes for s in split)
    parts = [s.weight_bytes for s in split]  # each stage's part of the update, as it stores it
    handed = max((s.activation_bytes for s in split[:-1]), default=0)

    def stage_s(stage: Stage, micro: int) -> float:
        return RECOMPUTE_SHARE * w.compute_per_sample_s * micro * stage.flops / total_flops / per_vcpu

    def round_s(micro: int) -> float:
        slowest = max(stage_s(s, micro) for s in split)
        return round_seconds(p, heaviest, -(-share // micro), S, slowest, micro * handed)

    # the micro-batch: the run's, else the one of the shortest round among those that fit (smaller ones shrink the
    # bubble, each adds a hop's latency), each the least of its count of micro-batches, up to MOST_MICRO_BATCHES
    fewest = -(-share // min(share, *fitting))
    counts = range(fewest, max(fewest, min(share, MOST_MICRO_BATCHES)) + 1)
    micro = w.training.micro_batch or min({-(-share // count) for count in counts}, key=round_s)
    M = -(-share // micro)
    figures = [
        StageFigures(
            first_layer=stage.blocks[0].first,
            last_layer=stage.blocks[-1].last,
            weight_bytes=stage.weight_bytes,
            flops_share=stage.flops / total_flops,
            fitting=fit,
            memory_needed_mb=held(stage, whole).needed_mb(micro, M),
            compute_s=stage_s(stage, micro),
            activation_bytes=micro * stage.activation_bytes,
        )
        for stage, fit in zip(split, fitting, strict=True)
    ]
    activation_bytes = 2 * M * w.workers * sum(f.activation_bytes for f in figures[:-1])
    busy = sum(M * stage_s(stage, micro) for stage in split)  # each pipeline's stage functions computing
    idle = w.workers * (S * round_s(micro) - busy)
    handing = hand_ons(p, timeout_s, split, M, round_s(micro), w.workers, w.reducers)
    requests = round_requests(p, M, S, w.workers, idle, parts, w.reducers)
    for operation, count in handing.requests.items():
        requests[operation] = requests.get(operation, 0) + count
    whole_s = round_s(micro) + handing.seconds
    # a pass is never handed on within: the slowest stage's, with its hops, must fit one invocation
    longest_pass = max(stage_s(stage, micro) for stage in split) + 2 * hop_seconds(p, micro * handed, S)
    over = longest_pass + p.handler_s > timeout_s
    dollars = round_dollars(price_table, requests, S, w.workers, whole_s, memory, handing.handed_on)
    samples = share * w.workers
    options = [
        Option(
            name=f"{S} stages of {memory:,} MB",
            fits=not over,
            round_s=whole_s,
            dollars=dollars,
            detail=f"{S * w.workers} functions; bubble {bubble(S, M):.0%}"
            + (
                f"; a stage's pass of {longest_pass:,.1f} s outlasts the Worker's timeout of {timeout_s:g} s (a pass is"
                " never handed on within: raise functions.worker.timeout_s, or give a smaller --micro-batch)"
                if over
                else ""
            ),
        ),
        _bigger(w, p, price_table, share, timeout_s),
    ]
    if gpu is not None:
        options.append(_gpu(gpu, p, price_table, share))
    return PipelinePlan(
        stages=S,
        given=stages is not None,
        memory_mb=memory,
        micro_batch=micro,
        micro_batches=M,
        bubble=bubble(S, M),
        per_stage=figures,
        hop_s=hop_seconds(p, micro * handed, S),
        round_s=whole_s,
        activation_bytes_per_round=activation_bytes,
        requests_per_round=requests,
        hand_ons=handing,
        dollars_per_round=dollars,
        samples_per_round=samples,
        options=options,
        deployed=[len(stage.blocks) for stage in split],
        pick=_pick(options, samples),
        sources={
            "stage memory": "slsml.rounds.sizing.WorkerMemory of the stage's weights and layer outputs (one"
            " micro-batch's: the stage computes its forward pass again at the backward pass), and the parts in"
            " flight as it stores its part of the update (slsml.rounds.stages.held)",
            "stage compute": f"the model's compute per sample, {w.compute_source}, × the stage's share of the FLOPs ×"
            f" {RECOMPUTE_SHARE:.3g} (its forward pass twice) on {vcpus(memory):.3g} vCPUs",
            "hop": f"s3_request_s, s3_write_mb_s, s3_read_mb_s (parameters) and half a poll of {POLL_S:g} s",
            "requests": "slsml.cost.stages.round_requests: the hand-offs as slsml.pipeline.staged sends them, and"
            " the polls of the stage functions while they wait, with a read of the run's record every"
            f" {RUN_CHECK_S:g} s of polls; slsml.cost.stages.hand_ons: a stage's round past the"
            f" Worker's timeout ({timeout_s:g} s) handed on to fresh invocations",
            "bubble": "GPipe: (S−1)/(M+S−1)",
            "dollars": f"Lambda GB-seconds of {S * w.workers} functions for the round, and the hops' requests",
        },
    )


def _bigger(w: Workload, p: Parameters, price_table: PriceTable, share: int, timeout_s: float) -> Option:
    """The smallest Lambda memory whose worker holds the whole model (its share in micro-batches that fit, handed on
    between them past the Worker's ``timeout_s``: one sample's step must fit it)."""
    for memory in MEMORY_CHOICES_MB:
        whole = sizing.WorkerMemory(memory, MEMORY_SHARE * memory, 4 * w.params, w.activation_bytes_per_sample)
        if whole.micro_batch() >= 1:
            cpus = speedup(vcpus(memory), p.vcpu_efficiency)
            model = 4 * w.params
            round_s = (
                2 * p.s3_request_s
                + model / (p.s3_read_mb_s * 1e6)
                + model / (p.s3_write_mb_s * 1e6)
                + share * w.compute_per_sample_s / cpus
            )
            dollars = sum(
                price_table.cost(
                    {}, gb_seconds=w.workers * prices.gb_seconds(round_s, memory), invocations=w.workers
                ).values()
            )
            sample_s = w.compute_per_sample_s / cpus
            over = sample_s + p.handler_s > timeout_s
            return Option(
                name=f"one function of {memory:,} MB",
                fits=not over,
                round_s=round_s,
                dollars=dollars,
                detail=f"{w.workers} functions; the whole model in each"
                + (
                    f"; one sample's step of {sample_s:,.1f} s outlasts the Worker's timeout of {timeout_s:g} s (a"
                    " micro-batch is never handed on within: raise functions.worker.timeout_s)"
                    if over
                    else ""
                ),
            )
    need = sizing.WorkerMemory(10240, MEMORY_SHARE * 10240, 4 * w.params, w.activation_bytes_per_sample)
    return Option(
        name="one bigger function",
        fits=False,
        detail=f"the whole model's step needs ~{need.needed_mb(1, 2):,.0f} MB, beyond Lambda's 10,240 MB",
    )


def _gpu(gpu: Workload, p: Parameters, price_table: PriceTable, share: int) -> Option:
    """A GPU worker holding the whole model (``slsml.cost.gpuworker``): its layer outputs on the GPU, its function's
    memory holding the rest (``slsml.rounds.sizing.micro_batch``)."""
    a = gpu.accelerator
    assert a is not None
    device = sizing.AcceleratorMemory(a.gib, 4 * gpu.params, gpu.activation_bytes_per_sample, a.precision)
    memory = gpu.memory_mb["worker"]
    cache = MEMORY_SHARE * memory if gpu.cache_mb is None else gpu.cache_mb
    host = sizing.WorkerMemory(memory, cache, 4 * gpu.params, 0.0)  # its layer outputs are the GPU's
    name = f"a GPU worker of {a.gib} GiB on {a.instance}"
    if (refusal := host.refusal() or device.refusal()) is not None:
        return Option(name=name, fits=False, detail=refusal.split(": give")[0])
    model = 4 * gpu.params
    rate = gpuworker.s3_mb_s(gpu, 1)
    round_s = 2 * p.s3_request_s + 2 * model / (rate * 1e6) + gpuworker.KIND.compute_s(gpu, p, share)
    dollars = sum(gpuworker.KIND.capacity_dollars(gpu, p, price_table, round_s, 0.0).values())
    return Option(name=name, fits=True, round_s=round_s, dollars=dollars, detail=f"{gpu.workers} environments")


def _pick(options: list[Option], samples: int) -> str:
    """The fitting option of the fewest dollars a round, and why."""
    fitting = [o for o in options if o.fits and o.dollars is not None]
    out = [o.name for o in options if not o.fits]
    unfit = " and ".join(out) + (" does not fit" if len(out) == 1 else " do not fit")  # (the options say why)
    if not fitting:
        return f"none: {unfit}"
    best = min(fitting, key=lambda o: o.dollars or 0.0)
    rest = [o for o in fitting if o is not best]
    why = f"${(best.dollars or 0) / samples:.3g} a sample"
    if rest:
        why += ", against " + ", ".join(f"${(o.dollars or 0) / samples:.3g} ({o.name})" for o in rest)
    if out:
        why += f"; {unfit}"
    return f"{best.name}: {why}"
