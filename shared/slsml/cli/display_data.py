"""What the ``slsml`` command shows of datasets: the samples read while one is stored (``data put``), a dataset's
manifest (``data show``) and the list of datasets (``data list``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from slsml.cli.display import console, results, say


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
