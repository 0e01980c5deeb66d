"""A run's report: one self-contained HTML page and its PNGs, from the run table and the functions' usage lines.

``write_report(services, usage_records, run_id, out_dir)`` is the entry point (``slsml run report``, and
``--report DIR`` of a local run). It reads the run and its iteration records and writes ``index.html``
(inline style, no scripts, no remote resources; the PNGs referenced relatively) beside:

- ``curves.png``: the loss and the first compiled metric as Keras names them (``loss``, ``accuracy`` of each
  iteration's batch; ``test_loss``, ``test_<metric>``, ``val_…`` where evaluated), against iterations, against
  wall time and against dollars;
- ``timeline-<iteration>.png``: the transaction diagram of an iteration, every invocation a bar on a shared
  time axis (the slowest, a median one and any chosen);
- ``cost.png``: where the time went on an iteration's critical path, and the run's requests and dollars by
  function and service.

The page also lists the faults and what the pipeline did about them, each iteration with its X-Ray trace
(on a stack), and the run summary's figures: those of ``runs.summarize``, which ``--json`` prints.

The pieces are plain functions of records (``timeline``, ``curves``, ``by_function``, ``faults``,
``traces``), gathered by ``gather`` into a ``Report`` that ``draw`` and ``render`` turn into files.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slsml.accounting import prices, usage
from slsml.accounting.prices import PriceTable
from slsml.accounting.usage import UsageRecord
from slsml.cli import display
from slsml.client import runs
from slsml.pipeline import spend
from slsml.pipeline.services import Services
from slsml.spec.errors import BadInputError
from slsml.state.records import IterationRecord, RunRecord

PAGE = "index.html"
CURVES = "curves.png"
COST = "cost.png"
# the chain's functions in order, with the names the page shows
FUNCTIONS = {
    "work_launcher": "WorkLauncher",
    "worker": "Worker",
    "reduce_launcher": "ReduceLauncher",
    "reducer": "Reducer",
    "merger": "Merger",
    "watchdog": "Watchdog",
    "run_starter": "RunStarter",
}
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
MAX_TIMELINE_ROWS = 160  # beyond, an iteration's diagram gets unreadably tall: the rest is counted in a note


# ---- the pieces, from records ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One invocation (one usage record) on an iteration's time axis, seconds from the iteration's launch."""

    row: int
    function: str
    label: str
    start_s: float
    end_s: float
    note: str = ""  # fires, merges, late, attempt n, …


@dataclass(frozen=True)
class Timeline:
    iteration: int
    why: str  # slowest, median, chosen (or several)
    seconds: float | None  # the iteration: its launch to the next one's
    origin: float  # epoch seconds: the iteration's first invocation (its launch)
    bars: tuple[Bar, ...]
    marks: tuple[tuple[str, float], ...]  # (what, seconds from the origin): the reduce fired, merged, next launch
    left_out: tuple[str, ...]  # invocations not drawn, and why


def _label(record: UsageRecord) -> str:
    name = FUNCTIONS.get(record.function, record.function)
    if record.function == "worker" and record.worker is not None:
        return f"{name} {record.worker}"
    if record.function == "reduce_launcher" and record.worker is not None:
        return f"{name} ← worker {record.worker}"
    if record.function == "reducer" and record.shard is not None:
        return f"{name} shard {record.shard}"
    if record.function == "merger" and record.shard is not None:
        return f"{name} ← shard {record.shard}"
    if record.function == "watchdog" and record.stage:
        return f"{name} ({record.stage} deadline)"
    return name


def _note(record: UsageRecord, iteration: IterationRecord | None) -> str:
    """What an invocation did for its iteration, where the records tell."""
    notes = []
    publishes = any(op.startswith("sns:Publish") for op in record.requests)
    if record.function == "reduce_launcher" and publishes:
        notes.append("fires the reduce")
    if record.function == "merger" and "s3:PutObject" in record.requests:
        notes.append("merges")
    if record.function == "watchdog" and publishes:
        notes.append("acts")
    if record.attempt:
        notes.append(f"attempt {record.attempt}")
    if (streamed := record.streamed) is not None and streamed.micro_batches > 1:
        notes.append(
            f"{streamed.micro_batches} micro-batches of ≤{streamed.micro_batch}, reads {streamed.read_s:.2f} s"
            f" ({streamed.waited_s:.2f} s waited)"
        )
    if iteration is not None and record.worker is not None and record.function in {"worker", "reduce_launcher"}:
        if record.worker in iteration.nonfinite:
            notes.append("non-finite")
        elif record.worker in iteration.late:
            notes.append("late")
    if iteration is not None and record.function == "reducer" and record.shard in iteration.stale_shards:
        notes.append("stale shard")
    return ", ".join(notes)


