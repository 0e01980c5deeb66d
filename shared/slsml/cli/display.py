"""What the ``slsml`` command shows: a command's result (a table, a listing, a summary, a report) on stdout, or
with ``--json`` as one JSON line on stdout and drawn on stderr; progress and diagnostics on stderr. The other
modules of ``slsml.cli`` parse and run the commands; everything they draw is here."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from slsml.spec.config import HYPER_PARAMETERS, KERAS_OPTIMIZERS, OptimizerConfig, TrainingSpec

UNCUT_WIDTH = 1000  # the width drawn at into a file or a pipe (COLUMNS unset): lines are not cut at 80 columns


def console() -> Any:
    """The console progress and diagnostics are drawn on: stderr."""
    return _console(stderr=True)


def results(as_json: bool = False) -> Any:
    """The console a command's result is drawn on: stdout, or stderr where stdout carries it as JSON."""
    return _console(stderr=as_json)


def _console(stderr: bool) -> Any:
    from rich.console import Console

    drawn = Console(stderr=stderr)
    if not drawn.is_terminal and "COLUMNS" not in os.environ:
        drawn.width = UNCUT_WIDTH
    return drawn


def say(text: str) -> None:
    """One line as it is (no markup, not cut at the terminal's width)."""
    console().print(text, markup=False, highlight=False, soft_wrap=True)


def done(line: str, as_json: bool, result: dict[str, Any]) -> None:
    """What a command that acts (stop, resume, scale, fetch, …) did: its one line on stderr and, with ``as_json``,
    ``result`` as one JSON line on stdout."""
    say(line)
    if as_json:
        print(json.dumps(result))


def error(message: str) -> None:
    """A command's error, on one line (not cut at the terminal's width)."""
    from rich.markup import escape

    console().print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)


# ---- the optimizer a run applies -------------------------------------------------------------


def describe_optimizer(config: OptimizerConfig) -> str:
    """One line: the optimizer, its learning rate or schedule, other hyper-parameters that differ from the
    defaults, weight decay and clipping."""
    rate = config.learning_rate
    if isinstance(rate, float):
        rate_text = f"{rate:g}"
    else:  # a schedule: its class and the numbers that differ from Keras's defaults
        numbers = rate.model_dump(exclude_defaults=True)
        rate_text = f"{rate.class_name}({', '.join(f'{k}={number(v)}' for k, v in numbers.items())})"
    parts = [KERAS_OPTIMIZERS[config.name], f"learning rate {rate_text}"]
    said = {"weight_decay", "exclude_from_weight_decay", "clipnorm", "global_clipnorm", "clipvalue"}
    defaults = OptimizerConfig(name=config.name)
    parts += [
        name if value is True else f"{name} {number(value)}"
        for name in HYPER_PARAMETERS
        if name not in said and (value := getattr(config, name)) != getattr(defaults, name)
    ]
    decay = f"weight decay {config.weight_decay:g}" if config.weight_decay else "no weight decay"
    if config.exclude_from_weight_decay:
        decay += f" (not on {', '.join(config.exclude_from_weight_decay)})"
    clipping = [
        f"{name} {value:g}" for name in ("clipnorm", "global_clipnorm", "clipvalue") if (value := getattr(config, name))
    ]
    return "optimizer: " + ", ".join([*parts, decay, *(clipping or ["no clipping"])])


def describe_update(config: Any) -> str:
    """One line: what a run's reducers apply (``describe_optimizer``), and under a rule that takes local steps what a
    worker's round takes first (the rule's ``describe``)."""
    from slsml import rules  # the rules' modules, read when a run starts, not by every command

    spec = config.training

    def short(optimizer: OptimizerConfig) -> str:
        return describe_optimizer(optimizer).removeprefix("optimizer: ")

    local = short(spec.local_optimizer_config()).removesuffix(", no weight decay, no clipping")
    return rules.of(spec).describe(spec, short(config.optimizer), local)


def number(value: Any) -> str:
    if isinstance(value, tuple | list):
        return "(" + ", ".join(number(v) for v in value) + ")"
    return f"{value:g}" if isinstance(value, float) else str(value)


# ---- a run: its progress and its summary -----------------------------------------------------


