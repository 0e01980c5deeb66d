"""A run report's charts: the training curves (against iterations, wall time and dollars), each drawn iteration's
transaction diagram, and where the time, the requests and the dollars went; their figures from the records, their
PNGs drawn with matplotlib."""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slsml.accounting import usage
from slsml.accounting.prices import PriceTable
from slsml.accounting.usage import UsageRecord
from slsml.cli import display_runs
from slsml.cli.report_timeline import FUNCTIONS, Timeline
from slsml.state.records import IterationRecord, RunRecord

COLORS = {
    "work_launcher": "#4e79a7",
    "worker": "#59a14f",
    "reduce_launcher": "#edc948",
    "reducer": "#f28e2b",
    "merger": "#b07aa1",
    "watchdog": "#e15759",
    "run_starter": "#9c755f",
}
SERVICE_COLORS = {
    "lambda": "#f28e2b",
    "s3": "#59a14f",
    "dynamodb": "#4e79a7",
    "sns": "#b07aa1",
    "sqs": "#edc948",
    "states": "#76b7b2",
    "logs": "#9c755f",
}


@dataclass(frozen=True)
class Point:
    """One iteration on the curves: train figures of its batches, test and validation figures where it was
    evaluated, by Keras name."""

    iteration: int
    wall_s: float | None  # its merge, from the run's start
    dollars: float  # the run's cost up to and including this iteration
    train: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    val: dict[str, float] = field(default_factory=dict)


def _dollars(records: Iterable[UsageRecord], table: PriceTable) -> float:
    records = list(records)
    return sum(usage.cost(records, table).values()) if records else 0.0


def curves(
    run: RunRecord, iterations: Iterable[IterationRecord], records: Iterable[UsageRecord], table: PriceTable
) -> list[Point]:
    """Per iteration: its train and test figures, the wall time of its merge and the dollars spent through it.
    Records of no iteration (the run starting) count from the first point on."""
    by_iteration: dict[int | None, list[UsageRecord]] = defaultdict(list)
    for r in records:
        by_iteration[r.iteration].append(r)
    spent = _dollars(by_iteration[None], table)
    points = []
    for record in sorted(iterations, key=lambda r: r.iteration):
        spent += _dollars(by_iteration[record.iteration], table)
        points.append(
            Point(
                iteration=record.iteration,
                wall_s=None if record.merged_at is None else record.merged_at - run.created_at,
                dollars=spent,
                train=record.train or ({} if record.train_loss is None else {"loss": record.train_loss}),
                test=record.test or {},
                val=record.val or {},
            )
        )
    return points


@dataclass(frozen=True)
class FunctionUse:
    """What one function did over the run: invocations, time, requests and dollars by service."""

    function: str
    invocations: int
    seconds: float  # summed durations
    gb_seconds: float
    requests: dict[str, int]  # by service
    dollars: dict[str, float]  # by service

    @property
    def total_dollars(self) -> float:
        return sum(self.dollars.values())


def by_function(records: Iterable[UsageRecord], table: PriceTable) -> list[FunctionUse]:
    """The run's usage split by function, in chain order."""
    grouped: dict[str, list[UsageRecord]] = defaultdict(list)
    for r in records:
        grouped[r.function].append(r)
    chain = list(FUNCTIONS)
    uses = []
    for function in sorted(grouped, key=lambda f: (chain.index(f) if f in chain else len(chain), f)):
        done = grouped[function]
        requests: Counter = Counter()
        for r in done:
            for operation, n in r.requests.items():
                requests[operation.partition(":")[0]] += n
        gb_s, invocations = usage.lambda_usage(done)
        uses.append(
            FunctionUse(
                function, invocations, sum(r.duration_s for r in done), gb_s, dict(requests), usage.cost(done, table)
            )
        )
    return uses


def critical_path(records: list[UsageRecord], iterations: list[IterationRecord], run: RunRecord) -> dict[str, float]:
    """The median time of each stage of the steady iterations' critical path (``bench_scale.measured_stages``:
    the first and last iteration and those whose reduce fired at a deadline are left out); empty below three
    iterations."""
    from slsml.bench.scale import STAGES, measured_stages

    fired = [r.participant_count for r in iterations if r.participant_count]
    participants = int(statistics.median(fired)) if fired else max(1, math.ceil(run.quorum * run.workers))
    measured = measured_stages(records, run.iteration, participants)
    return {stage: statistics.median(m[stage] for m in measured) for stage in STAGES} if measured else {}


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # the Agg canvas, without pyplot's global state

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def first_metric(points: Sequence[Point]) -> str:
    """The first compiled metric's Keras name on the points evaluated, else trained (``loss``: no metric)."""
    evaluated = next((p.test or p.val for p in points if p.test or p.val), None)
    return display_runs.first_metric(
        evaluated if evaluated is not None else next((p.train for p in points if p.train), {})
    )


def series(points: Sequence[Point]) -> dict[str, list[tuple[str, Callable[[Point], float | None]]]]:
    """The curves as Keras names them, by figure (the loss, then the first compiled metric): the figure over each
    iteration's batches under its own name, ``test_…`` and ``val_…`` where evaluated; only those some point has."""
    metric = first_metric(points)
    drawn: dict[str, list[tuple[str, Callable[[Point], float | None]]]] = {}
    for name in dict.fromkeys(("loss", metric)):
        candidates = [(name, _evaluated("train", name))]
        candidates += [(f"{split}_{name}", _evaluated(split, name)) for split in ("test", "val")]
        drawn[name] = [(label, value) for label, value in candidates if any(value(p) is not None for p in points)]
    return drawn


def _evaluated(split: str, name: str) -> Callable[[Point], float | None]:
    return lambda point: getattr(point, split).get(name)


