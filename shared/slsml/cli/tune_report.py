"""A search's report: one self-contained HTML page with its trials against time and dollars (which were stopped, and
when), the objective at each epoch of each trial, the best trial, and a table of every trial."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from slsml.accounting.prices import usd
from slsml.cli.report_page import STYLE, figure
from slsml.search.records import SearchSummary, TrialRecord, TrialStatus

PAGE = "index.html"
TRIALS = "trials.png"
OBJECTIVE = "objective.png"
STATUS_COLORS = {
    TrialStatus.COMPLETED: "#2e7d32",
    TrialStatus.PRUNED: "#ef6c00",
    TrialStatus.FAILED: "#c62828",
    TrialStatus.INTERRUPTED: "#757575",
}


def write_report(summary: SearchSummary, out_dir: Path) -> Path:
    """Write the search's page and its PNGs under ``out_dir``; the page's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    trials = sorted([*summary.trials, *summary.interrupted], key=lambda t: t.number)
    draw_trials(summary, trials, out_dir / TRIALS)
    draw_objective(summary, trials, out_dir / OBJECTIVE)
    page = out_dir / PAGE
    page.write_text(render(summary, trials))
    return page


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # the Agg canvas, without pyplot's global state

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def draw_trials(summary: SearchSummary, trials: list[TrialRecord], path: Path) -> None:
    """Left: each trial as a bar from its start to its end, coloured by how it ended, the best starred. Right: the
    search's spend as its trials end, against its budget."""
    figure_ = _figure(13, 0.5 * max(4, len(trials)) + 1.5)
    timeline, dollars = figure_.subplots(1, 2, width_ratios=(3, 2))
    began = min((t.started_at for t in trials), default=0.0)
    best = summary.best_trial
    for trial in trials:
        start, end = trial.started_at - began, trial.ended_at - began
        row = trial.number
        timeline.barh(row, end - start, left=start, color=STATUS_COLORS[trial.status], height=0.6)
        label = trial.status.value
        if trial.status != TrialStatus.COMPLETED:
            label += f" at epoch {trial.epochs(summary.settings.objective)}"
        timeline.text(end, row, f" {label}", va="center", fontsize=8)
        if best is not None and trial.number == best.number:
            timeline.plot(end, row, marker="*", markersize=14, color="gold", markeredgecolor="black")
    timeline.set_xlabel("seconds since the first trial started")
    timeline.set_ylabel("trial")
    timeline.yaxis.get_major_locator().set_params(integer=True)
    timeline.invert_yaxis()
    timeline.grid(alpha=0.3)
    timeline.set_title("trials against time (★ the best)")
    spent, points = 0.0, [(0.0, 0.0)]
    for trial in sorted(trials, key=lambda t: t.ended_at):
        spent += trial.cost_usd or 0.0
        points.append((trial.ended_at - began, spent))
    dollars.step(*zip(*points, strict=True), where="post", label="spent")
    if summary.settings.budget_usd is not None:
        dollars.axhline(summary.settings.budget_usd, color="#c62828", linestyle="--", label="budget")
    dollars.set_xlabel("seconds since the first trial started")
    dollars.set_ylabel("dollars")
    dollars.yaxis.set_major_formatter(lambda value, _: f"${value:.2g}")
    dollars.legend(loc="best", fontsize=8)
    dollars.grid(alpha=0.3)
    dollars.set_title("the search's spend as its trials end")
    figure_.savefig(path, format="png")


