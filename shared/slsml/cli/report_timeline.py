"""A run report's transaction diagrams: an iteration's invocations, one bar each on a time axis from its launch,
and which iterations the report draws (the slowest, a median one, any chosen)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slsml.accounting.usage import UsageRecord
from slsml.state.records import DEADLINE_OWNER, MERGER_OWNER, IterationRecord

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


MAX_TIMELINE_ROWS = 160  # beyond, an iteration's diagram gets unreadably tall: the rest is counted in a note


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


def _label(record: UsageRecord, staged: bool = False) -> str:
    """The bar's name (``staged``: the iteration's workers ran in pipeline stages, each named)."""
    name = FUNCTIONS.get(record.function, record.function)
    if record.function == "worker" and record.worker is not None:
        return f"{name} {record.worker}" + (f" stage {record.pipeline_stage or 0}" if staged else "")
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
    return place, record.function, part, record.pipeline_stage or 0, record.attempt or 0, record.start


def timeline(
    iteration: int,
    records: Iterable[UsageRecord],
    record: IterationRecord | None = None,
    why: str = "",
    seconds: float | None = None,
) -> Timeline:
    """The transaction diagram of ``iteration``: its records (any run's records may be given: the iteration's
    are taken) as bars in chain order (WorkLauncher, workers by index and stage, ReduceLauncher per report, reducers by
    shard, Merger, Watchdog), on a time axis from its launch. A watchdog wake after the iteration's last other
    invocation ended (a deadline that came when the iteration was merged) is counted in ``left_out``, not
    drawn; so are rows beyond ``MAX_TIMELINE_ROWS``."""
    mine = sorted((r for r in records if r.iteration == iteration), key=_order)
    launches = [r.start for r in mine if r.function == "work_launcher"]
    origin = min(launches) if launches else min((r.start for r in mine), default=0.0)
    chain_end = max((r.end for r in mine if r.function != "watchdog"), default=origin)
    merged = record is not None and record.merged_at is not None
    staged = any(r.pipeline_stage for r in mine)
    bars: list[Bar] = []
    left_out: list[str] = []
    for r in mine:
        if r.function == "watchdog" and merged and r.start > chain_end:
            left_out.append(f"{_label(r, staged)} at +{r.start - origin:.2f} s, after the iteration's chain ended")
            continue
        if len(bars) == MAX_TIMELINE_ROWS:
            left_out.append(f"{_label(r, staged)} at +{r.start - origin:.2f} s: past {MAX_TIMELINE_ROWS} rows")
            continue
        bars.append(Bar(len(bars), r.function, _label(r, staged), r.start - origin, r.end - origin, _note(r, record)))
    marks: list[tuple[str, float]] = []
    if record is not None:
        if record.reduce_fired_at:
            named: dict[int | None, str] = {
                DEADLINE_OWNER: "by the watchdog at a deadline",
                MERGER_OWNER: "by the Merger",
            }
            who = named.get(record.reduce_fired_by, f"on worker {record.reduce_fired_by}")
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
