"""``slsml plan``: the cost model's inputs from the command line, its answers as tables, JSON and a sweep
chart in the shape of slsML's Figure 4 (time and cost per epoch against the number of workers)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slsml.spec.errors import BadInputError

if TYPE_CHECKING:  # the model's modules load when a plan is made, not when the CLI parses its arguments
    from slsml.accounting.prices import PriceTable
    from slsml.cost.parameters import Parameters, Quotas
    from slsml.cost.plan import Plan
    from slsml.cost.recommend import Recommendation, SweepPoint
    from slsml.cost.stages import PipelinePlan
    from slsml.cost.verdict import Verdict
    from slsml.cost.vm import Side
    from slsml.cost.workload import Workload
    from slsml.data.manifest import DatasetManifest
    from slsml.spec.config import TrainingSpec
    from slsml.spec.deployment import FunctionSettings
    from slsml.spec.limits import RunLimits

SWEEP_METADATA = "slsml-sweep"  # PNG text chunk: the plotted points as JSON


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan's own options; the run's training flags (``run start``'s) come from the CLI, and a plan without
    --reducers takes the fastest R for W."""
    model = parser.add_argument_group("model (one of)")
    model.add_argument("--model", help="a .keras file: its weights are counted and one gradient step is timed")
    model.add_argument("--params", type=int, help="or the number of float32 weights (a ResNet-50-like network)")
    model.add_argument(
        "--compute-per-sample",
        type=float,
        help="your own figure: seconds of one sample's gradient on one vCPU, for CPU workers (default: measured with"
        " --model); GPU workers are timed by the model's FLOPs",
    )
    model.add_argument("--sample-bytes", type=int, help="bytes of one training sample (default: the model's input)")
    model.add_argument(
        "--dense-layers",
        type=int,
        metavar="L",
        help="with --params: the model is a stack of L equal dense layers, cut into pipeline stages between them"
        " (their outputs √(params/L) wide)",
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data",
        metavar="NAME",
        help="an uploaded dataset: its samples, their bytes and its shards"
        " from its manifest (the local service's, or --stack's)",
    )
    data.add_argument(
        "--stack",
        help="the deployed stack planned for: its Worker and Reducer timeouts and the bucket that holds --data"
        " (default: the local service's, if one is up)",
    )
    data.add_argument(
        "--cache-mb",
        type=float,
        help="the workers' warm cache bound, SLSML_WARM_CACHE_MB (default: half a Worker's memory)",
    )
    shape = parser.add_argument_group("pipeline")
    shape.add_argument(
        "--memory",
        action="append",
        default=[],
        metavar="FUNCTION=MB",
        help="function memory, e.g. worker=4096 (default: the deployment's settings)",
    )
    gpu = parser.add_argument_group("GPU workers (Lambda Managed Instances)")
    gpu.add_argument(
        "--accelerator",
        metavar="worker=GIB",
        help="price GPU workers of this much GPU memory per execution environment (3, 6, 12, 16, 24 or 48), e.g."
        " worker=24, beside CPU workers and one machine of their instance type; without --workers, at the cheapest W"
        " (up to 8) and R whose epoch is as fast as that machine (default W without --accelerator: 4)",
    )
    gpu.add_argument(
        "--gpu-instance",
        metavar="TYPE",
        help="the instance type GPU workers run on, e.g. g5.xlarge (default: the deployment's"
        " functions.worker.instance_types, --stack's, else the one the stack deploys, g6.xlarge)",
    )
    gpu.add_argument(
        "--gpu-calibration",
        metavar="FILE",
        help="a calibration `slsml bench gpu` wrote: the fraction of its card's peak a training step achieved,"
        " used for that card only, refused for another (default: .slsml/gpu-calibration.json where it exists and"
        " measured the workers' card)",
    )
    length = parser.add_argument_group("length (or --iterations, or --epochs of --samples)")
    length.add_argument("--samples", type=int, help="training samples: per-epoch figures")
    model_of = parser.add_argument_group("model parameters, quotas, prices")
    model_of.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a parameter of the model (listed in the output)",
    )
    model_of.add_argument("--calibration", help="a JSON object of fitted parameter values")
    model_of.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a raised AWS quota, e.g. lambda_concurrency=3000",
    )
    model_of.add_argument("--prices", help="a JSON price table over the built-in one (default $SLSML_PRICES)")
    out = parser.add_argument_group("output")
    one_or_many = out.add_mutually_exclusive_group()  # a sweep prices many W, and compares none with a machine
    one_or_many.add_argument(
        "--sweep",
        nargs="?",
        const=(),
        type=_workers,
        metavar="W,W,…",
        help="instead of the plan of one W: time and dollars per epoch against W, from 1 to 1,000 (default) or at the"
        " W given, e.g. --sweep 1,4,16,64,256 (R as given, else the fastest at each W)",
    )
    out.add_argument("--png", default="plan-sweep.png", help="where --sweep draws its chart (default plan-sweep.png)")
    one_or_many.add_argument(
        "--compare-vm",
        metavar="SAMPLES_PER_S:DOLLARS_PER_HOUR[:NAME]",
        type=_vm,
        help="price the same epoch on one machine of this training throughput on the model (measured"
        " or published, samples/s) and hourly price, e.g. 1200:3.06:p3.2xlarge (default with --accelerator: one"
        " machine of the GPU workers' instance type at the throughput the plan uses for it), and recommend the"
        " cheapest W and R whose epoch is as fast as it",
    )
    out.add_argument("--json", action="store_true", help="print the plan as one JSON object")


