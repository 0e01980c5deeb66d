"""What ``slsml tune`` shows of a search: the table of its trials (the best starred), the best, and what it spent."""

from __future__ import annotations

import json
from typing import Any

from slsml.cli.display import dollars, results


def print_search(result: Any, as_json: bool) -> None:
    """The trials as a table (the best starred) and the best, or with ``as_json`` the summary as one JSON line."""
    from rich.table import Table

    from slsml.client.tune import counted

    settings = result.settings
    trials = sorted([*result.trials, *result.interrupted], key=lambda t: t.number)
    names = list(dict.fromkeys(name for t in trials for name in t.hyperparameters))
    table = Table(title=f"search {settings.name}: {settings.objective}, {settings.direction}imized")
    for column in ("trial", "status", "epochs", settings.objective, *names, "wall", "cost", "run"):
        table.add_column(column, justify="left" if column in {"status", "run"} else "right")
    best = result.best_trial
    for t in trials:
        table.add_row(
            f"{t.number}{' ★' if best is not None and t.number == best.number else ''}",
            t.status.value,
            str(t.epochs(settings.objective)),
            "–" if t.value is None else f"{t.value:.4f}",
            *(_value(t.hyperparameters.get(name)) for name in names),
            f"{t.wall_s:.1f} s",
            "–" if t.cost_usd is None else dollars(t.cost_usd),
            t.run_id,
        )
    console = results(as_json)
    console.print(table)
    if best is not None:
        chosen = ", ".join(f"{name}={_value(value)}" for name, value in best.hyperparameters.items())
        console.print(
            f"best: trial {best.number}, {settings.objective} {result.best_value:.4f} ({chosen}), run {best.run_id}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    spent = "" if result.spent_usd is None else f", {dollars(result.spent_usd)} spent"
    console.print(
        f"{counted(len(result.trials), 'trial')} in {result.wall_s:.1f} s{spent}", markup=False, highlight=False
    )
    if result.stopped_starting:
        console.print(f"no more trials: {result.stopped_starting}", markup=False, highlight=False, soft_wrap=True)
    if as_json:
        print(json.dumps(result.model_dump(mode="json")))


def _value(value: Any) -> str:
    return "–" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
