"""What the ``slsml bench`` commands show: their progress, and each benchmark's report as tables and verdicts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from slsml.cli.display import console, dollars, results


@contextmanager
def named_progress(label: str) -> Iterator[Callable[[str, int, int], None]]:
    """Progress bars, one per name (a benchmark's case or grid point), labelled by the rich markup ``label``
    of ``{task.description}``; yields ``show(name, done, total)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console()) as progress:
        tasks: dict[str, Any] = {}

        def show(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = progress.add_task(name, total=total)
            progress.update(tasks[name], completed=done)

        yield show


def print_stragglers(report: Any, as_json: bool = False) -> None:
    from fractions import Fraction

    from rich.table import Table

    from slsml.bench import pipeline as bench

    table = Table(
        "",
        "straggler",
        "quorum",
        "staleness",
        "iters",
        "median iter",
        "× (a)",
        "test acc",
        f"iters to {bench.ACCURACY_TARGET}",
        "late",
        "folded",
        title=f"stragglers: {report.workers} workers, factor {report.factor:g} ((e), (f): {report.ssp_factor:g})",
    )
    for case in report.cases:
        s = case.summary
        table.add_row(
            case.name,
            f"worker {report.straggler}" if case.straggler else "–",
            str(Fraction(case.quorum).limit_denominator(report.workers)),
            str(case.staleness or "–"),
            str(s.iterations),
            "–" if s.median_iteration_s is None else f"{s.median_iteration_s:.3f} s",
            "–" if case.ratio is None else f"{case.ratio:.2f}",
            "–" if s.test_accuracy is None else f"{s.test_accuracy:.4f}",
            "–" if case.rounds_to_target is None else str(case.rounds_to_target),
            str(s.late_workers),
            str(s.late_folded),
        )
    out = results(as_json)
    out.print(table)
    for case in report.cases:
        if case.summary.status != "COMPLETED":
            out.print(f"[red]({case.name}) {case.summary.status.value}[/red]: {case.summary.reason}")
    c, yes = report.case("c"), {True: "yes", False: "no"}
    out.print(
        f"delay: worker {report.straggler} sleeps {report.delay_s:.2f} s at the start of every invocation "
        f"= ({report.factor:g} − 1) × {report.baseline_s:.3f} s, the {report.baseline}"
    )
    ratio = "–" if c.ratio is None else f"{c.ratio:.2f}×"
    out.print(f"(c) median iteration {ratio} (a)'s: within {bench.WITHIN}× of (a): {yes[report.c_within]}")
    out.print(
        f"(d) median iteration grew by {report.d_growth_s:.2f} s over (a)'s, "
        f"{report.d_growth_s / report.delay_s:.2f} × the delay: grew with the delay "
        f"(at least {bench.GREW:g} × it): {yes[report.d_grew]}"
    )
    accuracy = "–" if c.summary.test_accuracy is None else f"{c.summary.test_accuracy:.4f}"
    out.print(
        f"(c) test accuracy {accuracy}: reaches the demo's {bench.ACCURACY_TARGET}: {yes[report.c_reaches_target]}"
    )
    e, f = report.case("e"), report.case("f")
    out.print(
        f"(f) late updates {report.f_late}: {report.f_folded} folded into a later reduce, {report.f_dropped}"
        f" left out beyond the bound, {report.f_at_the_end} of the last {bench.STALENESS} iterations left out"
        f" at the end: keeps every update: {yes[report.f_keeps_every_update]}"
    )
    out.print(
        f"(f) iterations to {bench.ACCURACY_TARGET}: {f.rounds_to_target or '–'} vs (e)'s"
        f" {e.rounds_to_target or '–'} (late updates dropped): no more: {yes[report.f_no_slower]}"
    )


def print_asynchronous(report: Any, as_json: bool = False) -> None:
    from rich.table import Table

    from slsml.bench import asynchronous as bench

    table = Table(
        "",
        "staleness",
        "iterations",
        "samples trained",
        "wall time",
        "test acc",
        "staleness mean / most",
        title=f"asynchronous: {report.workers} workers, worker {report.straggler} {report.factor:g}× slower",
    )
    for name, s in (("synchronous (quorum 1)", report.synchronous), ("asynchronous (ASP)", report.asynchronous)):
        table.add_row(
            name,
            str(s.training.staleness),
            str(s.iterations),
            str(s.samples_trained),
            f"{s.wall_s:.1f} s",
            "–" if s.test_accuracy is None else f"{s.test_accuracy:.4f}",
            "–" if s.staleness_mean is None else f"{s.staleness_mean:.1f} / {s.staleness_max}",
        )
    out, yes = results(as_json), {True: "yes", False: "no"}
    out.print(table)
    out.print(
        f"delay: worker {report.straggler} sleeps {report.delay_s:.2f} s at the start of every invocation "
        f"= ({report.factor:g} − 1) × {report.baseline_s:.3f} s, the reference's median work phase"
    )
    updates = ", ".join(f"worker {w} {n}" for w, n in report.updates_by_worker.items())
    versions, applied = report.versions, sum(report.updates_by_worker.values())
    each = applied / max(1, versions)
    out.print(f"ASP updates applied: {updates}, by {versions} model versions ({each:.1f} each on average)")
    out.print(
        f"ASP wall time {report.time_ratio:.2f}× the synchronous run's: at most {bench.TIME_RATIO}×:"
        f" {yes[report.fast]}; same samples: {yes[report.same_samples]}"
    )
    points = "–" if report.accuracy_points is None else f"{report.accuracy_points:+.2f}"
    out.print(f"ASP test accuracy {points} points: within {bench.ACCURACY_POINTS:g}: {yes[report.close]}")


def print_barrier(report: Any, workers: int, small: int, as_json: bool = False) -> None:
    from rich.table import Table

    from slsml.bench import barrier as bench_barrier

    table = Table(
        "workers",
        "reducers",
        "max item bytes",
        "WU / report",
        "max WU / report",
        "WU / shard report",
        "participants item",
        "RU at fire",
        "s / report",
        title="barrier cost per report",
    )
    for f in (report.small, report.large):
        table.add_row(
            str(f.workers),
            str(f.reducers),
            str(f.max_item_bytes),
            f"{f.write_units_per_report:.2f}",
            str(f.max_write_units_per_report),
            f"{f.write_units_per_shard_report:.2f}",
            f"{f.participants_item_bytes} B",
            f"{f.fire_read_units:g}",
            f"{f.seconds_per_report * 1000:.1f} ms",
        )
    out, yes = results(as_json), {True: "yes", False: "no"}
    out.print(table)
    out.print(
        f"at {workers} workers, within {bench_barrier.WITHIN:.0%} of {small}: max item bytes "
        f"{yes[report.item_bytes_within]}, write units per report {yes[report.write_units_within]}"
    )


def print_scale(report: Any, calibration: str, as_json: bool = False) -> None:
    from rich import box
    from rich.table import Table

    from slsml.bench import scale as bench_scale
    from slsml.cost.parameters import Parameters, parameter_facts

    out = results(as_json)
    out.print(
        f"[bold]{report.model}[/bold]: {report.params:,} weights, batch {report.batch}, quorum 1, "
        f"{report.iterations} iterations per configuration; warm processes per function: "
        + ", ".join(f"{name} {n}" for name, n in report.pools.items())
    )
    requests = Table(
        "W",
        "R",
        "plan",
        "run",
        "minimum",
        "run ÷ minimum",
        "differences (plan → run)",
        title="requests per iteration: the plan against the run summary (median iteration), and the minimum chain",
    )
    for p in report.points:
        differences = ", ".join(f"{op} {a:g} → {b:g}" for op, (a, b) in p.mismatches.items())
        requests.add_row(
            str(p.workers),
            str(p.reducers),
            f"{sum(p.predicted_requests.values()):g}",
            f"{sum(p.measured_requests.values()):g}",
            f"{sum(p.minimum_requests.values()):g}",
            f"{p.over_minimum:.2f}×",
            f"[red]{differences}" if differences else "[green]none",
        )
    out.print(requests)
    columns = {
        "event": ("model → WorkLauncher",),
        "launch": ("WorkLauncher",),
        "hops": bench_scale.HOPS,
        "work": ("Worker",),
        "fire": ("ReduceLauncher (fires)",),
        "reduce": ("Reducer",),
        "merge": ("Merger (merges)",),
    }
    stages = Table(
        "W×R",
        "",
        *columns,
        "iter",
        "error",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        pad_edge=False,
        title="stage times (ms), median steady iteration: the run and the fitted model",
    )
    for p in report.points:
        label = f"{p.workers}×{p.reducers}"
        if p.predicted_iteration_s is None:
            stages.add_row(label, p.status.lower())
            continue
        for i, (source, figures, total) in enumerate(
            (("run", p.measured_stages, p.measured_iteration_s), ("model", p.predicted_stages, p.predicted_iteration_s))
        ):
            cells = [f"{sum(figures[s] for s in names) * 1000:.0f}" for names in columns.values()]
            stages.add_row(
                label if i == 0 else "",
                source,
                *cells,
                f"{total * 1000:.0f}",
                f"{p.error:+.0%}" if i else "",
                end_section=i == 1,
            )
    out.print(stages)
    defaults = Parameters()
    fitted = Table(
        "parameter",
        "fitted (embedded cloud)",
        "the model's default (AWS)",
        "unit",
        title="parameters fitted by least squares on the stage times",
    )
    for name, value in report.fitted.items():
        unit = parameter_facts(name)["unit"]
        fitted.add_row(name, f"{value:.4g}", f"{getattr(defaults, name):.4g}", unit)
    fitted.add_row("(local runtime) dispatch", f"{report.dispatch_s:.4g}", "", "s")
    out.print(fitted)
    unresolved = [name for name, value in report.fitted.items() if value >= bench_scale.UNBOUNDED_MB_S]
    if unresolved:
        out.print(f"{', '.join(unresolved)}: the grid's bytes took no time the fit could see (its inverse is 0)")
    worst = max((p for p in report.points if p.error is not None), key=lambda p: abs(p.error))
    out.print(
        f"iteration time, fitted model against measured: median error {report.median_error:.1%}, "
        f"max {report.max_error:.1%} (W {worst.workers}, R {worst.reducers})"
    )
    out.print(f"calibration written to {calibration}: slsml plan --calibration {calibration} …")


def print_algorithms(report: Any, as_json: bool = False) -> None:
    """``bench algorithms``: a row per variant, to the target and over the whole sample budget, then whether
    model averaging was fast enough and the tuner close enough to the fastest fixed fleet."""
    from rich.table import Table

    from slsml.bench import algorithms as bench

    target = f"{report.target:g}"
    to_target = Table(
        "variant",
        "rounds",
        "s",
        "requests",
        "$",
        "workers",
        title=f"to test accuracy {target} (the demo's CNN, global batch {report.global_batch})",
    )
    budget = Table(
        "variant",
        "rounds",
        "test acc",
        "s",
        "requests",
        "$",
        title=f"the whole budget: {report.sample_budget:,} samples each",
    )

    def figure(value: float | None, text: Callable[[float], str]) -> str:
        return "–" if value is None else text(value)

    for v in report.variants:
        to_target.add_row(
            v.name,
            figure(v.rounds_to_target, str),
            figure(v.wall_to_target_s, "{:.1f}".format),
            figure(v.requests_to_target, "{:,}".format),
            figure(v.cost_to_target_usd, dollars),
            "→".join(str(c.workers) for c in v.fleet) or "–",
        )
        budget.add_row(
            v.name,
            str(v.rounds),
            figure(v.final_accuracy, "{:.4f}".format),
            f"{v.wall_s:.1f}",
            f"{v.requests:,}",
            dollars(v.cost_usd),
        )
    out, yes = results(as_json), {True: "yes", False: "no"}
    out.print(to_target)
    out.print(budget)
    fixed = [
        v
        for v in report.variants
        if v.name in {f"gradient-w{w}" for w in bench.FIXED_WORKERS} and v.wall_to_target_s is not None
    ]
    fastest = min(fixed, key=lambda v: v.wall_to_target_s or 0.0).name if fixed else "none reached it"

    def ratio(value: float | None) -> str:
        return f"no ratio (not both reached {target})" if value is None else f"{value:.2f}× the time to {target}"

    out.print(
        f"model averaging, K={max(bench.LOCAL_STEPS)}, against gradient averaging, W={bench.WORKERS}:"
        f" {ratio(report.averaging_ratio)}; at most 1/{bench.SPEEDUP}: {yes[report.averaging_fast]}"
    )
    out.print(
        f"workers auto against the fastest fixed W ({fastest}): {ratio(report.tuned_ratio)}; within"
        f" {bench.TUNED_WITHIN - 1:.0%}: {yes[report.tuned_close]}"
    )


def print_evaluation(report: Any, as_json: bool = False) -> None:
    """``bench evaluation``: a row per test split size and W, side by side; then per size each W's slowest worker's
    evaluation CPU per round and the evaluation's wall time against the fewest workers', and per W the Merger's time
    per evaluation round at the largest size against the smallest."""
    from rich.table import Table

    table = Table(
        "test samples",
        "W",
        "slowest slice CPU s",
        "slowest slice wall s",
        "evaluation wall s",
        "slowest worker s",
        "Merger s per evaluation round",
        title=f"evaluation at every iteration ({report.iterations}), the demo's CNN, global batch"
        f" {report.global_batch}",
    )
    for p in report.points:
        table.add_row(
            f"{p.test_samples:,}",
            str(p.workers),
            f"{p.slice_cpu_s:.3f}",
            f"{p.slice_wall_s:.3f}",
            f"{p.evaluation_wall_s:.3f}",
            f"{p.slowest_worker_s:.3f}",
            f"{p.merger_s_per_round:.3f}",
        )
    out = results(as_json)
    out.print(table)
    sizes = sorted({p.test_samples for p in report.points})
    fleets = sorted({p.workers for p in report.points})
    at = {(p.test_samples, p.workers): p for p in report.points}
    compared = (
        ("slice_cpu_s", "slowest worker's evaluation CPU per round"),
        ("evaluation_wall_s", "evaluation wall time per round"),
    )
    for figure, caption in compared if len(fleets) > 1 else ():
        for n in sizes:
            seconds = [getattr(at[n, w], figure) for w in fleets]
            out.print(
                f"{caption}, {n:,} test samples: "
                + ", ".join(f"W={w} {s:.3f} s (×{s / seconds[0]:.2f})" for w, s in zip(fleets, seconds, strict=True))
            )
    if len(sizes) > 1:
        out.print(
            "Merger per evaluation round, "
            + f"{sizes[-1]:,} against {sizes[0]:,} test samples: "
            + ", ".join(
                f"W={w} ×{at[sizes[-1], w].merger_s_per_round / at[sizes[0], w].merger_s_per_round:.2f}" for w in fleets
            )
        )


def print_admm(report: Any, as_json: bool = False) -> None:
    """``bench admm``: a row per variant with the rounds it took to the target (ADMM: less a point), its first
    rounds' test accuracy, then whether ADMM took at most a third of gradient averaging's rounds."""
    from rich.table import Table

    from slsml.bench import admm as bench

    table = Table(
        "variant",
        "rounds",
        "test acc",
        "rounds to target",
        "s",
        "requests",
        "$",
        title=f"logistic regression on breast cancer, {report.workers} workers, global batch {report.global_batch}",
    )
    to_target = {"gradient": report.gradient_rounds, "admm": report.admm_rounds}
    for v in report.variants:
        table.add_row(
            v.name,
            str(v.rounds),
            "–" if v.final_accuracy is None else f"{v.final_accuracy:.4f}",
            str(to_target.get(v.name) or "–"),
            f"{v.wall_s:.1f}",
            f"{v.requests:,}",
            dollars(v.cost_usd),
        )
    out = results(as_json)
    out.print(table)
    for v in report.variants:
        out.print(
            f"{v.name} test accuracy by round: "
            + " ".join("–" if a is None else f"{a:.3f}" for a in v.accuracy_by_round[:30])
        )
    if report.target is None:
        out.print("gradient averaging has no test accuracy: no verdict")
        return
    reached = "did not reach it" if report.admm_rounds is None else f"reached it in {report.admm_rounds} rounds"
    out.print(
        f"target: gradient averaging's {report.target:.4f}, reached in {report.gradient_rounds} rounds; ADMM"
        f" {reached} (less {bench.WITHIN:g})"
        + ("" if report.ratio is None else f": {report.ratio:.2f}×")
        + f"; at most 1/{bench.FEWER}: {'yes' if report.admm_fewer else 'no'}"
    )


def byte_size(count: float) -> str:
    """Bytes in decimal units, three figures: 812 B, 74.5 kB, 3.68 MB, 1.20 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            value = count / scale
            return (
                f"{value:.2f} {unit}"
                if value < 10
                else f"{value:.1f} {unit}"
                if value < 100
                else f"{value:,.0f} {unit}"
            )
    return f"{count:.0f} B"


def accuracy_checkpoints(iterations: int) -> list[int]:
    """Iterations at which ``bench communication`` shows each run's test accuracy: 10, 20, 30, 50, 75, 100 and
    150 of 150, in proportion for another budget."""
    return sorted({max(1, round(iterations * share)) for share in (1 / 15, 2 / 15, 1 / 5, 1 / 3, 1 / 2, 2 / 3, 1)})


def print_communication(report: Any, as_json: bool = False) -> None:
    """``bench communication``: a row per compressor to the target and over the fixed number of iterations, the
    test accuracy by iteration, then whether fp16 halved the update bytes at the same accuracy and whether top-k
    reached the target on a twentieth of them."""
    from rich.table import Table

    from slsml.bench import communication as bench

    target, n = f"{report.target:g}", report.iterations
    dense = report.variant("dense")

    def figure(value: float | None, text: Callable[[float], str]) -> str:
        return "–" if value is None else text(value)

    def fewer(value: float | None, reference: float | None) -> str:
        return "–" if not value or not reference else f"{reference / value:.1f}×"

    out, yes = results(as_json), {True: "yes", False: "no"}
    title = (
        f"communication: the demo's CNN on digits, {report.workers} workers, {report.reducers} reducers, global"
        f" batch {report.global_batch}, Adam 3e-3 (top-k: SGD 0.1, momentum 0.9), error feedback on every lossy"
        " compressor"
    )
    reaching = Table(
        "variant",
        "compress",
        f"iters to {target}",
        "s",
        "update bytes",
        "× fewer than dense",
        "residual bytes",
        "reducers read",
        "of which updates",
        "requests",
        "$",
        title=f"{title}\nto the first model at test accuracy {target}",
    )
    for v in report.variants:
        reaching.add_row(
            v.name,
            v.compress,
            figure(v.iterations_to_target, str),
            figure(v.wall_to_target_s, "{:.1f}".format),
            figure(v.update_bytes_to_target, byte_size),
            fewer(v.update_bytes_to_target, dense.update_bytes_to_target),
            figure(v.residual_bytes_to_target, byte_size),
            figure(v.reducer_bytes_read_to_target, byte_size),
            figure(v.reducer_update_bytes_read_to_target, byte_size),
            figure(v.requests_to_target, "{:,}".format),
            figure(v.cost_to_target_usd, dollars),
        )
    out.print(reaching)
    total = Table(
        "variant",
        "update (mean)",
        "update bytes",
        "× fewer than dense",
        "residual bytes",
        "workers wrote",
        "reducers read",
        "of which updates",
        "requests",
        "$",
        "s",
        "test acc",
        title=f"in total: {n} iterations each",
    )
    for v in report.variants:
        total.add_row(
            v.name,
            byte_size(v.mean_update_bytes),
            byte_size(v.update_bytes),
            fewer(v.update_bytes, dense.update_bytes),
            byte_size(v.residual_bytes),
            byte_size(v.worker_usage_bytes_written),
            byte_size(v.reducer_bytes_read),
            byte_size(v.reducer_update_bytes_read),
            f"{v.requests:,}",
            dollars(v.cost_usd),
            f"{v.wall_s:.1f}",
            figure(v.final_accuracy, "{:.4f}".format),
        )
    out.print(total)
    checkpoints = accuracy_checkpoints(n)
    accuracy = Table(
        "variant", *(str(i) for i in checkpoints), "best (iteration)", title="test accuracy after iteration …"
    )
    for v in report.variants:
        scored = [(a, i + 1) for i, a in enumerate(v.accuracy_by_iteration) if a is not None]
        best = max(scored, key=lambda pair: (pair[0], -pair[1]), default=None)
        cells = [
            figure(v.accuracy_by_iteration[i - 1] if i <= len(v.accuracy_by_iteration) else None, "{:.4f}".format)
            for i in checkpoints
        ]
        accuracy.add_row(v.name, *cells, "–" if best is None else f"{best[0]:.4f} ({best[1]})")
    out.print(accuracy)
    out.print(
        "update bytes: the objects in S3; residual bytes: what the workers' usage lines count beside their update"
        " and evaluation objects (residuals are deleted once superseded); reducers read: their usage lines, of"
        " which updates: from the update objects"
    )
    fp16 = report.variant("fp16")
    gap = (
        "no accuracy to compare"
        if report.fp16_accuracy_gap is None
        else (
            f"test accuracy {fp16.final_accuracy:.4f} against dense's {dense.final_accuracy:.4f},"
            f" {100 * report.fp16_accuracy_gap:+.2f} points"
        )
    )
    out.print(
        f"fp16: {report.fp16_ratio:.2f}× fewer update bytes than dense over {n} iterations (at least"
        f" {bench.FP16_FEWER:g}×: {yes[report.fp16_fewer]}); {gap} (within {100 * bench.FP16_WITHIN:g}:"
        f" {yes[report.fp16_close]})"
    )
    topk = report.variant("topk")
    if report.topk_ratio is not None:
        out.print(
            f"top-k {topk.compress.partition(':')[2]} with error feedback: {report.topk_ratio:.1f}× fewer update"
            f" bytes than dense to {target} ({topk.iterations_to_target} iterations against dense's"
            f" {dense.iterations_to_target}); at least {bench.TOPK_FEWER}×: {yes[report.topk_fewer]}"
        )
    else:
        why = (
            f"top-k did not reach {target} within {n} iterations"
            if topk.iterations_to_target is None
            else f"dense did not reach {target} within {n} iterations"
        )
        topk_best = (
            "–"
            if report.topk_best_accuracy is None
            else f"{report.topk_best_accuracy:.4f} after iteration {report.topk_best_iteration}"
        )
        out.print(
            f"top-k {topk.compress.partition(':')[2]} with error feedback: no ratio ({why}; top-k's best test"
            f" accuracy {topk_best}, dense reached {target} at iteration {dense.iterations_to_target or '–'});"
            f" at least {bench.TOPK_FEWER}×: no"
        )
    significance = report.variant("significance")
    to_target = fewer(significance.update_bytes_to_target, dense.update_bytes_to_target)
    out.print(
        f"{significance.compress}: {fewer(significance.update_bytes, dense.update_bytes)} fewer update bytes"
        f" than dense over {n} iterations, {to_target} to {target}"
    )


def _print_ingests(out: Any, report: Any) -> None:
    """bench data's ingests of each size: a table, then whether their peaks stay within the bound and how each kind's
    peak moves from the smallest source to the largest."""
    from rich.table import Table

    from slsml.bench import ingest as bench_ingest

    sources = {"npy": ".npy of 32×32×3 images", "images": "folder of JPEG and PNG photos, to 256×256"}
    table = Table("source", "size", "samples", "time", "rate", "peak RSS", title="ingest: slsml data put, measured")
    for i in report.ingests:
        table.add_row(
            sources[i.kind],
            f"{i.source_bytes / 1e9:.2f} GB",
            f"{i.samples:,}",
            f"{i.seconds:.1f} s",
            f"{i.mb_s:g} MB/s",
            f"{i.peak_rss_mb:,.0f} MB",
        )
    out.print(table)
    moves = []
    for kind, name in sources.items():
        sized = sorted((i for i in report.ingests if i.kind == kind), key=lambda i: i.source_bytes)
        if len(sized) > 1:
            first, last = sized[0], sized[-1]
            moves.append(
                f"{name}: {first.peak_rss_mb:,.0f} MB at {first.source_bytes / 1e9:.2f} GB → "
                f"{last.peak_rss_mb:,.0f} MB at {last.source_bytes / 1e9:.2f} GB"
            )
    out.print(
        f"every ingest's peak RSS within {bench_ingest.PEAK_MB:,.0f} MB: {'yes' if report.ingest_within else 'no'}"
        + "".join(f"; {move}" for move in moves)
    )


def print_data(report: Any, as_json: bool = False) -> None:
    from rich.table import Table

    from slsml.bench import data as bench_data

    out = results(as_json)
    times = report.dataset_bytes / 2**20 / report.cache_mb
    out.print(
        f"[bold]{report.samples:,} images[/bold] of {report.sample_bytes:,} B "
        f"({report.dataset_bytes / 1e6:.0f} MB with the test split, {times:.1f}× the {report.cache_mb:g} MB cache"
        f" bound), {report.workers} workers, global batch {report.global_batch}, {report.iterations} iterations"
        " per run"
    )
    ingest = report.ingest
    out.print(
        f"ingest (slsml data put of a {ingest.source_bytes / 1e6:,.0f} MB .npy): {ingest.mb_s:g} MB/s, "
        f"peak RSS {ingest.peak_rss_mb:,.0f} MB"
    )
    _print_ingests(out, report)
    table = Table(
        "variant",
        "S3 read / iteration",
        "GETs / iteration",
        "data read ÷ used",
        "median iteration",
        title="reading the data: median (mean after the first iteration)",
        caption="; ".join(f"{v.name}: {v.description}" for v in report.variants),
    )
    for v in report.variants:
        read = "–" if v.bytes_read_per_iteration is None else f"{v.bytes_read_per_iteration / 1e6:.2f} MB"
        gets = "–" if v.gets_per_iteration is None else f"{v.gets_per_iteration:g}"
        table.add_row(
            v.name,
            f"{read} ({v.mean_bytes_read / 1e6:.2f} MB)",
            f"{gets} ({v.mean_gets:.1f})",
            "–" if v.data_bytes_per_byte_used is None else f"{v.data_bytes_per_byte_used:.2f}",
            "–" if v.median_iteration_s is None else f"{v.median_iteration_s:.3f} s",
        )
    out.print(table)
    yes = {True: "yes", False: "no"}
    if report.bytes_ratio is not None and report.time_ratio is not None:
        out.print(
            f"exact order past the cache: S3 bytes {report.bytes_ratio:.2f}× (samples used + cached run's), "
            f"within {bench_data.BYTES_WITHIN:g}×: {yes[report.bytes_within]}; median iteration "
            f"{report.time_ratio:.2f}× the cached run's, within {bench_data.TIME_WITHIN:g}×: "
            f"{yes[report.time_within]}"
        )


def print_micro_batches(report: Any, as_json: bool = False) -> None:
    """``bench micro-batches``: a row per multiple of the micro-batch, side by side; then the micro-batch, how time per
    sample moved from the smallest share to the largest, and whether every peak fits the function's memory."""
    from rich.table import Table

    from slsml.bench import microbatch as bench
    from slsml.rounds import sizing

    first = report.cases[0].multiple
    table = Table(
        "multiple",
        "share",
        "micro-batches",
        "s/step",
        "ms/sample",
        f"ratio to {first}×",
        "peak RSS MB",
        "of the memory",
        "imports MB",
        title=f"a worker's step of {report.model}, {report.memory_mb:,} MB function, median of {report.repeats} steps",
    )
    for c in report.cases:
        peak = c.peak_rss_mb
        table.add_row(
            f"{c.multiple}×",
            f"{c.share:,}",
            str(c.micro_batches),
            f"{c.median_step_s:.2f}",
            f"{c.ms_per_sample:.4g}",
            f"{c.ratio:.2f}",
            "–" if peak is None else f"{peak:,.0f}",
            "–" if peak is None else f"{peak / report.memory_mb:.0%}",
            f"{c.imports_mb:,.0f}",
        )
    out = results(as_json)
    out.print(table)
    given = "" if report.micro_batch == report.fitting else " (given)"
    out.print(
        f"micro-batch {report.micro_batch:,}{given}: {report.fitting:,} samples fit a step in {report.memory_mb:,} MB"
        f" beside a {report.cache_mb:,.0f} MB warm cache ({report.weights:,} weights,"
        f" {byte_size(report.sample_bytes)} a sample: its layer outputs, gradients and input)"
    )
    yes = {True: "yes", False: "no"}
    last = report.cases[-1]
    out.print(
        f"time per sample at {last.multiple}× against {first}×: {report.time_ratio:.2f}×, within"
        f" {bench.TIME_WITHIN:g}×: {yes[report.time_within]}"
    )
    peaks = [c.peak_rss_mb for c in report.cases if c.peak_rss_mb is not None]
    largest = f" (largest {max(peaks):,.0f} MB)" if peaks else " (no peak kept on this system)"
    out.print(
        f"every peak RSS within the function's {report.memory_mb:,} MB: {yes[report.peaks_within]}; with the warm cache"
        f" full beside it ({report.cache_mb:,.0f} MB, the model among its entries) and the runtime as sized:"
        f" {yes[report.peaks_within_cache_full]}{largest}"
    )
    out.print(
        f"every peak RSS, the runtime counted at the sizing's {sizing.TF_IMPORTS_MB:,.0f} MB of imports (imports MB:"
        f" this machine's), within the sizing's estimate of a step of {report.micro_batch:,} samples in micro-batches"
        f" ({report.estimated_peak_mb:,.0f} MB with the model, the warm cache not counted):"
        f" {yes[report.peaks_within_estimate]}"
    )


def print_gpu(report: Any, written: Any, as_json: bool = False) -> None:
    """``bench gpu``: a row per accelerator memory that fits the card, each precision's micro-batch, samples/s and
    fraction of the card's peak side by side, mixed precision against float32; then the CPU's throughput and where the
    calibration went."""
    from rich.table import Table

    calibration = report.calibration
    precisions = [probe.precision for probe in report.probes]
    columns = [f"{p} {what}" for p in precisions for what in ("micro-batch", "samples/s", "of peak")]
    mixed = [p for p in precisions if p != "float32"]
    ratios = [f"{p} ÷ float32" for p in mixed] if "float32" in precisions else []
    table = Table(
        "accelerator GiB",
        *columns,
        *ratios,
        title=f"{calibration.model} on {calibration.card} ({report.card_gib:.0f} GiB)",
    )
    for size in sorted({entry.accelerator_gib for entry in calibration.entries}):
        rates = {p: calibration.samples_per_s(size, p) for p in precisions}
        batches = {e.precision: e.micro_batch for e in calibration.entries if e.accelerator_gib == size}
        fractions = {p: calibration.fraction(size, p) for p in precisions}
        cells = [
            cell
            for p in precisions
            for cell in (
                f"{batches[p]:,}" if p in batches else "–",
                f"{rates[p]:,.0f}" if rates[p] else "–",
                f"{fractions[p]:.1%}" if fractions[p] else "–",
            )
        ]
        base = rates.get("float32")
        table.add_row(
            str(size), *cells, *(f"{rates[p] / base:.2f}×" if rates[p] and base else "–" for p in mixed if ratios)
        )
    out = results(as_json)
    out.print(table)
    if report.cpu_samples_per_s is not None:
        best = max((entry.samples_per_s for entry in calibration.entries), default=0.0)
        out.print(
            f"the CPU (float32, this machine's cores): {report.cpu_samples_per_s:,.1f} samples/s; the GPU's best above"
            f" is {best / report.cpu_samples_per_s:,.0f}× that"
        )
    out.print(
        f"of peak: samples/s × {calibration.train_flops_per_sample / 1e9:,.2f} GFLOPs a training sample (TensorFlow's"
        " cost analysis) ÷ the card's published peak in that precision (float32's as TF32 on its tensor cores where it"
        " has them; 16-bit's on its tensor cores)"
    )
    out.print(f"calibration written to {written} (`slsml plan --gpu-calibration {written}` prices from it)")


def print_sparse(report: Any, as_json: bool = False) -> None:
    """``bench sparse``: per workload, a row per variant (time to the target test loss and over the run, update
    bytes per round, final test loss) and Keras's own ``fit`` as the reference, then whether sparse updates sent at
    most a tenth of dense's bytes at dense's final loss."""
    from rich.table import Table

    from slsml.bench import sparse as bench

    out, yes = results(as_json), {True: "yes", False: "no"}

    def seconds(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f}"

    for w in report.workloads:
        dense = w.variant("dense")
        table = Table(
            "variant",
            "what",
            f"s to loss {w.target:g}",
            "s",
            "update bytes / round",
            "× dense",
            "final test loss",
            title=f"{w.workload}: {w.params:,} weights, {report.workers} workers, {report.reducers} reducers, global"
            f" batch {report.global_batch}, {report.iterations} iterations, Adam {w.learning_rate:g}; slow:"
            f" +{report.slow_s:g} s per message",
        )
        for v in w.variants:
            table.add_row(
                v.name,
                v.description,
                seconds(v.wall_to_target_s),
                seconds(v.wall_s),
                byte_size(v.update_bytes_per_round),
                f"{v.update_bytes_per_round / dense.update_bytes_per_round:.4f}",
                "–" if v.final_loss is None else f"{v.final_loss:.6f}",
            )
        r = w.reference
        table.add_row(
            "keras fit",
            f"one process, {r.steps} steps (reference)",
            seconds(r.train_to_target_s),
            seconds(r.train_s),
            "–",
            "–",
            f"{r.final_loss:.6f}",
        )
        out.print(table)
        out.print(
            f"sparse updates at most 1/{bench.SPARSE_FEWER} of dense's bytes per round: {yes[w.sparse_fewer]}"
            f" ({w.sparse_ratio:.4f}); the same final test loss as dense: {yes[w.sparse_exact]}"
        )


def print_stages(report: Any, as_json: bool = False) -> None:
    """``bench stages``: one bigger function against the pipeline's stages, side by side: the step measured here,
    the round on Lambda, time per sample and dollars; then the split and the stages' gradient against the whole's."""
    from rich.table import Table

    table = Table(
        "",
        "functions",
        "memory",
        "step here",
        "per stage",
        "round on Lambda",
        "ms/sample",
        "$ per round",
        "$ per million samples",
        title=f"{report.model} ({report.weights:,} weights), a batch of {report.batch:,}, median of {report.repeats}",
    )
    for c in report.cases:
        table.add_row(
            c.name,
            str(c.functions),
            f"{c.memory_mb:,} MB",
            f"{c.measured_step_s:.3f} s",
            " ".join(f"{s:.3f}" for s in c.per_stage_s),
            f"{c.round_s:.3f} s",
            f"{c.ms_per_sample:.3g}",
            f"${c.dollars_per_round:.3g}",
            f"${c.dollars_per_million_samples:.3g}",
        )
    out = results(as_json)
    out.print(table)
    out.print(
        f"stages: {', '.join(report.split)}; micro-batches of {report.micro_batch:,}; their gradient against the"
        f" whole model's on the same micro-batches: largest difference {report.max_gradient_difference:.3g}"
        f" (largest value {report.gradient_scale:.3g})"
    )
