"""What the ``slsml`` command shows of a run: the optimizer it applies, its progress while it trains, its summary
(``run status``) and the list of runs (``run list``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from slsml.cli.display import console, dollars, number, results, say, spend
from slsml.spec.config import HYPER_PARAMETERS, KERAS_OPTIMIZERS, OptimizerConfig, TrainingSpec
from slsml.state.records import IterationRecord

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
        late = len(latest.late - latest.nonfinite) if isinstance(latest, IterationRecord) else 0  # as the summary
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
    row("samples trained", summary.samples_trained)
    if summary.staleness_mean is not None:
        row(
            "staleness",
            f"mean {summary.staleness_mean:.1f}, most {summary.staleness_max} iterations (updates applied to a"
            " newer model than they were computed on: the iterations applied in between)",
        )
    if summary.training.stale_weights:
        row("stale weights", f"{summary.stale_updates} updates computed on the weights one round stale")
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