def draw_objective(summary: SearchSummary, trials: list[TrialRecord], path: Path) -> None:
    """The objective at each epoch's end of each trial: a pruned trial's line ends in an ×, the best is drawn bold."""
    objective = summary.settings.objective
    figure_ = _figure(9, 5)
    axis = figure_.subplots()
    for trial in trials:
        values = trial.history.get(objective, [])
        if not values:
            continue
        best = summary.best_trial is not None and trial.number == summary.best_trial.number
        epochs = range(1, len(values) + 1)
        axis.plot(
            epochs,
            values,
            color=STATUS_COLORS[trial.status],
            linewidth=2.5 if best else 1.0,
            alpha=1.0 if best else 0.7,
            marker="o",
            markersize=3,
            label=f"trial {trial.number} (best)" if best else None,
        )
        if trial.status != TrialStatus.COMPLETED:
            axis.plot(len(values), values[-1], marker="x", markersize=9, color=STATUS_COLORS[trial.status])
    axis.set_xlabel("epoch")
    axis.set_ylabel(objective)
    axis.set_xlim(0.8, summary.settings.epochs + 0.2)
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(loc="best", fontsize=8)
    axis.set_title(f"{objective} per epoch: completed green, pruned orange (× where stopped), failed red")
    figure_.savefig(path, format="png")


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _card(key: str, value: str) -> str:
    return f'<div class="card"><div class="k">{_e(key)}</div><div class="v">{_e(value)}</div></div>'


def render(summary: SearchSummary, trials: list[TrialRecord]) -> str:
    """The page: escaped text, the PNGs referenced relatively, no scripts."""
    settings, best = summary.settings, summary.best_trial
    counts = {status: sum(t.status == status for t in trials) for status in TrialStatus}
    spent = "–" if summary.spent_usd is None else usd(summary.spent_usd)
    if settings.budget_usd is not None:
        spent += f" of {usd(settings.budget_usd)}"
    cards = [
        _card(f"best {settings.objective}", figure(summary.best_value)),
        _card("best trial", "–" if best is None else str(best.number)),
        _card("trials", ", ".join(f"{n} {status.value}" for status, n in counts.items() if n)),
        _card("wall time", f"{summary.wall_s:.1f} s"),
        _card("spent", spent),
    ]
    names = list(dict.fromkeys(name for t in trials for name in t.hyperparameters))
    header = ["trial", "status", "epochs", settings.objective, *names, "wall", "cost", "stopped", "run"]
    began = min((t.started_at for t in trials), default=0.0)
    rows = []
    for t in trials:
        stopped = (
            f"epoch {t.epochs(settings.objective)}, {t.ended_at - began:.1f} s in"
            if t.status != TrialStatus.COMPLETED
            else ""
        )
        cells = [
            str(t.number) + (" ★" if best is not None and t.number == best.number else ""),
            t.status.value,
            str(t.epochs(settings.objective)),
            figure(t.value),
            *(_shown(t.hyperparameters.get(name)) for name in names),
            f"{t.wall_s:.1f} s",
            "–" if t.cost_usd is None else usd(t.cost_usd),
            stopped + (f" ({t.reason})" if t.reason and t.status == TrialStatus.FAILED else ""),
            t.run_id,
        ]
        rows.append("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in cells) + "</tr>")
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    chosen = (
        "" if best is None else ", ".join(f"{name} = {_shown(value)}" for name, value in best.hyperparameters.items())
    )
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>slsml search {_e(settings.name)}'
        f"</title><style>{STYLE}</style></head><body>",
        f"<h1>Search <code>{_e(settings.name)}</code></h1>",
        f"<p>{settings.max_trials} trials of {settings.epochs} epochs, {settings.parallel} at once, on dataset"
        f" {_e(settings.dataset)}; {_e(settings.objective)} {settings.direction}imized;"
        f" pruner {_e(settings.pruner)}</p>",
        f'<div class="cards">{"".join(cards)}</div>',
        f"<p>best hyperparameters: {_e(chosen or '–')}</p>",
    ]
    if summary.stopped_starting:
        parts.append(f'<p class="bad">no more trials were started: {_e(summary.stopped_starting)}</p>')
    parts += [
        "<h2>Trials against time and dollars</h2>",
        f'<p><img src="{TRIALS}" alt="trials against time and dollars"></p>',
        f"<h2>{_e(settings.objective)} per epoch</h2>",
        f'<p><img src="{OBJECTIVE}" alt="the objective per epoch of each trial"></p>',
        "<h2>Trials</h2>",
        f"<table><tr>{head}</tr>{''.join(rows)}</table>",
        "</body></html>",
    ]
    return "\n".join(parts)


def _shown(value: Any) -> str:
    return "–" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
