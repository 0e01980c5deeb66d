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

The pieces are plain functions of records: the transaction diagrams in ``report_timeline``, the curves and
the usage by function in ``report_charts``, the faults and traces in ``report_page``; ``gather`` collects
them into a ``Report`` that ``draw`` (``report_charts``) and ``render`` (``report_page``) turn into files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slsml.accounting import prices
from slsml.accounting.prices import PriceTable
from slsml.accounting.usage import UsageRecord
from slsml.cli.report_charts import by_function, critical_path, curves, draw_cost, draw_curves, draw_timeline
from slsml.cli.report_page import Report, faults, render, traces
from slsml.cli.report_timeline import choose, iteration_seconds, timeline
from slsml.client import runs
from slsml.pipeline import spend
from slsml.pipeline.services import Services
from slsml.spec.errors import BadInputError
from slsml.state.records import IterationRecord, RunRecord

PAGE = "index.html"
CURVES = "curves.png"
COST = "cost.png"


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