@contextmanager
def run_progress(
    run_id: str, iterations: int, started: float, spent: Callable[[Any], float] | None = None
) -> Iterator[Callable[[Any, Any], None]]:
    """A progress bar of a run (whole lines into a file or a pipe) while the block runs; yields the
    ``on_progress`` callback of ``runs.wait_for_run`` that moves it. ``spent(run)``: the dollars the run used
    so far, if known (shown against the run's budget, if it has one)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    shown = ProgressText(started, spent)
    if not console().is_terminal:
        lines = ProgressLines(run_id, iterations, started)
        yield lambda run, latest: lines.show(run.iteration, shown.update(run, latest))
        lines.end()
        return
    columns = (
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[run]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console(), transient=False) as progress:
        task = progress.add_task("train", total=iterations, run=run_id, stats="")

        def show(run: Any, latest: Any) -> None:
            progress.update(task, completed=run.iteration, stats=shown.update(run, latest))

        yield show


class ProgressLines:
    """A run's progress as whole lines, for a file or a pipe (no bar, never cut at a width): a line every
    ``EVERY_S`` at most, and the last one when the run ends."""

    EVERY_S = 10.0

    def __init__(self, run_id: str, iterations: int, started: float) -> None:
        self.run_id, self.iterations, self.started = run_id, iterations, started
        self.line: str | None = None
        self.said: str | None = None
        self.said_at = -self.EVERY_S

    def show(self, iteration: int, figures: str) -> None:
        self.line = f"{self.run_id} {iteration}/{self.iterations}  {figures}  {time.time() - self.started:.0f} s"
        if time.monotonic() - self.said_at >= self.EVERY_S:
            say(self.line)
            self.said, self.said_at = self.line, time.monotonic()

    def end(self) -> None:
        if self.line is not None and self.line != self.said:
            say(self.line)


class ProgressText:
    """The figures on the progress line: the last merged iteration's losses, workers and stage times, and what
    the run has met so far (late workers, re-launches, shards that kept their weights, dollars)."""

    SPENT_EVERY_S = 5.0  # reading the usage lines costs more than a poll: the dollars are refreshed this often
    RECENT = 5  # iterations after a change of the workers during which the line says why they changed

    def __init__(self, started: float, spent: Callable[[Any], float] | None = None) -> None:
        self.started, self.spent = started, spent
        self.evaluated: dict[str, tuple[str, float]] = {}  # test/val → the last evaluated model's first metric
        self.workers: int | None = None  # the last merged iteration's, as last seen
        self.changed: tuple[int, str | None] | None = None  # the last change seen: its iteration and reason
        self.seen: dict[int, tuple[int, int, int]] = {}  # iteration → (late, re-launches, stale shards)
        self.dollars: float | None = None
        self.dollars_at = 0.0

    def update(self, run: Any, latest: Any) -> str:
        if latest is None:
            return ""
        for split in ("test", "val"):
            if figures := getattr(latest, split):
                name = first_metric(figures)
                self.evaluated[split] = (f"{split}_{name}", figures[name])
        late = max(0, latest.arrived - latest.participant_count) if latest.reduce_fired_by is not None else 0
        self.seen[latest.iteration] = (late, latest.reduce_relaunches, len(latest.stale_shards))
        parts = [f"loss {latest.train_loss:.4f}"] if latest.train_loss is not None else []
        train = latest.train or {}
        if (metric := first_metric(train)) != "loss":  # the first compiled metric over its batches
            parts.append(f"{metric} {train[metric]:.3f}")
        parts += [f"{name} {value:.3f}" for name, value in self.evaluated.values()]
        parts.append(f"{(time.time() - self.started) / max(1, run.iteration):.2f} s/iter")
        parts.append(self._workers(run, latest))
        if latest.launched_at and latest.reduce_fired_at and latest.merged_at:
            parts.append(
                f"workers {latest.reduce_fired_at - latest.launched_at:.2f} s"
                f" reduce+merge {latest.merged_at - latest.reduce_fired_at:.2f} s"
            )
        met = [sum(counts[k] for counts in self.seen.values()) for k in range(3)]
        parts += [
            f"{n} {what}" for n, what in zip(met, ("late", "re-launched reducers", "stale shards"), strict=True) if n
        ]
        if self.spent is not None and time.monotonic() - self.dollars_at > self.SPENT_EVERY_S:
            self.dollars, self.dollars_at = self.spent(run), time.monotonic()
        if self.dollars is not None:
            budget = run.training.budget_usd
            parts.append(f"{dollars(self.dollars)} so far" if budget is None else spend(self.dollars, budget))
        return "  ".join(parts)

    def _workers(self, run: Any, latest: Any) -> str:
        """``W=8``: the workers of the last merged iteration; ``W=4→8`` while the next iterations launched take
        others; the reason of a change pending or seen within ``RECENT`` iterations."""
        workers = latest.workers or run.workers
        if self.workers is not None and workers != self.workers:
            self.changed = (latest.iteration, latest.workers_reason)
        self.workers = workers
        if run.workers != workers:
            return f"W={workers}→{run.workers}" + (f" ({why(run.workers_reason)})" if run.workers_reason else "")
        if self.changed and self.changed[1] and latest.iteration - self.changed[0] < self.RECENT:
            return f"W={workers} ({why(self.changed[1])})"
        return f"W={workers}"


def first_metric(figures: Mapping[str, float]) -> str:
    """The name of the first compiled metric among a split's figures by Keras name (``loss`` if none), past the
    losses of each output (``<output>_loss``) of a model of several."""
    return next((name for name in figures if name != "loss" and not name.endswith("_loss")), "loss")


def why(reason: str) -> str:
    """The gist of why a run's workers changed: its reason up to any colon, e.g. ``run scale`` or, for
    ``tuner (time): 1.2 s per round at 4 workers …``, ``tuner, time``."""
    head = reason.partition(":")[0].strip()
    return head.replace(" (", ", ").removesuffix(")") if head.endswith(")") else head


FLEET_SHOWN = 2, 3  # a summary spells out the first 2 and the last 3 changes of the workers (--json: all)


def fleet(summary: Any) -> str:
    """A run's workers: the number if they never changed, else the first ones and each change with its iteration
    and why, e.g. ``4 → 8 at iteration 2 (run scale) → 2 at iteration 5 (run scale)``; a running run scaled since
    its last launch ends in ``→ 8 next``."""
    changes = [
        f"{c.workers} at iteration {c.iteration}" + (f" ({why(c.reason)})" if c.reason else "")
        for c in summary.fleet[1:]
    ]
    first, last = FLEET_SHOWN
    if len(changes) > first + last:
        changes = [*changes[:first], f"… {len(changes) - first - last} more", *changes[-last:]]
    launched = summary.fleet[-1].workers if summary.fleet else summary.workers
    if summary.status == "RUNNING" and summary.workers != launched:
        changes.append(f"{summary.workers} next")
    return " → ".join([str(summary.fleet[0].workers if summary.fleet else summary.workers), *changes])


def print_summary(summary: Any, as_json: bool) -> None:
    from rich.table import Table

    table = Table(title=f"run {summary.run_id}", show_header=False)

    def row(name: str, value: Any) -> None:
        table.add_row(name, "–" if value is None else str(value))

    row("status", summary.status.value + (f": {summary.reason}" if summary.reason else ""))
    row("iterations", summary.iterations)
    row("workers", fleet(summary))
    row("reducers (quorum)", f"{summary.reducers} ({summary.quorum})")
    if options := spec_options(summary.training, left_out={"workers", "reducers", "quorum", "iterations"}):
        row("options", options)
    test = summary.test
    row("test_loss", None if test.get("loss") is None else f"{test['loss']:.4f}")
    for name, value in test.items():
        if name != "loss":
            row(f"test_{name}", f"{value:.4f}")
    for name, value in summary.val.items():
        row(f"val_{name}", f"{value:.4f}")
    row("wall time", f"{summary.wall_s:.1f} s")
    if summary.median_iteration_s:
        compute = summary.median_worker_compute_s or 0.0
        row("median iteration", f"{summary.median_iteration_s * 1000:.0f} ms")
        row("  worker compute", f"{compute * 1000:.1f} ms ({compute / summary.median_iteration_s:.1%})")
        row("  control/data plane", f"{(summary.median_iteration_s - compute) * 1000:.0f} ms")
    if summary.bytes_read_per_iteration is not None:
        row(
            "S3 bytes per iteration",
            f"read {summary.bytes_read_per_iteration / 1e6:.2f} MB, "
            f"written {summary.bytes_written_per_iteration / 1e6:.2f} MB",
        )
    if summary.requests_per_iteration is not None:
        by_service: dict[str, list[str]] = {}
        for operation, count in summary.requests_per_iteration.items():
            if count:
                service, _, name = operation.partition(":")
                by_service.setdefault(service, []).append(f"{name} {count:g}")
        for i, (service, counts) in enumerate(by_service.items()):
            row("requests per iteration" if i == 0 else "", f"{service}: {', '.join(counts)}")
    if summary.budget_usd is not None:
        row("budget", spend(summary.spent_usd or 0.0, summary.budget_usd) + ", counted by the functions as they ran")
    if summary.cost_usd is not None:
        per_iteration = summary.cost_per_iteration_usd
        row(
            "cost",
            f"{dollars(summary.cost_usd)} in all"
            + ("" if per_iteration is None else f", {dollars(per_iteration)} per iteration"),
        )
        by_cost = sorted(summary.cost_by_service_usd.items(), key=lambda item: -item[1])
        row("  by service", ", ".join(f"{service} {dollars(amount)}" for service, amount in by_cost))
        row("  Lambda GB-seconds", f"{summary.gb_seconds:g}")
    row("late workers", summary.late_workers)
    if summary.dropped_parts or summary.nonfinite_updates or summary.stale_attempts:
        row(
            "left out",
            f"{summary.dropped_parts} parts past their read timeout, {summary.nonfinite_updates}"
            f" non-finite updates, {summary.stale_attempts} reports of superseded attempts",
        )
    if summary.deadlines_fired or summary.relaunched_workers or summary.relaunched_reducers or summary.stale_shards:
        row(
            "deadlines",
            f"{summary.deadlines_fired} fired, {summary.relaunched_workers} workers and"
            f" {summary.relaunched_reducers} reducers re-launched, {summary.stale_shards} stale shards",
        )
    if summary.faults is not None:
        injected = ", ".join(f"{kind} {n}" for kind, n in summary.faults["injected"].items() if n) or "none"
        row("faults injected", injected)
        row(
            "  what it took",
            f"{summary.faults['failed_invocations']} failed invocations,"
            f" {summary.faults['retries']} retried, {summary.faults['dead_letters']} dead letters",
        )
    row("final model", summary.final_model)
    results(as_json).print(table)
    if as_json:
        print(summary.model_dump_json())


def spec_options(spec: TrainingSpec, left_out: Collection[str] = ()) -> str:
    """The spec's fields (but ``left_out``) that are not at their default, e.g. ``eval_every 3, quorum 0.5``."""
    return ", ".join(
        f"{name} {KERAS_OPTIMIZERS[value.name] if isinstance(value, OptimizerConfig) else number(value)}"
        for name, field in type(spec).model_fields.items()
        if name not in left_out and (value := getattr(spec, name)) != field.get_default(call_default_factory=True)
    )


