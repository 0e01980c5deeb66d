"""The progress line of `run watch` (and of every followed run): the last merged iteration's figures and stage
times, what the run met so far, and the dollars spent, refreshed from the usage lines now and then."""

from __future__ import annotations

from slsml.config import TrainingSpec
from slsml.display import ProgressText
from slsml.records import Counter, RunRecord, RunStatus


def _run(iteration: int) -> RunRecord:
    return RunRecord(run_id="r", status=RunStatus.RUNNING,
                     training=TrainingSpec(workers=4, reducers=2, iterations=10, quorum=0.75), iteration=iteration,
                     workers=4, dataset="d", created_at=0.0, updated_at=0.0)


def _counter(iteration: int, arrived: int, relaunches: int = 0, stale: set[int] | None = None) -> Counter:
    return Counter(iteration=iteration, launched_at=100.0, reduce_fired_at=100.25, merged_at=100.75, arrived=arrived,
                   participant_count=3, reduce_fired_by=1, train_loss=0.5, train_accuracy=0.8,
                   reduce_relaunches=relaunches, stale_shards=stale or set())


def test_the_line_shows_stage_times_what_the_run_met_and_dollars_so_far() -> None:
    calls: list[int] = []

    def spent(run: RunRecord) -> float:
        calls.append(run.iteration)
        return 0.0123

    progress = ProgressText(started=0.0, spent=spent)
    first = progress.update(_run(1), _counter(0, arrived=4))
    assert "loss 0.5000" in first and "acc 0.800" in first
    assert "workers 0.25 s reduce+merge 0.50 s" in first
    assert "1 late" in first and "$0.0123 so far" in first
    again = progress.update(_run(1), _counter(0, arrived=4))  # the same iteration seen twice counts once
    assert "1 late" in again
    later = progress.update(_run(2), _counter(1, arrived=4, relaunches=2, stale={1}))
    assert "2 late" in later and "2 re-launched reducers" in later and "1 stale shards" in later
    assert calls == [1], "the usage lines are read at most every few seconds"


def test_nothing_met_shows_nothing() -> None:
    line = ProgressText(started=0.0).update(_run(1), _counter(0, arrived=3))
    assert "late" not in line and "so far" not in line