def _order(record: UsageRecord) -> tuple[Any, ...]:
    chain = list(FUNCTIONS)
    place = chain.index(record.function) if record.function in chain else len(chain)
    part = record.worker if record.worker is not None else record.shard if record.shard is not None else -1
    return place, record.function, part, record.attempt or 0, record.start


def timeline(
    iteration: int,
    records: Iterable[UsageRecord],
    record: IterationRecord | None = None,
    why: str = "",
    seconds: float | None = None,
) -> Timeline:
    """The transaction diagram of ``iteration``: its records (any run's records may be given: the iteration's
    are taken) as bars in chain order (WorkLauncher, workers by index, ReduceLauncher per report, reducers by
    shard, Merger, Watchdog), on a time axis from its launch. A watchdog wake after the iteration's last other
    invocation ended (a deadline that came when the iteration was merged) is counted in ``left_out``, not
    drawn; so are rows beyond ``MAX_TIMELINE_ROWS``."""
    mine = sorted((r for r in records if r.iteration == iteration), key=_order)
    launches = [r.start for r in mine if r.function == "work_launcher"]
    origin = min(launches) if launches else min((r.start for r in mine), default=0.0)
    chain_end = max((r.end for r in mine if r.function != "watchdog"), default=origin)
    merged = record is not None and record.merged_at is not None
    bars: list[Bar] = []
    left_out: list[str] = []
    for r in mine:
        if r.function == "watchdog" and merged and r.start > chain_end:
            left_out.append(f"{_label(r)} at +{r.start - origin:.2f} s, after the iteration's chain ended")
            continue
        if len(bars) == MAX_TIMELINE_ROWS:
            left_out.append(f"{_label(r)} at +{r.start - origin:.2f} s: past {MAX_TIMELINE_ROWS} rows")
            continue
        bars.append(Bar(len(bars), r.function, _label(r), r.start - origin, r.end - origin, _note(r, record)))
    marks: list[tuple[str, float]] = []
    if record is not None:
        if record.reduce_fired_at:
            who = "by the watchdog at a deadline" if record.fired_at_deadline else f"on worker {record.reduce_fired_by}"
            marks.append((f"reduce fired ({who})", record.reduce_fired_at - origin))
        if record.merged_at:
            marks.append(("merged", record.merged_at - origin))
        if record.launched_at and seconds is not None:
            marks.append(("next iteration launched", record.launched_at + seconds - origin))
    return Timeline(iteration, why, seconds, origin, tuple(bars), tuple(marks), tuple(left_out))


def iteration_seconds(iterations: Iterable[IterationRecord]) -> dict[int, float]:
    """Each iteration's time, its launch to the next one's, as ``runs.summarize`` counts its median."""
    launched = sorted((r for r in iterations if r.launched_at), key=lambda r: r.iteration)
    return {
        a.iteration: b.launched_at - a.launched_at
        for a, b in itertools.pairwise(launched)
        if a.launched_at and b.launched_at
    }


