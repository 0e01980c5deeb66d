"""A run report's page: what went wrong and what the pipeline did (``faults``), each iteration's X-Ray traces,
and the self-contained HTML (``render``) of a gathered ``Report``."""

from __future__ import annotations

import html
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slsml.accounting.usage import UsageRecord
from slsml.cli import display_runs
from slsml.cli.display import dollars
from slsml.cli.report_charts import FunctionUse, Point, first_metric, series
from slsml.cli.report_timeline import FUNCTIONS, Timeline
from slsml.client import runs
from slsml.state.records import IterationRecord, RunRecord


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


def figure(value: float | None) -> str:
    """A loss or metric in a table: four decimals, ``–`` if none."""
    return "–" if value is None else f"{value:.4f}"


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


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
        return dollars(value)
    if name == "cost_by_service_usd":
        return ", ".join(f"{service} {dollars(d)}" for service, d in sorted(value.items(), key=lambda kv: -kv[1]))
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
    "stale_updates": "updates on stale weights",  # with stale_weights
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
        if name == "stale_updates" and not s.training.stale_weights:
            continue  # a run on fresh weights has none
        headline[name] = caption
        if name == "test_loss" and (metric := display_runs.first_metric(s.test)) != "loss":
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
                        _e(dollars(p.dollars)),
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
                    _e(dollars(u.total_dollars)),
                    _e(", ".join(f"{k} {dollars(v)}" for k, v in sorted(u.dollars.items(), key=lambda kv: -kv[1]))),
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
                    [_e(k), _e(dollars(v)), f"{v / s.cost_usd:.0%}" if s.cost_usd else "–"]
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
