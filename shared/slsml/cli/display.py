"""Where the ``slsml`` command's output goes: a command's result (a table, a listing, a summary, a report) on
stdout, or with ``--json`` as one JSON line on stdout and drawn on stderr; progress and diagnostics on stderr; and
the figures every display writes alike (numbers, dollars, a budget's spend). The other modules of ``slsml.cli``
parse and run the commands; what they draw is in the ``display_*`` modules beside this one: runs
(``display_runs``), datasets (``display_data``) and benchmarks (``display_bench``)."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

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
        return _uncut_console()(stderr=stderr, width=UNCUT_WIDTH, rule_width=drawn.width)
    return drawn


@functools.cache
def _uncut_console() -> type:
    """The console into a file or a pipe (rich imported when a command draws, not when it starts)."""
    from rich.console import Console
    from rich.rule import Rule

    class UncutConsole(Console):
        """Lines as long as they are (a table at its own width, not cut at the 80 columns rich assumes into a file
        or a pipe), and a rule, which fills the width it is given, as wide as rich draws one there (``rule_width``:
        80, or the terminal's where another of the process's streams is one)."""

        def __init__(self, *args: Any, rule_width: int, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.rule_width = rule_width

        def rule(
            self, title: Any = "", *, characters: str = "─", style: Any = "rule.line", align: Any = "center"
        ) -> None:
            self.print(Rule(title, characters=characters, style=style, align=align), width=self.rule_width)

    return UncutConsole


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


def number(value: Any) -> str:
    if isinstance(value, tuple | list):
        return "(" + ", ".join(number(v) for v in value) + ")"
    return f"{value:g}" if isinstance(value, float) else str(value)


def dollars(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.3g}"


def spend(spent: float, budget: float) -> str:
    """A run's spend against its budget, e.g. ``$0.0105 spent of the $0.01 budget (105%)``."""
    from slsml.accounting.prices import usd

    return f"{usd(spent)} spent of the {usd(budget)} budget ({spent / budget:.0%})"