def choose(seconds: Mapping[int, float], chosen: Sequence[int] = ()) -> list[tuple[int, str]]:
    """The iterations to draw, with why: the slowest, a median one (of an even count, the lower) and ``chosen``."""
    picks: dict[int, list[str]] = {}
    if seconds:
        by_time = sorted(seconds, key=lambda i: (seconds[i], i))
        picks.setdefault(by_time[-1], []).append("slowest")
        picks.setdefault(by_time[(len(by_time) - 1) // 2], []).append("median")
    for i in chosen:
        picks.setdefault(i, []).append("chosen")
    return [(i, ", ".join(why)) for i, why in picks.items()]


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


@dataclass(frozen=True)
class Fault:
    iteration: int | None  # None: the run's
    what: str
    done: str  # what the pipeline did about it


def _workers(indices: Iterable[int]) -> str:
    indices = sorted(indices)
    return ("worker " if len(indices) == 1 else "workers ") + ", ".join(map(str, indices))


def faults(run: RunRecord, iterations: Iterable[IterationRecord]) -> list[Fault]:
    """What went wrong in each iteration, from its record, and what the pipeline did about it; the run's
    failure last."""
    found = []
    for r in sorted(iterations, key=lambda r: r.iteration):
        i = r.iteration
        if r.relaunched:
            attempts = ", ".join(f"{w} (attempt {a})" for w, a in sorted(r.relaunched.items()))
            found.append(
                Fault(
                    i,
                    f"{_workers(r.relaunched)} missing at a deadline",
                    f"the watchdog re-launched them: worker {attempts}",
                )
            )
        if r.fired_at_deadline:
            found.append(
                Fault(
                    i,
                    f"the work stage passed its deadline with {len(r.participants)} of {run.workers} workers in",
                    "the watchdog fired the reduce with them",
                )
            )
        late = r.late - r.nonfinite
        if late:
            found.append(
                Fault(i, f"{_workers(late)} reported after the reduce fired", "their updates were left out (late)")
            )
        if r.nonfinite:
            found.append(Fault(i, f"{_workers(r.nonfinite)} sent a NaN or Inf update", "left out of the average"))
        if r.dropped_parts:
            parts = ", ".join(f"shard {s} ← worker {w}" for s, w in sorted(p.split(":") for p in r.dropped_parts))
            found.append(
                Fault(
                    i,
                    f"parts not read within the read timeout: {parts}",
                    "dropped; the average is weighted by the parts read",
                )
            )
        if r.reduce_relaunches:
            found.append(
                Fault(
                    i,
                    f"{r.reduce_relaunches} reducer launch(es) missing at a deadline",
                    "the watchdog re-launched them",
                )
            )
        if r.stale_shards:
            shards = ", ".join(map(str, sorted(r.stale_shards)))
            found.append(
                Fault(
                    i,
                    f"no reducer finished shard {shards} within the retries",
                    "the shard kept the iteration's weights (stale) and the merge went on",
                )
            )
        if r.stale_attempts:
            found.append(Fault(i, f"{r.stale_attempts} report(s) of superseded attempts", "ignored"))
    if run.status in {"FAILED", "STOPPED"}:
        found.append(
            Fault(
                None,
                f"the run {run.status.lower()}: {run.reason or 'no reason recorded'}",
                f"no new iteration started after iteration {run.iteration}",
            )
        )
    return found


def traces(records: Iterable[UsageRecord]) -> dict[int, list[str]]:
    """Each iteration's X-Ray trace ids, its launch's first (none where the functions are not traced)."""
    found: dict[int, list[str]] = defaultdict(list)
    for r in sorted(records, key=lambda r: (r.function != "work_launcher", r.start)):
        if r.iteration is not None and r.trace_id and r.trace_id not in found[r.iteration]:
            found[r.iteration].append(r.trace_id)
    return dict(found)


def trace_url(trace_id: str, region: str) -> str:
    return f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#xray:traces/{trace_id}"


@dataclass
class Report:
    summary: runs.RunSummary
    run: RunRecord
    points: list[Point]
    seconds: dict[int, float]  # each iteration's, launch to launch
    timelines: list[Timeline]
    stages: dict[str, float]
    functions: list[FunctionUse]
    faults: list[Fault]
    traces: dict[int, list[str]]
    region: str | None = None
    images: dict[str, str] = field(default_factory=dict)  # what → file name, once drawn


def gather(
    run: RunRecord,
    iterations: list[IterationRecord],
    records: list[UsageRecord],
    summary: runs.RunSummary,
    chosen: Sequence[int] = (),
    region: str | None = None,
    table: PriceTable | None = None,
) -> Report:
    """Everything the page shows, from the run's records. ``chosen`` iterations are drawn besides the slowest
    and a median one."""
    table = table or prices.load()
    by_iteration = {r.iteration: r for r in iterations}
    known = sorted(by_iteration.keys() | {r.iteration for r in records if r.iteration is not None})
    unknown = [i for i in chosen if i not in known]
    if unknown:
        span = f"{known[0]}–{known[-1]}" if known else "none"
        raise BadInputError(
            f"--iteration {', '.join(map(str, unknown))}: not an iteration of run {run.run_id!r}"
            f" (its iterations: {span})"
        )
    seconds = iteration_seconds(iterations)
    if not seconds:  # a run of one iteration: its invocations' span
        for i in known:
            mine = [r for r in records if r.iteration == i]
            if mine:
                seconds[i] = max(r.end for r in mine) - min(r.start for r in mine)
    timelines = [timeline(i, records, by_iteration.get(i), why, seconds.get(i)) for i, why in choose(seconds, chosen)]
    return Report(
        summary=summary,
        run=run,
        points=curves(run, iterations, records, table),
        seconds=seconds,
        timelines=timelines,
        stages=critical_path(records, iterations, run),
        functions=by_function(records, table),
        faults=faults(run, iterations),
        traces=traces(records),
        region=region,
    )


# ---- drawing -------------------------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # the Agg canvas, without pyplot's global state

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def first_metric(points: Sequence[Point]) -> str:
    """The first compiled metric's Keras name on the points evaluated, else trained (``loss``: no metric)."""
    evaluated = next((p.test or p.val for p in points if p.test or p.val), None)
    return display.first_metric(evaluated if evaluated is not None else next((p.train for p in points if p.train), {}))


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


def draw(report: Report, out_dir: Path) -> dict[str, str]:
    """The PNGs of ``report`` under ``out_dir``: what → file name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    draw_curves(report.points, out_dir / CURVES)
    images = {"curves": CURVES}
    for line in report.timelines:
        name = f"timeline-{line.iteration}.png"
        draw_timeline(line, out_dir / name)
        images[f"timeline-{line.iteration}"] = name
    draw_cost(report.stages, report.functions, out_dir / COST)
    images["cost"] = COST
    report.images = images
    return images


# ---- the page ------------------------------------------------------------------------------------------------


def figure(value: float | None) -> str:
    """A loss or metric in a table: four decimals, ``–`` if none."""
    return "–" if value is None else f"{value:.4f}"


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def money(dollars: float) -> str:
    return f"${dollars:,.2f}" if dollars >= 1 else f"${dollars:.3g}"


def shown(name: str, value: Any) -> str:
    """A summary figure as the page shows it."""
    if value is None or value == {}:
        return "–"
    if name == "final_train_loss" or (name.startswith(("test_", "val_")) and isinstance(value, float)):
        return f"{value:.4f}"
    if name.endswith("_s"):
        return f"{value:.3f} s"
    if name == "overhead_share":
        return f"{value:.1%}"
    if name.startswith("bytes_"):
        return f"{value / 1e6:.3f} MB"
    if name in {"cost_usd", "cost_per_iteration_usd"}:
        return money(value)
    if name == "cost_by_service_usd":
        return ", ".join(f"{service} {money(d)}" for service, d in sorted(value.items(), key=lambda kv: -kv[1]))
    if name == "requests_per_iteration":
        return ", ".join(f"{op} {n:g}" for op, n in value.items())
    if isinstance(value, dict):
        return json.dumps(value, separators=(", ", ": "))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value.value if hasattr(value, "value") else value)


HEADLINE = {  # the summary's figures at the top of the page, with their captions
    "status": "status",
    "iterations": "iterations",
    "test_loss": "test_loss",
    "median_iteration_s": "median iteration",
    "wall_s": "wall time",
    "cost_usd": "cost",
    "cost_per_iteration_usd": "cost per iteration (median)",
    "late_workers": "late workers",
}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
h1 { font-size: 1.5em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; } h3 { font-size: 1.05em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8em; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 0.9em; min-width: 9em; }
.card .k { font-size: 0.8em; color: #666; } .card .v { font-size: 1.3em; font-weight: 600; }
img { max-width: 100%; border: 1px solid #eee; } .note { color: #666; font-size: 0.9em; }
.bad { color: #b00; }
"""


def _figure_cell(name: str, value: Any, tag: str = "td", cls: str = "v") -> str:
    data = json.dumps(value, sort_keys=True)
    return f'<{tag} class="{cls}" data-field="{_e(name)}" data-value="{_e(data)}">{_e(shown(name, value))}</{tag}>'


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _img(report: Report, key: str, alt: str) -> str:
    name = report.images.get(key)
    return f'<p><img src="{_e(name)}" alt="{_e(alt)}"></p>' if name else ""


def _trace_cell(report: Report, iteration: int) -> str:
    found = report.traces.get(iteration, [])
    if not found:
        return "none"
    if report.region is None:
        return ", ".join(_e(t) for t in found)
    return ", ".join(f'<a href="{_e(trace_url(t, report.region))}">{_e(t)}</a>' for t in found)


def render(report: Report) -> str:
    """The page: escaped text, the PNGs of ``report.images`` referenced relatively, no scripts."""
    s, run = report.summary, report.run
    dumped = s.model_dump(mode="json")
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>slsml run {_e(s.run_id)}'
        f"</title><style>{STYLE}</style></head><body>"
    ]
    parts.append(f"<h1>Run <code>{_e(s.run_id)}</code></h1>")
    spec = (
        f"{s.workers} workers × {s.reducers} reducers, quorum {s.quorum:g}, dataset {_e(run.dataset)}, "
        f"budget {run.iterations} iterations, deadline {run.deadline_s:g} s"
    )
    parts.append(f"<p>{spec}</p>")
    if s.reason:
        parts.append(f'<p class="bad">{_e(s.status.value)}: {_e(s.reason)}</p>')
    headline: dict[str, str] = {}
    for name, caption in HEADLINE.items():  # the test loss, then the first compiled metric
        headline[name] = caption
        if name == "test_loss" and (metric := display.first_metric(s.test)) != "loss":
            headline[f"test_{metric}"] = f"test_{metric}"
    parts.append(
        '<div class="cards" id="headline">'
        + "".join(
            f'<div class="card"><div class="k">{_e(caption)}</div>'
            + _figure_cell(name, dumped[name], tag="div")
            + "</div>"
            for name, caption in headline.items()
        )
        + "</div>"
    )

    parts.append('<h2 id="training">Training</h2>')
    drawn = series(report.points)
    parts.append(
        _img(
            report,
            "curves",
            " and ".join(", ".join(label for label, _ in lines) for lines in drawn.values() if lines)
            + " against iterations, wall time and dollars",
        )
    )
    evaluated = [p for p in report.points if p.test or p.val]
    if evaluated:
        names = [
            f"{split}_{name}"
            for split in ("test", "val")
            for name in dict.fromkeys(n for p in evaluated for n in getattr(p, split))
        ]
        parts.append(
            _table(
                ["iteration", "wall time", "dollars so far", *names],
                (
                    [
                        str(p.iteration),
                        "–" if p.wall_s is None else f"{p.wall_s:.2f} s",
                        _e(money(p.dollars)),
                        *(figure(getattr(p, split).get(name)) for split, _, name in (n.partition("_") for n in names)),
                    ]
                    for p in evaluated
                ),
                numeric=tuple(range(3 + len(names))),
            )
        )

    parts.append('<h2 id="timelines">Iterations, invocation by invocation</h2>')
    parts.append(
        '<p class="note">Each bar is one function invocation (its usage line: from its start, or the end'
        " of the message before it in the same invocation, to its end). Hatched: late reports and"
        " re-launched attempts. Lines: when the reduce fired and when the iteration merged.</p>"
    )
    if not report.timelines:
        parts.append("<p>No iteration ran.</p>")
    for line in report.timelines:
        took = "" if line.seconds is None else f": {line.seconds:.3f} s launch to launch"
        parts.append(f'<h3 id="iteration-{line.iteration}">Iteration {line.iteration} ({_e(line.why)}){took}</h3>')
        parts.append(_img(report, f"timeline-{line.iteration}", f"invocations of iteration {line.iteration}"))
        parts.append(f"<p>X-Ray: {_trace_cell(report, line.iteration)}</p>")
        if line.left_out:
            parts.append('<p class="note">Not drawn: ' + "; ".join(_e(x) for x in line.left_out) + "</p>")

    parts.append('<h2 id="cost">Where the time, the requests and the dollars went</h2>')
    parts.append(_img(report, "cost", "critical path by stage; requests and dollars by function and service"))
    if report.stages:
        total = sum(report.stages.values())
        parts.append(
            _table(
                ["stage (critical path)", "median ms", "share"],
                (
                    [_e(stage), f"{t * 1000:.1f}", f"{t / total:.0%}" if total else "–"]
                    for stage, t in report.stages.items()
                ),
                numeric=(1, 2),
            )
        )
        parts.append(
            '<p class="note">Stages of the steady iterations (all but the first and the last), each from'
            " the end of the one before it: they add up to the iteration, launch to launch. Where a"
            " function's messages are delivered before it ends (the firing ReduceLauncher publishes the"
            " Reduce messages before it marks the counter), its stage ends where the next began.</p>"
        )
    else:
        parts.append('<p class="note">The critical path needs three or more iterations.</p>')
    parts.append(
        _table(
            ["function", "invocations", "busy s", "GB-s", "requests", "dollars", "by service"],
            (
                [
                    _e(FUNCTIONS.get(u.function, u.function)),
                    str(u.invocations),
                    f"{u.seconds:.2f}",
                    f"{u.gb_seconds:.2f}",
                    str(sum(u.requests.values())),
                    _e(money(u.total_dollars)),
                    _e(", ".join(f"{k} {money(v)}" for k, v in sorted(u.dollars.items(), key=lambda kv: -kv[1]))),
                ]
                for u in report.functions
            ),
            numeric=(1, 2, 3, 4, 5),
        )
    )
    if s.cost_by_service_usd:
        parts.append(
            _table(
                ["service", "dollars", "share"],
                (
                    [_e(k), _e(money(v)), f"{v / s.cost_usd:.0%}" if s.cost_usd else "–"]
                    for k, v in sorted(s.cost_by_service_usd.items(), key=lambda kv: -kv[1])
                ),
                numeric=(1, 2),
            )
        )

    parts.append('<h2 id="faults">Faults and what the pipeline did</h2>')
    if report.faults:
        parts.append(
            _table(
                ["iteration", "what happened", "what the pipeline did"],
                (
                    [
                        "run" if f.iteration is None else f'<a href="#row-{f.iteration}">{f.iteration}</a>',
                        _e(f.what),
                        _e(f.done),
                    ]
                    for f in report.faults
                ),
            )
        )
    else:
        parts.append("<p>None: every worker reported in time, no deadline fired, no part was dropped.</p>")
    if s.faults:
        injected = ", ".join(f"{k} {n}" for k, n in s.faults.get("injected", {}).items() if n) or "none"
        parts.append(
            f"<p>Injected (local run): {_e(injected)}. What it took: "
            f"{_e(s.faults.get('failed_invocations', 0))} failed invocations, "
            f"{_e(s.faults.get('retries', 0))} retried, {_e(s.faults.get('dead_letters', 0))} dead letters."
            "</p>"
        )

    parts.append('<h2 id="iterations">Every iteration</h2>')
    if not report.traces:
        parts.append(
            '<p class="note">X-Ray traces: none. The functions logged no trace id (a local run is not traced).</p>'
        )
    by_fault: Counter = Counter(f.iteration for f in report.faults)
    seconds = report.seconds
    metric = first_metric(report.points)
    parts.append(
        _table(
            ["iteration", "s", "loss", metric, f"test_{metric}", "faults", "X-Ray"],
            (
                [
                    f'<span id="row-{p.iteration}">{p.iteration}</span>',
                    f"{seconds[p.iteration]:.3f}" if p.iteration in seconds else "–",
                    figure(p.train.get("loss")),
                    figure(p.train.get(metric)),
                    figure(p.test.get(metric)),
                    str(by_fault[p.iteration] or ""),
                    _trace_cell(report, p.iteration),
                ]
                for p in report.points
            ),
            numeric=(1, 2, 3, 4, 5),
        )
    )

    parts.append('<h2 id="summary">Run summary</h2>')
    parts.append('<p class="note">The figures of <code>slsml run status --json</code>.</p>')
    parts.append(
        '<table id="summary-table">'
        + "".join(f"<tr><th>{_e(name)}</th>{_figure_cell(name, value)}</tr>" for name, value in dumped.items())
        + "</table>"
    )
    summary_json = json.dumps(dumped, sort_keys=True).replace("<", "\\u003c")
    parts.append(f'<script type="application/json" id="summary-json">{summary_json}</script>')
    parts.append("</body></html>")
    return "\n".join(parts)


# ---- the entry point -----------------------------------------------------------------------------------------


def write_report(
    services: Services,
    usage_records: list[UsageRecord],
    run_id: str,
    out_dir: Path,
    chosen: Sequence[int] = (),
    summary: runs.RunSummary | None = None,
) -> Path:
    """Write run ``run_id``'s report under ``out_dir``; returns the page's path. ``summary``: the run's, where
    the caller has it (a local run's, with its wall time and faults); else ``runs.summarize`` with the run's
    time from its creation to its last update, as ``slsml run status --stack`` shows it."""
    run = services.table.get_run(run_id)
    iterations = services.table.list_iterations(run_id)
    if summary is None:
        summary = runs.summarize(
            run, iterations, run.updated_at - run.created_at, usage_records, spend.spent(services, run)
        )
    traced = any(r.trace_id for r in usage_records)
    region = services.store.s3.meta.region_name if traced else None
    report = gather(run, iterations, usage_records, summary, chosen, region)
    out_dir = Path(out_dir)
    draw(report, out_dir)
    page = out_dir / PAGE
    page.write_text(render(report), encoding="utf-8")
    return page