def draw_curves(points: list[Point], path: Path) -> None:
    """The loss (top) and the first compiled metric (bottom) against iterations, wall time and dollars: each of
    ``series``, labelled with its Keras name."""
    from matplotlib.ticker import MaxNLocator

    figure = _figure(13, 7)
    axes = figure.subplots(2, 3, squeeze=False)
    xs = {"iteration": lambda p: p.iteration, "wall time (s)": lambda p: p.wall_s, "dollars": lambda p: p.dollars}
    curves = list(series(points).items())
    for column, (label, x) in enumerate(xs.items()):
        for row in range(2):
            name, lines = curves[row] if row < len(curves) else ("metric", [])
            axis = axes[row][column]
            for kind, value in lines:
                shown = [(x(p), value(p)) for p in points]
                shown = [(a, b) for a, b in shown if a is not None and b is not None]
                style = {"linewidth": 1.2} if kind == name else {"marker": "o", "linewidth": 1.0}
                axis.plot(*zip(*shown, strict=True), label=kind, **style)
            if not axis.lines:
                axis.text(0.5, 0.5, f"no {name} recorded", ha="center", va="center", transform=axis.transAxes)
            elif column == 0:
                axis.legend(loc="best", fontsize=8)
            axis.set_xlabel(label)
            axis.set_ylabel(name)
            axis.grid(alpha=0.3)
            if label == "dollars":
                axis.xaxis.set_major_locator(MaxNLocator(5))
                axis.xaxis.set_major_formatter(lambda value, _: f"${value:.2g}")
    figure.suptitle("training: the loss and the first metric of each iteration's batch, test_ and val_ where evaluated")
    figure.savefig(path, format="png")


def draw_timeline(line: Timeline, path: Path) -> None:
    """An iteration's invocations as bars, one row each, on a time axis from its launch."""
    from matplotlib.patches import Patch

    rows = max(1, len(line.bars))
    figure = _figure(12, min(40.0, 1.6 + 0.26 * rows))
    axis = figure.subplots()
    font = 8 if rows <= 60 else 6
    for bar in line.bars:
        width = max(bar.end_s - bar.start_s, 1e-4)
        axis.barh(
            bar.row,
            width,
            left=bar.start_s,
            height=0.7,
            color=COLORS.get(bar.function, "#bab0ac"),
            edgecolor="black",
            linewidth=0.4,
            hatch="//" if "late" in bar.note or "attempt" in bar.note else None,
        )
        text = f"{width * 1000:.0f} ms" + (f" · {bar.note}" if bar.note else "")
        axis.text(bar.end_s, bar.row, " " + text, va="center", fontsize=font)
    axis.set_yticks([b.row for b in line.bars], [b.label for b in line.bars], fontsize=font)
    axis.invert_yaxis()
    for (what, at), style in zip(line.marks, itertools.cycle(("--", ":", "-."))):
        axis.axvline(at, color="black", linestyle=style, linewidth=0.9, label=what)
    handles = [
        Patch(color=COLORS.get(f, "#bab0ac"), label=FUNCTIONS.get(f, f))
        for f in dict.fromkeys(b.function for b in line.bars)
    ]
    axis.legend(handles=handles + axis.get_lines(), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    end = max([b.end_s for b in line.bars] + [at for _, at in line.marks] + [0.0])
    axis.set_xlim(min([b.start_s for b in line.bars] + [0.0]), end * 1.25 + 1e-3)
    axis.set_xlabel("seconds from the iteration's launch")
    axis.grid(axis="x", alpha=0.3)
    took = "" if line.seconds is None else f", {line.seconds:.3f} s launch to launch"
    axis.set_title(f"iteration {line.iteration} ({line.why}{took})", fontsize=10)
    figure.savefig(path, format="png")


def draw_cost(stages: Mapping[str, float], functions: list[FunctionUse], path: Path) -> None:
    """The critical path's stages (median steady iteration), and requests and dollars by function and service."""
    from matplotlib.ticker import MaxNLocator

    figure = _figure(15, 4.8)
    time_axis, request_axis, dollar_axis = figure.subplots(1, 3)
    if stages:
        names = list(stages)
        time_axis.barh(names, [stages[s] * 1000 for s in names], color="#76b7b2")
        time_axis.invert_yaxis()
        time_axis.tick_params(axis="y", labelsize=8)
    else:
        time_axis.text(
            0.5, 0.5, "needs three or more iterations", ha="center", va="center", transform=time_axis.transAxes
        )
    time_axis.set_xlabel("ms, median steady iteration")
    time_axis.set_title("critical path by stage", fontsize=10)
    names = [FUNCTIONS.get(u.function, u.function) for u in functions]
    for axis, values, title, unit in (
        (request_axis, [u.requests for u in functions], "requests", "requests, run"),
        (dollar_axis, [u.dollars for u in functions], "dollars", "dollars, run"),
    ):
        services = sorted(
            {s for v in values for s in v},
            key=lambda s: list(SERVICE_COLORS).index(s) if s in SERVICE_COLORS else len(SERVICE_COLORS),
        )
        left = [0.0] * len(functions)
        for service in services:
            widths = [v.get(service, 0) for v in values]
            axis.barh(names, widths, left=left, label=service, color=SERVICE_COLORS.get(service, "#bab0ac"))
            left = [a + b for a, b in zip(left, widths, strict=True)]
        axis.invert_yaxis()
        axis.xaxis.set_major_locator(MaxNLocator(4))
        if title == "dollars":
            axis.xaxis.set_major_formatter(lambda value, _: f"${value:.2g}")
        axis.set_xlabel(unit)
        axis.set_title(f"{title} by function and service", fontsize=10)
        if services:
            axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=len(services))
    figure.savefig(path, format="png")
