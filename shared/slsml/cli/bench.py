"""`slsml bench`: benchmarks on the local runtime."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from slsml.cli import display, display_bench, options
from slsml.cost.calibration import CALIBRATION_FILE
from slsml.pipeline import launch
from slsml.spec.errors import BadInputError

_console = display.console


def cmd_bench_stragglers(args: argparse.Namespace) -> int:
    from slsml.bench import pipeline as bench
    from slsml.local.runtime import LocalRuntime

    pool = bench.worker_pool(args.workers, args.factor)
    runtime = LocalRuntime(
        workers=pool, reducers=2, pool=pool, log_dir=Path(".slsml/logs") / launch.new_run_id("bench")
    )
    with ExitStack() as stack:
        with _console().status(f"starting the embedded cloud and warm function processes ({pool} for workers)…"):
            stack.enter_context(runtime)
        with display_bench.named_progress("[bold]({task.description})") as show:
            report = bench.stragglers(
                runtime, args.workers, args.iterations, args.slow_iterations, args.factor, show, args.ssp_factor
            )
    display_bench.print_stragglers(report, args.json)
    if args.json:
        print(report.model_dump_json())
    return 0 if all(case.summary.status == "COMPLETED" for case in report.cases) else 1


def cmd_bench_asynchronous(args: argparse.Namespace) -> int:
    from slsml.bench import asynchronous as bench
    from slsml.bench.pipeline import worker_pool

    if args.workers < 2 or args.factor <= 1 or args.iterations < 1:
        raise BadInputError(
            f"--workers {args.workers}, --factor {args.factor:g}, --iterations {args.iterations}: a straggler needs"
            " at least 2 workers, a factor above 1 and an iteration at least"
        )
    pool = worker_pool(args.workers, args.factor)
    _bench(
        args,
        "asynchronous",
        pool,
        2,
        lambda runtime, show: bench.asynchronous(runtime, args.workers, args.iterations, args.factor, show),
        display_bench.print_asynchronous,
    )
    return 0


def cmd_bench_barrier(args: argparse.Namespace) -> int:
    from slsml.bench import barrier as bench_barrier

    with _console().status(f"driving {args.small} and {args.workers} reports through the barriers…"):
        report = bench_barrier.barrier(args.workers, args.reducers, args.small)
    display_bench.print_barrier(report, args.workers, args.small, args.json)
    if args.json:
        print(report.model_dump_json())
    fired = all(f.fired and f.merged for f in (report.small, report.large))
    return 0 if fired and report.item_bytes_within and report.write_units_within else 1


def cmd_bench_scale(args: argparse.Namespace) -> int:
    from slsml.bench import scale as bench_scale

    local = bench_scale.runtime(Path(".slsml/logs") / launch.new_run_id("scale"))
    with ExitStack() as stack:
        with _console().status("starting the embedded cloud and one warm process per function…"):
            stack.enter_context(local)
        with display_bench.named_progress("[bold]{task.description}") as show:
            grid = (args.workers or bench_scale.WORKERS, args.reducers or bench_scale.REDUCERS)
            report = bench_scale.scale(local, *grid, args.iterations, show)
    bench_scale.write_calibration(report, Path(args.calibration))
    display_bench.print_scale(report, args.calibration, args.json)
    if args.json:
        print(report.model_dump_json())
    return 0 if all(point.status == "COMPLETED" for point in report.points) else 1


def _bench(
    args: argparse.Namespace,
    stem: str,
    workers: int,
    reducers: int,
    run: Callable[[Any, Any], Any],
    draw: Callable[[Any, bool], None],
) -> None:
    """Start a local runtime with ``workers`` warm worker processes, run ``run(runtime, progress)`` under a
    progress bar, draw its report, and with --json print it as one JSON line."""
    from slsml.local.runtime import LocalRuntime

    log_dir = Path(".slsml/logs") / launch.new_run_id(stem)
    runtime = LocalRuntime(workers=workers, reducers=reducers, pool=workers, log_dir=log_dir)
    with ExitStack() as stack:
        with _console().status(f"starting the embedded cloud and warm function processes ({workers} for workers)…"):
            stack.enter_context(runtime)
        with display_bench.named_progress("[bold]{task.description}") as show:
            report = run(runtime, show)
    draw(report, args.json)
    if args.json:
        print(report.model_dump_json())


def cmd_bench_algorithms(args: argparse.Namespace) -> int:
    from slsml.bench import algorithms as bench_algorithms

    pool = max(max(bench_algorithms.FIXED_WORKERS), args.pool or 0)
    _bench(args, "algorithms", pool, 2, bench_algorithms.algorithms, display_bench.print_algorithms)
    return 0


def cmd_bench_communication(args: argparse.Namespace) -> int:
    from slsml.bench import communication as bench

    if args.iterations < 1:
        raise BadInputError(f"--iterations must be at least 1, not {args.iterations}")
    significance = bench.SIGNIFICANCE if args.significance is None else args.significance
    if not significance > 0:
        raise BadInputError(f"--significance must be above 0, not {significance:g}")
    _bench(
        args,
        "communication",
        bench.WORKERS,
        bench.REDUCERS,
        lambda runtime, show: bench.communication(runtime, args.iterations, show, significance=significance),
        display_bench.print_communication,
    )
    return 0


def cmd_bench_sparse(args: argparse.Namespace) -> int:
    from slsml.bench import sparse as bench

    if args.iterations < 1:
        raise BadInputError(f"--iterations must be at least 1, not {args.iterations}")
    _bench(
        args,
        "sparse",
        bench.WORKERS,
        bench.REDUCERS,
        lambda runtime, show: bench.sparse(runtime, args.iterations, show),
        display_bench.print_sparse,
    )
    return 0


def cmd_bench_admm(args: argparse.Namespace) -> int:
    from slsml.bench import admm as bench

    _bench(args, "admm", bench.WORKERS, bench.REDUCERS, bench.admm_against_gradient, display_bench.print_admm)
    return 0


def cmd_bench_evaluation(args: argparse.Namespace) -> int:
    from slsml.bench import evaluation as bench

    sizes, workers, iterations = args.sizes or bench.SIZES, args.workers or bench.WORKERS, args.iterations
    if iterations is not None and iterations <= max(workers):
        raise BadInputError(
            f"--iterations must be above the most workers ({max(workers)}, a warm process each), not {iterations}"
        )
    _bench(
        args,
        "evaluation",
        max(workers),
        1,
        lambda runtime, show: bench.evaluation(
            runtime, sizes, workers, iterations or max(bench.ITERATIONS, max(workers) + 1), show
        ),
        display_bench.print_evaluation,
    )
    return 0


def cmd_bench_data(args: argparse.Namespace) -> int:
    from slsml.bench import data as bench

    samples, iterations = args.samples or bench.SAMPLES, args.iterations or bench.ITERATIONS
    if samples < bench.BATCH or iterations < 2:
        raise BadInputError(f"--samples must be at least {bench.BATCH} and --iterations at least 2")
    _bench(
        args,
        "data",
        bench.WORKERS,
        bench.REDUCERS,
        lambda runtime, show: bench.data_reads(
            runtime, samples, iterations, args.cache_mb or bench.CACHE_MB, show, args.ingest_gb or bench.INGEST_GB
        ),
        display_bench.print_data,
    )
    return 0


def cmd_bench_stages(args: argparse.Namespace) -> int:
    from slsml.bench import stages as bench

    count, memory = args.stages or bench.STAGES, args.memory or bench.MEMORY_MB
    batch, micro, repeats = (
        args.batch or bench.BATCH,
        args.micro_batch or bench.MICRO_BATCH,
        args.repeats or bench.REPEATS,
    )
    if count < 2 or not 128 <= memory <= 10240 or min(batch, micro, repeats) < 1 or micro > batch:
        raise BadInputError(
            "--stages at least 2, --memory 128 to 10240 MB, --batch, --micro-batch (at most the batch) and --repeats"
            " at least 1"
        )
    model = None if args.model is None else Path(args.model)
    if model is not None and not model.is_file():
        raise BadInputError(f"--model {args.model}: no such file")
    with display_bench.named_progress("[bold]{task.description}") as show:
        report = bench.stages_against_bigger(model, count, memory, batch, micro, repeats, show)
    display_bench.print_stages(report, args.json)
    if args.json:
        print(report.model_dump_json())
    return 0


def cmd_bench_micro_batches(args: argparse.Namespace) -> int:
    from slsml.bench import microbatch as bench

    memory, repeats = args.memory or bench.MEMORY_MB, args.repeats or bench.REPEATS
    if not 128 <= memory <= 10240 or repeats < 1 or (args.micro_batch is not None and args.micro_batch < 1):
        raise BadInputError("--memory must be 128 to 10240 MB, --repeats and --micro-batch at least 1")
    model = None if args.model is None else Path(args.model)
    if model is not None and not model.is_file():
        raise BadInputError(f"--model {args.model}: no such file")
    with display_bench.named_progress("[bold]{task.description}") as show:
        report = bench.micro_batches(model, memory, args.multiples or bench.MULTIPLES, repeats, args.micro_batch, show)
    display_bench.print_micro_batches(report, args.json)
    if args.json:
        print(report.model_dump_json())
    return 0 if report.peaks_within and report.peaks_within_cache_full else 1


def cmd_bench_gpu(args: argparse.Namespace) -> int:
    from slsml.bench import gpu as bench

    precisions = tuple(args.precisions or bench.PRECISIONS)
    unknown = sorted(set(precisions) - set(bench.PRECISIONS))
    if unknown or (args.batches and min(args.batches) < 1) or args.image_size < 32:
        raise BadInputError(
            f"--precisions from {', '.join(bench.PRECISIONS)}; --batches at least 1; --image-size at least 32"
        )
    with display_bench.named_progress("[bold]{task.description}") as show:
        report = bench.measure(precisions, tuple(args.batches or bench.BATCHES), args.image_size, not args.no_cpu, show)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.calibration.model_dump_json(indent=2))
    display_bench.print_gpu(report, out, args.json)
    if args.json:
        print(report.model_dump_json())
    return 0


def add_commands(commands: Any) -> None:
    """`slsml bench` and its benchmarks."""
    benchmarks = commands.add_parser("bench", help="benchmarks on the local runtime")
    benchmarks = benchmarks.add_subparsers(dest="benchmark", required=True)
    stragglers = _benchmark(
        benchmarks,
        cmd_bench_stragglers,
        "stragglers",
        help="the demo with and without a worker that is slow every iteration, quorum 1 and (W−1)/W",
    )
    stragglers.add_argument("--workers", type=int, default=8, help="workers; the last one straggles (default 8)")
    stragglers.add_argument(
        "--iterations", type=int, default=150, help="iterations of the runs (a), (b), (c) (default 150, the demo's)"
    )
    stragglers.add_argument(
        "--slow-iterations",
        type=int,
        default=15,
        help="iterations of (d), the straggler under quorum 1: slow by design (default 15)",
    )
    stragglers.add_argument(
        "--factor",
        type=float,
        default=20.0,
        help="the straggler's invocation lasts this many (a) work phases (default 20)",
    )
    stragglers.add_argument(
        "--ssp-factor",
        type=float,
        default=1.5,
        help="(e) and (f): the straggler's invocation lasts this many (a) work phases (default 1.5)",
    )
    asynchronous = _benchmark(
        benchmarks,
        cmd_bench_asynchronous,
        "asynchronous",
        help="the demo's work with one slow worker: synchronous (quorum 1) and fully asynchronous (ASP)",
    )
    asynchronous.add_argument("--workers", type=int, default=4, help="workers; the last one is slow (default 4)")
    asynchronous.add_argument(
        "--iterations",
        type=int,
        default=150,
        help="the synchronous run's iterations (default 150, the demo's); ASP's: × the workers, the same samples",
    )
    asynchronous.add_argument(
        "--factor", type=float, default=3.0, help="the slow worker's invocation lasts this many work phases (default 3)"
    )
    barrier = _benchmark(
        benchmarks,
        cmd_bench_barrier,
        "barrier",
        help="what one report costs the barriers (item bytes, write units), small and large fleet",
    )
    barrier.add_argument("--workers", type=int, default=1000, help="the large fleet (default 1000)")
    barrier.add_argument("--small", type=int, default=10, help="the small fleet (default 10)")
    barrier.add_argument("--reducers", type=int, default=10, help="reducers of both (default 10)")

    scale = _benchmark(
        benchmarks,
        cmd_bench_scale,
        "scale",
        help="the plan's requests and stage times against the local pipeline over a grid of W and R;"
        " fits the plan's latencies to the embedded cloud",
    )
    scale.add_argument(
        "--workers", type=options.counts, help="workers of the grid, comma-separated (default 1,4,16,64)"
    )
    scale.add_argument("--reducers", type=options.counts, help="reducers of the grid, comma-separated (default 1,2,4)")
    scale.add_argument("--iterations", type=int, default=6, help="iterations per configuration (default 6, at least 3)")
    scale.add_argument(
        "--calibration",
        default="scale-calibration.json",
        help="where the fitted parameters go, for slsml plan --calibration (default scale-calibration.json)",
    )

    algorithms = _benchmark(
        benchmarks,
        cmd_bench_algorithms,
        "algorithms",
        help="gradient averaging at 2, 4, 8 and auto workers against model averaging with 4 and 16"
        " local steps: rounds, time, requests and dollars to the demo's accuracy, on one sample budget",
    )
    algorithms.add_argument("--pool", type=int, help="warm processes per function (default and at least 8)")

    communication = _benchmark(
        benchmarks,
        cmd_bench_communication,
        "communication",
        help="dense, fp16, top-k 1%% and significance-filtered updates (error feedback) at 8 workers:"
        " update, residual and reducer bytes, requests and dollars to the demo's accuracy and over a fixed budget",
    )
    communication.add_argument(
        "--iterations", type=int, default=150, help="iterations of every run (default 150, the demo's)"
    )
    communication.add_argument(
        "--significance",
        type=float,
        metavar="V",
        help="the significance variant's threshold, significance:V (default 0.2)",
    )

    sparse = _benchmark(
        benchmarks,
        cmd_bench_sparse,
        "sparse",
        help="MLLess's sparse workloads (Criteo-like logistic regression, MovieLens-like matrix factorization),"
        " generated: dense, exact sparse, top-k and significance updates, one worker slowed under GA, SSP and ASP, and"
        " Keras's own fit: time to a target loss, update bytes per round, final loss",
    )
    sparse.add_argument("--iterations", type=int, default=30, help="iterations of every run (default 30)")

    _benchmark(
        benchmarks,
        cmd_bench_admm,
        "admm",
        help="ADMM against gradient averaging on logistic regression (breast cancer data, 4 workers):"
        " rounds to the same test accuracy",
    )

    evaluation = _benchmark(
        benchmarks,
        cmd_bench_evaluation,
        "evaluation",
        help="the slowest worker's evaluation CPU and wall time per round, the evaluation's wall time and the Merger's"
        " time per evaluation round at test splits of several sizes and several W, side by side (the demo's CNN,"
        " evaluated at every iteration)",
    )
    evaluation.add_argument(
        "--sizes", type=options.counts, help="test samples of the runs, comma-separated (default 10000,100000)"
    )
    evaluation.add_argument("--workers", type=options.counts, help="W of the runs, comma-separated (default 1,2,4)")
    evaluation.add_argument(
        "--iterations",
        type=int,
        help="of each run, each evaluated; above the most workers (default 6, or one above the most workers)",
    )

    data = _benchmark(
        benchmarks,
        cmd_bench_data,
        "data",
        help="a synthetic image dataset past the workers' warm cache, read by range, against the same run"
        " with the dataset cached: S3 bytes and GETs per iteration, median iteration; ingest MB/s and peak RSS",
    )
    data.add_argument("--samples", type=int, help="training images of 32×32×3 uint8 (default 60000: 184 MB)")
    data.add_argument("--iterations", type=int, help="of each run (default 30)")
    data.add_argument(
        "--cache-mb", type=float, help="the workers' warm cache bound of the variants past the cache (default 16)"
    )
    data.add_argument(
        "--ingest-gb",
        type=options.gigabytes,
        metavar="GB",
        help="sizes of the sources whose ingest is measured, comma-separated: a .npy and a folder of JPEG and PNG"
        " photos of each (default 0.05; e.g. 0.5,2)",
    )

    micro = _benchmark(
        benchmarks,
        cmd_bench_micro_batches,
        "micro-batches",
        help="a worker's step over shares of 1, 4 and 16 times the micro-batch that fits its memory, each in a"
        " process of its own: time per sample and peak RSS side by side",
    )
    micro.add_argument(
        "--model",
        metavar="FILE",
        help="a .keras model compiled with its loss (default ResNet-50 on 64×64×3, 10 classes)",
    )
    micro.add_argument("--memory", type=int, metavar="MB", help="the worker's memory (default 3008, the worker's)")
    micro.add_argument(
        "--micro-batch", type=int, metavar="N", help="samples per micro-batch (default the most whose step fits)"
    )
    micro.add_argument(
        "--multiples", type=options.counts, help="shares in micro-batches, comma-separated (default 1,4,16)"
    )
    micro.add_argument("--repeats", type=int, help="steps of each share, taken by turns; the median counts (default 3)")

    staged = _benchmark(
        benchmarks,
        cmd_bench_stages,
        "stages",
        help="a model that fits both, its step in one bigger function against pipeline stages of smaller ones:"
        " time per sample and dollars of a round on Lambda side by side, and the stages' gradient against the whole's",
    )
    staged.add_argument(
        "--model", metavar="FILE", help="a .keras model compiled with its loss (default 8 Dense layers 2048 wide)"
    )
    staged.add_argument("--stages", type=int, metavar="S", help="pipeline stages (default 4)")
    staged.add_argument("--memory", type=int, metavar="MB", help="each stage function's memory (default 2048)")
    staged.add_argument("--batch", type=int, metavar="N", help="samples of a step (default 256)")
    staged.add_argument("--micro-batch", type=int, metavar="N", help="samples a stage computes at once (default 32)")
    staged.add_argument("--repeats", type=int, help="steps each way, taken by turns; the median counts (default 3)")

    gpu = _benchmark(
        benchmarks,
        cmd_bench_gpu,
        "gpu",
        help="ResNet-50's training throughput on this machine's GPU at each accelerator memory a GPU function may"
        " have, float32 against mixed precision, beside the CPU; writes the calibration `slsml plan` prices GPU"
        " workers from (exits 2 where there is no GPU)",
    )
    gpu.add_argument(
        "--precisions",
        type=lambda text: text.split(","),
        help="comma-separated (default float32,mixed_float16,mixed_bfloat16)",
    )
    gpu.add_argument(
        "--batches", type=options.counts, help="micro-batches measured, comma-separated (default 16,32,64,128,256)"
    )
    gpu.add_argument("--image-size", type=int, default=224, help="ResNet-50's input is SIZE×SIZE×3 (default 224)")
    gpu.add_argument("--no-cpu", action="store_true", help="leave out the CPU's row")
    gpu.add_argument(
        "--out", default=str(CALIBRATION_FILE), help=f"where to write the calibration (default {CALIBRATION_FILE})"
    )


def _benchmark(
    benchmarks: Any, handler: Callable[[argparse.Namespace], int], name: str, help: str
) -> argparse.ArgumentParser:
    """The parser of benchmark ``name``, run by ``handler``, with --json (its own flags are the caller's)."""
    parser = benchmarks.add_parser(name, help=help)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line")
    parser.set_defaults(handler=handler)
    return parser