def dollars(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.3g}"


def spend(spent: float, budget: float) -> str:
    """A run's spend against its budget, e.g. ``$0.0105 spent of the $0.01 budget (105%)``."""
    from slsml.accounting.prices import usd

    return f"{usd(spent)} spent of the {usd(budget)} budget ({spent / budget:.0%})"


def print_runs(summaries: list[Any], as_json: bool = False) -> None:
    """``run list``: one row per run, in the order given; ``as_json``: also one JSON line, a list of the
    summaries."""
    from rich.table import Table

    table = Table()
    # the run id and status are never cut, however narrow the terminal: the other columns wrap first
    longest = {"run": max((len(s.run_id) for s in summaries), default=3), "status": len("COMPLETED")}
    for column in ("run", "started", "status", "iterations", "test_loss", "first test metric", "reason"):
        table.add_column(column, min_width=longest.get(column), no_wrap=column in longest)
    for s in summaries:
        started = "–" if s.started_at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.started_at))
        metric = first_metric(s.test)
        table.add_row(
            s.run_id,
            started,
            s.status.value,
            str(s.iterations),
            "–" if s.test_loss is None else f"{s.test_loss:.4f}",
            "–" if metric == "loss" else f"test_{metric} {s.test[metric]:.4f}",
            s.reason or "",
        )
    results(as_json).print(table)
    if as_json:
        print(json.dumps([summary.model_dump(mode="json") for summary in summaries]))