def iterations(args: argparse.Namespace) -> int:
    """The run's iterations: --iterations, or --epochs of --samples (its epoch's batches as a run counts them), or an
    epoch of --samples, or the spec's."""
    from slsml.spec.config import TrainingSpec
    from slsml.spec.samples import epoch_batches

    if args.epochs is not None and args.iterations is not None:
        raise BadInputError("give --iterations or --epochs, not both")
    if args.epochs is not None and args.samples is None:
        raise BadInputError("--epochs needs --samples (the training samples of one epoch)")
    if args.samples is not None and args.samples < 1:
        raise BadInputError("--samples counts from 1")
    if args.epochs is not None:
        return max(1, round(args.epochs * epoch_batches(args.samples, args.batch, _asked_workers(args))))
    return args.iterations or (
        epoch_batches(args.samples, args.batch, _asked_workers(args))
        if args.samples
        else TrainingSpec.model_fields["iterations"].default
    )


def workload(
    args: argparse.Namespace,
    spec: TrainingSpec,
    parameters: Parameters,
    manifest: DatasetManifest | None = None,
    limits: RunLimits | None = None,
) -> Workload:
    """The workload the arguments, the run's training flags (``spec``), the dataset (``--data``) and the run limits
    of the deployment planned for (its function timeouts, its worker's memory) describe."""
    from slsml.cost import modelinfo
    from slsml.cost import workload as workloads

    if bool(args.model) == (args.params is not None):
        raise BadInputError("give the model: --model FILE.keras or --params N")
    deployed = {} if limits is None else {"worker": limits.worker_memory_mb}
    memory = workloads.function_memory(deployed | dict(_memory(text) for text in args.memory))
    if args.model:
        measure = args.compute_per_sample is None
        batch = workloads.measured_batch(spec)
        if measure:
            modelinfo.pin_one_thread()
        figures = modelinfo.from_keras_file(args.model, batch, measure, parameters, spec.loss, manifest)
        if not measure:
            figures.update(compute_per_sample_s=args.compute_per_sample, compute_source=modelinfo.GIVEN)
    else:
        figures = modelinfo.from_params(args.params, parameters, compute_per_sample_s=args.compute_per_sample)
    if args.sample_bytes is not None:
        figures["sample_bytes"] = args.sample_bytes
    return workloads.run_workload(figures, spec, args.samples, manifest, args.cache_mb, memory, limits)


def _vm(text: str) -> tuple[float, float, str]:
    """``SAMPLES_PER_S:DOLLARS_PER_HOUR[:NAME]`` → (samples/s, $/h, name)."""
    throughput, _, rest = text.partition(":")
    price, _, name = rest.partition(":")
    try:
        figures = float(throughput), float(price)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write SAMPLES_PER_S:DOLLARS_PER_HOUR[:NAME], e.g. 1200:3.06:p3.2xlarge"
        ) from None
    if min(figures) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a machine's throughput and price are above 0")
    return *figures, name or "one machine"


def _asked_workers(args: argparse.Namespace) -> int:
    """The workers the run asks for (``TrainingSpec.asked_workers``): the fewest samples of an epoch's last, smaller
    batch it trains."""
    workers = getattr(args, "workers", None)
    initial = workers if isinstance(workers, int) else getattr(args, "min_workers", None) or 1
    return max(getattr(args, "max_workers", None) or 0, initial)