def _size(count: int) -> str:
    """Bytes in kB, MB or GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count / 1e3:,.1f} kB"


def _shape(summary: dict[str, Any], part: str) -> str:
    """``float32[8]``, or named arrays' ``a float32[8], b int64[]``."""
    shape, dtype = summary[part + "_shape"], summary[part + "_dtype"]
    if isinstance(shape, dict):
        return ", ".join(f"{name} {dtype[name]}[{','.join(map(str, dims))}]" for name, dims in shape.items())
    return f"{dtype}[{','.join(map(str, shape))}]"


@contextmanager
def samples_progress(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar of the samples read (stderr), gone when done; yields what advances it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn(label, markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("samples"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console(), transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda count: progress.advance(task, count)


def print_datasets(summaries: list[dict[str, Any]]) -> None:
    """``data list``: one row per dataset (``slsml.data.catalog.summary``), on stdout."""
    from rich.table import Table

    table = Table("dataset", "format", "train", "test", "x", "y", "classes", "stored")
    for s in summaries:
        if "unreadable" in s:  # stored by an slsml of another format: named, with what to do, on stderr
            table.add_row(s["name"], "?", *["–"] * 6)
            say(s["unreadable"])
            continue
        table.add_row(
            s["name"],
            s["format"] or "–",
            str(s["train"]),
            str(s["test"]),
            _shape(s, "x"),
            _shape(s, "y"),
            "–" if s["classes"] is None else str(s["classes"]),
            _size(s["bytes"]),
        )
    results().print(table)


def print_dataset(summary: dict[str, Any]) -> None:
    """``data show``, ``data put``: a dataset's manifest, a line per fact, on stdout."""
    from rich.table import Table

    table = Table(show_header=False, box=None)
    table.add_column()
    table.add_column(overflow="fold")  # a checksum whole, however narrow the terminal
    classes = summary["classes"]
    names = summary["class_names"]
    for label, value in (
        ("dataset", summary["name"]),
        ("format", summary["format"] or "–"),
        ("samples", f"{summary['train']:,} train, {summary['test']:,} test"),
        ("x", _shape(summary, "x")),
        ("y", _shape(summary, "y")),
        ("sample weights", "yes" if summary.get("weighted") else "–"),
        ("classes", "–" if classes is None else f"{classes}" + (f": {', '.join(names)}" if names else "")),
        ("stored", f"{_size(summary['bytes'])} in {summary['shards']} shards"),
        ("source sha256", summary["sha256"] or "–"),
    ):
        table.add_row(label, value)
    results().print(table)


# ---- benchmarks ------------------------------------------------------------------------------


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
        )
    out = results(as_json)
    out.print(table)
    given = "" if report.micro_batch == report.fitting else " (given)"
    out.print(
        f"micro-batch {report.micro_batch:,}{given}: {report.fitting:,} samples fit a step in {report.memory_mb:,} MB"
        f" beside a {report.cache_mb:,.0f} MB warm cache ({report.weights:,} weights,"
        f" {byte_size(report.sample_bytes)} of layer outputs a sample)"
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
        f" full beside it ({report.cache_mb:,.0f} MB, the model among its entries):"
        f" {yes[report.peaks_within_cache_full]}{largest}"
    )


def print_gpu(report: Any, written: Any, as_json: bool = False) -> None:
    """``bench gpu``: a row per accelerator memory that fits the card, each precision's micro-batch and samples/s side
    by side, mixed precision against float32; then the CPU's throughput and where the calibration went."""
    from rich.table import Table

    calibration = report.calibration
    precisions = [probe.precision for probe in report.probes]
    columns = [f"{p} {what}" for p in precisions for what in ("micro-batch", "samples/s")]
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
        cells = [
            cell
            for p in precisions
            for cell in (f"{batches[p]:,}" if p in batches else "–", f"{rates[p]:,.0f}" if rates[p] else "–")
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
    out.print(f"calibration written to {written} (`slsml plan --gpu-calibration {written}` prices from it)")