def _workers(text: str) -> tuple[int, ...]:
    """``W,W,…`` → the worker counts, increasing."""
    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write worker counts, e.g. 1,4,16,64,256") from None
    if counts[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a run trains with at least 1 worker")
    return tuple(counts)


def _memory(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    try:
        return name.strip(), int(value)
    except ValueError:
        raise BadInputError(f"--memory {text!r}: write FUNCTION=MB, e.g. worker=4096") from None


def run(
    args: argparse.Namespace,
    spec: TrainingSpec,
    console: Any,
    manifest: DatasetManifest | None = None,
    limits: RunLimits | None = None,
    workers_given: bool = True,
    stale_given: bool = True,
) -> int:
    """The plan of the run ``spec`` (its R the fastest for W unless --reducers was given), the arguments and the
    dataset on the deployment of run ``limits`` (a default one: None), drawn on ``console``; with --json also as
    one JSON object on stdout. With --accelerator the plan is of GPU workers, and with it or --compare-vm the CPU
    workers', the GPU workers' and one machine's figures are set side by side, and the cheapest W and R as fast as
    the machine recommended: with --accelerator and no --workers (``workers_given`` False) the plan is of that W
    and R, and, without --stale-weights (``stale_given`` False), on stale weights where its cards wait for the chain
    more than a tenth of the iteration (``verdict.on_stale_weights``)."""
    from slsml.accounting import prices
    from slsml.cost.parameters import Parameters, Quotas, load_overrides
    from slsml.cost.recommend import as_fast_as, recommend
    from slsml.cost.verdict import on_stale_weights
    from slsml.cost.verdict import verdict as verdict_of
    from slsml.cost.vm import compare_vm, side_by_side

    parameters, origin = load_overrides(args.calibration, args.param, Parameters)
    quotas, _ = load_overrides(None, args.quota, Quotas)
    price_table = prices.load(args.prices)
    worker, no_gpu = gpu_worker(args, price_table, limits)  # refused before the model is timed
    cpu = workload(args, spec, parameters, manifest, limits)
    gpu = None
    if worker is not None:
        gpu, no_gpu = _gpu_workload(args, cpu, worker, parameters, price_table)
    asked = cpu if gpu is None or args.accelerator is None else gpu
    fixed = args.reducers is not None
    if args.sweep is not None:
        return _sweep(args, asked, parameters, quotas, price_table, fixed, console)
    plan = _plan(asked, parameters, quotas, price_table, origin, fixed)
    choosing = gpu is not None and args.accelerator is not None and not workers_given
    if choosing and not stale_given and (stale := on_stale_weights(plan)) is not None:
        asked = stale  # its cards wait for the chain: the plan chooses stale weights as it chooses W and R
        plan = _plan(asked, parameters, quotas, price_table, origin, fixed)
    machine = None
    if args.compare_vm:
        samples_per_s, dollars_per_hour, name = args.compare_vm
        machine = name, samples_per_s, dollars_per_hour, "given (--compare-vm)"
    elif gpu is not None:  # --accelerator: the plan is the GPU workers'
        machine = _machine(plan, parameters, price_table)
    match = None
    if machine is not None:
        against = compare_vm(plan, *machine, parameters, price_table)
        match = as_fast_as(plan.workload, against, parameters, quotas, price_table, fixed)
        if match is not None and args.accelerator is not None and not workers_given:
            match = match.model_copy(update={"priced": True})
            at_match = asked.at(workers=match.workers, reducers=match.reducers)
            plan = _plan(at_match, parameters, quotas, price_table, origin, fixed=True)
    recommendation = recommend(plan.workload, parameters, quotas, price_table)
    recommendation = recommendation.model_copy(update={"as_fast_as_machine": match})
    verdict = verdict_of(plan, recommendation, parameters, quotas, price_table)
    other = None
    if gpu is not None:
        other = _plan(cpu if asked is gpu else gpu, parameters, quotas, price_table, origin, fixed)
    vm = None if machine is None else compare_vm(plan, *machine, parameters, price_table)
    sides = []
    if vm is not None:
        verdict = verdict.model_copy(update={"compared": vm.sentence})
        plans = sorted((p for p in (plan, other) if p is not None), key=lambda p: p.workload.worker_kind)
        sides = side_by_side([(_who(p), p) for p in plans], vm, parameters, price_table)
    pipeline = _pipeline(args, cpu, gpu, parameters, quotas, price_table)
    merger = next((q for q in plan.quotas if q.name == "memory: merger" and not q.ok), None)
    if pipeline is not None and merger is not None:  # stages split the workers' model, not the Merger's
        pipeline = pipeline.model_copy(update={"merger": merger.detail})
    render(plan, recommendation, console, fixed, verdict)
    if pipeline is not None:
        _render_pipeline(pipeline, console)
    for shown in (plan, other):
        if shown is not None and shown.workload.accelerator is not None:
            _render_gpu(shown, console)
    if sides:
        _render_sides(sides, console, no_gpu)
    if args.json:
        out = (
            {"verdict": verdict.model_dump(mode="json")}
            | plan.summary()
            | {"recommendation": recommendation.model_dump(mode="json")}
        )
        if other is not None:
            out[f"{other.workload.worker_kind}_plan"] = other.summary()
        if pipeline is not None:
            out["pipeline"] = pipeline.model_dump(mode="json")
        if vm is not None:
            out["compare_vm"] = vm.model_dump(mode="json")
            out["side_by_side"] = [side.model_dump(mode="json") for side in sides]
        print(json.dumps(out))
    return 0


def _pipeline(
    args: argparse.Namespace,
    cpu: Workload,
    gpu: Workload | None,
    parameters: Parameters,
    quotas: Quotas,
    price_table: PriceTable,
) -> PipelinePlan | None:
    """The plan of the model in pipeline stages of CPU workers (``slsml.cost.stages``; ``gpu``: the same workload
    on GPU workers, weighed beside them): at --pipeline-stages, else, where not one sample's step fits a CPU worker,
    at the fewest stages that fit; None at --pipeline-stages 1, or where the model fits and no stage count is given,
    or (no count given) its layers are not known."""
    from slsml.aws.cache import MEMORY_SHARE
    from slsml.cost import stages
    from slsml.rounds import sizing

    asked, work = args.pipeline_stages, cpu
    memory = work.memory_mb["worker"]
    cache = MEMORY_SHARE * memory if work.cache_mb is None else work.cache_mb
    over = sizing.WorkerMemory(memory, cache, 4 * work.params, work.activation_bytes_per_sample).micro_batch() < 1
    if asked == 1 or (asked is None and not over):
        return None
    if args.model:
        from slsml.training import modelio
        from slsml.training import stages as split

        model = modelio.load_model(Path(args.model).read_bytes(), where=args.model)
        if asked is not None and (why := split.refusal(model, asked)) is not None:
            raise BadInputError(why)
        blocks = stages.blocks_of(model)
    elif args.dense_layers is not None:
        blocks = stages.uniform_blocks(work, args.dense_layers)
    elif asked is None:
        return None
    else:
        raise BadInputError(
            f"--pipeline-stages {asked} of --params: give --dense-layers L (a stack of L equal dense layers) or"
            " --model FILE.keras, whose layers the stages are cut between"
        )
    timeout_s = min(work.timeout_s["worker"], quotas.lambda_timeout_s)  # the Worker's, at most Lambda's
    return stages.plan(work, parameters, price_table, blocks, asked, timeout_s, gpu)


def _render_pipeline(pipeline: PipelinePlan, console: Any) -> None:
    """The pipeline's stages, its round and what the plan would pick."""
    from rich.table import Table

    p = pipeline
    how = "given (--pipeline-stages)" if p.given else "the fewest whose stages fit"
    table = Table(
        "stage",
        "layers",
        "weights",
        "FLOPs",
        "samples fit",
        "needs",
        "compute",
        "hands on",
        title=f"pipeline: {p.stages} stages ({how}) of {p.memory_mb:,} MB, micro-batch {p.micro_batch:,}",
    )
    for number, s in enumerate(p.per_stage):
        table.add_row(
            str(number),
            s.first_layer if s.first_layer == s.last_layer else f"{s.first_layer} … {s.last_layer}",
            _bytes(s.weight_bytes),
            f"{s.flops_share:.0%}",
            f"{s.fitting:,}",
            f"{s.memory_needed_mb:,.0f} MB",
            _time(s.compute_s),
            _bytes(s.activation_bytes) if number < p.stages - 1 else "",
        )
    console.print(table)
    requests = ", ".join(f"{count:,} {name}" for name, count in p.requests_per_round.items())
    console.print(
        f"round: {_time(p.round_s)} for {p.samples_per_round:,} samples, {_dollars(p.dollars_per_round)}; M"
        f" {p.micro_batches:,} micro-batches a pipeline, bubble {p.bubble:.0%} ((S−1)/(M+S−1)); activations"
        f" {_bytes(p.activation_bytes_per_round)} a round ({requests}), a hop {_time(p.hop_s)}"
    )
    if (handing := p.hand_ons).invocations > 1:
        console.print(
            f"a stage's round outlasts the Worker's timeout of {_time(handing.timeout_s)}: it goes on in up to"
            f" {handing.invocations:,} invocations, handed on between passes ({handing.handed_on:,} hand-ons a round"
            f" of {_bytes(handing.progress_bytes)} each at most, {_time(handing.seconds)} added)"
        )
    blocks = ", ".join(map(str, p.deployed))
    console.print(
        f"a run splits the model into stages of {blocks} blocks, each stage's function holding its own weights and"
        " storing its own part of the update, which the reducers read by range"
    )
    for option in p.options:
        figures = f"{_time(option.round_s)}, {_dollars(option.dollars)}" if option.fits else "does not fit"
        console.print(f"  {option.name}: {figures} ({option.detail})")
    console.print(f"→ pick: {p.pick}")
    if p.merger is not None:
        console.print(f"[red]but a run of this model cannot work: the Merger loads the whole model: {p.merger}")
    for name, source in p.sources.items():
        console.print(f"  [dim]{name}: {source}")


def _plan(
    work: Workload,
    parameters: Parameters,
    quotas: Quotas,
    price_table: PriceTable,
    origin: dict[str, str],
    fixed: bool,
) -> Plan:
    """The plan of ``work`` at its reducers, or at the fastest for its W where they are not ``fixed``; refused as
    ``check`` refuses it."""
    from slsml.cost import predict as costmodel
    from slsml.cost.plan import with_origin
    from slsml.cost.recommend import fastest_reducers

    if not fixed:
        work = work.at(reducers=fastest_reducers(work, parameters, quotas, price_table))
    costmodel.check(work, parameters, quotas)
    return with_origin(costmodel.predict(work, parameters, quotas, price_table), origin)


def accelerator_gib(text: str) -> int:
    """``--accelerator worker=GIB`` → GIB, or BadInputError in one line (only the worker has a GPU)."""
    from slsml.spec.deployment import checked_settings

    function, _, value = text.partition("=")
    if function.strip() != "worker" or not value.strip().isdigit():
        raise BadInputError(f"--accelerator {text!r}: write worker=GIB, e.g. worker=24 (only workers compute on GPUs)")
    try:
        return checked_settings("accelerator_gib", {"worker": int(value)}, ("worker",))["worker"]
    except BadInputError as error:
        raise BadInputError(f"--accelerator: {error}") from None


def gpu_worker(
    args: argparse.Namespace, price_table: PriceTable, limits: RunLimits | None
) -> tuple[FunctionSettings | None, str | None]:
    """The GPU worker planned, as a deployment's ``functions.worker`` settings: of --accelerator's memory, else (with
    --compare-vm naming a GPU instance type of the price table) of a whole GPU of that type; on --gpu-instance, else
    on the deployment's instance types (--stack's, else the stack's default); of the deployment's GPU worker memory
    (--memory worker=MB over it). Or, where there is none beside a --compare-vm, why. BadInputError, in one line,
    where the stack would refuse it (``deployment.check_gpu_function``, synth's check), before any model is timed."""
    from pydantic import ValidationError

    from slsml.spec.deployment import GPU_WORKER_DEFAULTS, FunctionSettings, check_gpu_function

    deployed = limits is not None and limits.worker_accelerator_gib is not None
    types = limits.worker_instance_types if limits is not None and deployed else GPU_WORKER_DEFAULTS["instance_types"]
    if args.gpu_instance is not None:
        types = (args.gpu_instance,)
    if args.accelerator is not None:
        gib = accelerator_gib(args.accelerator)
    elif args.compare_vm and args.compare_vm[2] in price_table.gpu_instances:
        types = (args.gpu_instance or args.compare_vm[2],)
        gib = price_table.gpu_instances[types[0]].gpu_memory_gib
    else:
        return None, (
            "give --accelerator worker=GIB, or name the machine by a GPU instance type of the price table (e.g."
            " 638:1.006:g5.xlarge)"
        )
    given = dict(_memory(text) for text in args.memory).get("worker")
    memory = given or (limits.worker_memory_mb if limits is not None and deployed else GPU_WORKER_DEFAULTS["memory_mb"])
    flag = f"--memory worker={given}" if given else f"--accelerator worker={gib}"
    try:
        settings = FunctionSettings(accelerator_gib=gib, memory_mb=memory, instance_types=types)
        check_gpu_function(settings, "functions.worker")
    except ValidationError as error:
        raise BadInputError(f"{flag}: functions.worker.memory_mb={memory}: {error.errors()[0]['msg']}") from None
    except ValueError as error:
        raise BadInputError(f"{flag}: the stack refuses a GPU worker of {error}") from None
    return settings, None


def _gpu_workload(
    args: argparse.Namespace,
    cpu: Workload,
    worker: FunctionSettings,
    parameters: Parameters,
    price_table: PriceTable,
) -> tuple[Workload | None, str | None]:
    """``cpu`` with GPU workers of ``worker``'s settings (``gpu_worker``); or, where their card cannot be priced
    beside a --compare-vm, why. The fraction of the card's peak achieved comes from --gpu-calibration (or the default
    calibration file, if there is one) where it measured that card. BadInputError where --accelerator's cannot be
    priced, or where --gpu-calibration measured another card."""
    from slsml.cost import gpuworker
    from slsml.cost.calibration import CALIBRATION_FILE, load_calibration

    assert worker.accelerator_gib is not None
    path = Path(args.gpu_calibration) if args.gpu_calibration else CALIBRATION_FILE
    calibration = load_calibration(path) if args.gpu_calibration or path.exists() else None
    if calibration is not None and args.gpu_calibration:
        gpuworker.check_calibration(calibration, args.gpu_calibration, worker.instance_types)
    try:
        chosen = gpuworker.accelerator(
            worker.accelerator_gib, cpu, parameters, price_table, calibration, str(path), worker.instance_types
        )
    except BadInputError as error:
        if args.accelerator is not None:
            raise
        return None, str(error)
    return cpu.at(accelerator=chosen, memory_mb={**cpu.memory_mb, "worker": worker.memory_mb}), None


def _machine(gpu: Plan, parameters: Parameters, price_table: PriceTable) -> tuple[str, float, float, str]:
    """One machine of the GPU workers' instance type at the throughput the plan uses for it: (name, samples/s, $/h,
    source), as ``compare_vm`` takes them."""
    from slsml.cost import gpuworker

    samples_per_s, dollars_per_hour, name, source = gpuworker.machine(gpu.workload, parameters, price_table)
    return name, samples_per_s, dollars_per_hour, source


def _who(plan: Plan) -> str:
    """The plan's workers, in words."""
    w = plan.workload
    if w.accelerator is None:
        return f"CPU functions: {w.workers} workers of {w.memory_mb['worker']:,} MB, R {w.reducers}"
    return f"GPU functions: {w.workers} workers of {w.accelerator.gib} GiB on {w.accelerator.instance}, R {w.reducers}"


def _sweep(
    args: argparse.Namespace,
    work: Workload,
    parameters: Parameters,
    quotas: Quotas,
    price_table: PriceTable,
    fixed: bool,
    console: Any,
) -> int:
    """The sweep of ``work`` over W (``--sweep``'s, else ``SWEEP_WORKERS``): its table and chart, and with --json
    one JSON object of the workload and the points. Each W is priced as it would run (its workers' shares in
    micro-batches, its rounds handed on past the timeout); a W over a quota is a point over the limits it breaks."""
    from slsml.cost.recommend import SWEEP_WORKERS, sweep

    workers = args.sweep or SWEEP_WORKERS
    points = sweep(work, parameters, quotas, price_table, reducers_fixed=fixed, workers=workers)
    if not points:
        raise BadInputError(f"--sweep: no W of {', '.join(map(str, workers))} is within the batch and concurrency")
    reducers = f"R = {work.reducers}" if fixed else "the fastest R at each W"
    write_sweep_png(
        points,
        Path(args.png),
        f"{work.model}: {work.params:,} weights, batch {work.global_batch:,},"
        f" {work.samples:,} samples per epoch, {reducers}",
    )
    render_sweep(points, args.png, console)
    if args.json:
        out = {
            "workload": work.model_dump(mode="json", exclude={"workers", "reducers"}),
            "sweep": [point.model_dump(mode="json") for point in points],
            "png": str(args.png),
        }
        print(json.dumps(out))
    return 0


# ---- text --------------------------------------------------------------------------------------


def _bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:,.1f} {unit}"
    return f"{count:,.0f} B"


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds >= 3600:
        return f"{seconds / 3600:,.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds:,.2f} s" if seconds >= 1 else f"{seconds * 1000:,.0f} ms"


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _dollars(amount: float | None) -> str:
    if amount is None:
        return "–"
    return f"${amount:,.2f}" if amount >= 10 else f"${amount:,.4f}"


def render(plan: Plan, recommendation: Recommendation, console: Any, reducers_given: bool, verdict: Verdict) -> None:
    from rich.table import Column, Table

    from slsml.cost.plan import binding_sentence, minimum_sentence
    from slsml.cost.workerround import step_in_words

    w = plan.workload
    _render_verdict(verdict, console)
    console.rule("detail")
    per_worker = math.ceil(w.global_batch / w.workers)
    reducers = "" if reducers_given else " (the fastest)"
    workers = ""
    match = recommendation.as_fast_as_machine
    if match is not None and match.priced:
        chosen = (
            f"the cheapest of {match.searched} as fast as {match.machine}"
            if match.as_fast
            else f"the fastest of {match.searched}, none being as fast as {match.machine}"
        )
        if reducers_given:
            workers = f" (chosen: {chosen}; --workers chooses otherwise)"
        else:
            stale = "; on stale weights: --stale-weights 0 chooses otherwise" if match.stale_weights else ""
            reducers = f" (W and R chosen: {chosen}; --workers and --reducers choose otherwise{stale})"
    step = step_in_words(plan.micro_batch, plan.micro_batches)
    console.print(
        f"[bold]{w.model}[/bold]: {w.params:,} weights, {_bytes(4 * w.params)} · W {w.workers}{workers}"
        f" · R {w.reducers}{reducers} · batch {w.global_batch:,} (≤ {per_worker} per worker, {step})"
        f" · quorum {w.quorum:g} (n = {plan.participants}) · {w.training.algorithm}, compress {w.training.compress}"
        f" · {w.optimizer.name} ({plan.state_slots} state slots on the reducers)"
    )
    console.print(f"compute {w.compute_per_sample_s:.4g} s per sample on one vCPU: {w.compute_source}")
    console.print(f"workers: {plan.worker.compute}; {plan.worker.billing}")
    proofs = plan.proofs
    console.print(
        f"proofs: {proofs.kms_requests:,} KMS requests a run ({proofs.key_pairs} key pairs and their vouch at the"
        f" launch, {proofs.unseals:,} Decrypts: the vouch and a private key per container), ${proofs.dollars:.6f} a"
        f" run; none an iteration: {proofs.messages_per_iteration:,} messages, each signed ({proofs.sign_ms:g} ms)"
        f" and checked ({proofs.check_ms:g} ms) on its hop"
    )
    if (data := plan.data) is not None:
        console.print(
            f"data ({data.order} order): {data.samples:,} samples of {_bytes(data.sample_bytes)}, "
            f"{_bytes(data.split_bytes)} in shards of {data.shard_records:,}; {data.detail}: "
            f"{data.gets_per_iteration:,.1f} GETs and {_bytes(data.bytes_per_iteration)} an iteration, "
            f"{_time(data.read_s)} of a worker's alongside its weights"
        )

    stages = Table("stage", "time", "what", title="one iteration, steady state: the critical path")
    for stage in plan.stages:
        stages.add_row(stage.name, _time(stage.seconds), stage.detail, style=None if stage.function else "dim")
    stages.add_row(
        "[bold]iteration",
        f"[bold]{_time(plan.iteration_s)}",
        f"chain {_time(plan.chain_s)}; DynamoDB floor {_time(plan.floor_s)}",
    )
    console.print(stages)

    functions = Table(
        "function",
        "invocations",
        "memory",
        "needs",
        "time",
        "GB-s",
        "S3 read (all)",
        "S3 written (all)",
        title="by function: the invocation on the path (all of an iteration)",
    )
    for f in plan.functions:
        functions.add_row(
            f.function,
            f"{f.invocations:,}",
            f"{f.memory_mb:,} MB",
            f"{f.memory_needed_mb:,.0f} MB",
            _time(f.seconds),
            f"{f.gb_seconds:,.1f}",
            f"{_bytes(f.bytes_read)} ({_bytes(f.bytes_read_total)})",
            f"{_bytes(f.bytes_written)} ({_bytes(f.bytes_written_total)})",
        )
    console.print(functions)

    services = Table("request", "per iteration", "minimum chain", title="requests by service:Operation")
    for operation, count in sorted(plan.requests_per_iteration.items()):
        services.add_row(operation, f"{count:,}", f"{plan.minimum_requests_per_iteration.get(operation, 0):,}")
    services.add_row("DynamoDB units", f"{plan.write_units:,.0f} write, {plan.read_units:,.0f} read")
    services.add_row("SNS billed publishes", f"{plan.sns_billed_publishes:,} (each entry, 64 KB chunks)")
    console.print(services)
    console.print(minimum_sentence(plan))
    extras = Table(
        Column("request", no_wrap=True), "per iteration", "call", "why", title="requests beyond the minimum chain"
    )
    for extra in plan.extra_calls:
        extras.add_row(extra.operation, f"{extra.count:,}", extra.call, extra.reason)
    console.print(extras)

    per_epoch = w.iterations_per_epoch
    money = Table("service", "per iteration", "per epoch", f"per run ({w.iterations:,} iterations)", title="dollars")
    for service, amount in sorted(plan.dollars_per_iteration.items(), key=lambda item: -item[1]):
        money.add_row(
            service,
            _dollars(amount),
            _dollars(None if per_epoch is None else amount * per_epoch),
            _dollars(amount * w.iterations),
        )
    money.add_row("first iteration, extra", "", "", _dollars(plan.first_iteration.extra_dollars))
    money.add_row(
        "[bold]total",
        f"[bold]{_dollars(plan.iteration_dollars)}",
        f"[bold]{_dollars(plan.epoch_dollars)}",
        f"[bold]{_dollars(plan.run_dollars)}",
    )
    console.print(money)
    epoch = "" if per_epoch is None else f", per epoch ({per_epoch:,} iterations) {_time(plan.epoch_s)}"
    console.print(
        f"time per iteration {_time(plan.iteration_s)}{epoch}, per run {_time(plan.run_s)}; "
        f"the first iteration adds {_time(plan.first_iteration.extra_s)} "
        f"and {sum(plan.first_iteration.extra_requests.values()):,} reads "
        f"({plan.first_iteration.detail})"
    )

    quotas = Table("quota", "value", "limit", "use", "", title="quotas")
    quotas.add_column("detail", overflow="fold")
    for q in plan.quotas:
        mark = "[green]ok" if q.ok else ("[red]cannot run" if q.hard else "[yellow]over")
        quotas.add_row(q.name, _number(q.value), f"{_number(q.limit)} {q.unit}", f"{q.utilization:.0%}", mark, q.detail)
    console.print(quotas)
    console.print(binding_sentence(plan))
    if recommendation.over:
        console.print(f"no choice at this W keeps within {', '.join(recommendation.over)}")
    console.print(recommendation.as_workers_grow)
    _render_parameters(plan, console)


def _render_verdict(verdict: Verdict, console: Any) -> None:
    """The answer first: time and dollars per epoch and per run, what binds, warnings, recommendations."""
    epoch = (
        ""
        if verdict.epoch_s is None
        else (f"per epoch [bold]{_time(verdict.epoch_s)}, {_dollars(verdict.epoch_dollars)}[/bold] · ")
    )
    console.print(
        f"{epoch}per run ({verdict.iterations:,} iterations) [bold]{_time(verdict.run_s)}, "
        f"{_dollars(verdict.run_dollars)}[/bold] · per iteration {_time(verdict.iteration_s)}"
    )
    console.print(f"binds: {verdict.binds}")
    for warning in verdict.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    for advice in verdict.recommendations:
        console.print(f"→ {advice}")
    if verdict.compared:
        console.print(f"against {verdict.compared}")
    if verdict.budget:
        console.print(f"budget: {verdict.budget}")


def _render_gpu(plan: Plan, console: Any) -> None:
    """The GPU workers' figures, each with its source."""
    from rich.table import Table

    table = Table("GPU workers", "figure", "source", title="GPU workers on Lambda Managed Instances")
    for fact in plan.worker.facts:
        table.add_row(fact.name, fact.value, fact.source)
    console.print(table)


def _render_sides(sides: list[Side], console: Any, no_gpu: str | None) -> None:
    """CPU functions, GPU functions (or why there are none: ``no_gpu``) and the machine, side by side."""
    from rich.table import Table

    table = Table(
        "",
        "per epoch",
        "$ per epoch",
        "per run",
        "$ per run",
        "run time ÷ one machine's",
        "run $ ÷ one machine's",
        "source",
        title="side by side: the same samples; per run, slsml's scale-up and tail, the machines' start-up and data",
    )
    for side in sides:
        table.add_row(
            side.what,
            _time(side.epoch_s),
            _dollars(side.epoch_dollars),
            _time(side.run_s),
            _dollars(side.run_dollars),
            f"{side.time_vs_machine:.3g}×",
            f"{side.dollars_vs_machine:.3g}×",
            side.source,
        )
    console.print(table)
    if no_gpu:
        console.print(f"GPU functions: {no_gpu}")


def _render_parameters(plan: Plan, console: Any) -> None:
    from rich.table import Table

    table = Table("parameter", "value", "what", "source", title="model parameters (--param NAME=VALUE)")
    for name, entry in plan.parameters.items():
        table.add_row(name, f"{entry['value']:.4g} {entry['unit']}".strip(), entry["what"], entry["source"])
    console.print(table)


def render_sweep(points: list[SweepPoint], png: str, console: Any) -> None:
    from rich.table import Table

    from slsml.cost.workerround import step_in_words

    table = Table(
        "W",
        "R",
        "a worker's step",
        "invocations a round",
        "per iteration",
        "per epoch",
        "$ per epoch",
        "over",
        title="sweep: one epoch against W",
    )
    for point in points:
        table.add_row(
            str(point.workers),
            str(point.reducers),
            step_in_words(point.micro_batch, point.micro_batches),
            str(point.invocations),
            _time(point.iteration_s),
            _time(point.epoch_s),
            _dollars(point.epoch_dollars),
            ", ".join(point.violations),
        )
    console.print(table)
    console.print(f"chart: {png}")


# ---- chart -------------------------------------------------------------------------------------


def write_sweep_png(points: list[SweepPoint], path: Path, title: str) -> None:
    """Time per epoch (left axis) and dollars per epoch (right axis) against W, log-scaled W; points
    that exceed a quota hollow. The points ride along as JSON in the PNG's ``slsml-sweep`` text chunk."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = [p.workers for p in points]
    hours = [p.epoch_s / 3600 for p in points]
    dollars = [p.epoch_dollars for p in points]
    figure, time_axis = plt.subplots(figsize=(8, 5), dpi=100)
    cost_axis = time_axis.twinx()
    time_axis.plot(workers, hours, color="tab:red", linestyle=":", label="time per epoch")
    time_axis.plot(
        workers,
        [hours[0] * workers[0] / w for w in workers],
        color="grey",
        linewidth=0.8,
        linestyle="--",
        label="ideal 1/W",
    )
    cost_axis.plot(workers, dollars, color="tab:blue", label="cost per epoch")
    for axis, values, color in ((time_axis, hours, "tab:red"), (cost_axis, dollars, "tab:blue")):
        for point, value in zip(points, values, strict=True):
            axis.plot(point.workers, value, "o", color=color, markerfacecolor="white" if point.violations else color)
    time_axis.set_xscale("log", base=2)
    time_axis.set_yscale("log")
    time_axis.set_xlabel("workers (W)")
    time_axis.set_ylabel("hours per epoch", color="tab:red")
    cost_axis.set_ylabel("dollars per epoch", color="tab:blue")
    cost_axis.set_ylim(bottom=0)
    time_axis.set_xticks(workers, [str(w) for w in workers])
    lines = time_axis.get_lines()[:2] + cost_axis.get_lines()[:1]
    time_axis.legend(lines, [str(line.get_label()) for line in lines], loc="upper center")
    time_axis.set_title(f"{title}\n(hollow: over a quota)", fontsize=10)
    figure.tight_layout()
    metadata = {SWEEP_METADATA: json.dumps([p.model_dump(mode="json") for p in points])}
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", metadata=metadata)
    plt.close(figure)
