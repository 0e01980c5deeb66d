"""The progress line of `run watch` (and of every followed run): the last merged iteration's figures and stage
times, what the run met so far, and the dollars spent, refreshed from the usage lines now and then."""

from __future__ import annotations

from slsml.cli.display_runs import ProgressText
from slsml.spec.config import TrainingSpec
from slsml.spec.messages import Participant
from slsml.state.records import Counter, IterationRecord, RunRecord, RunStatus, WorkerReport


def _run(iteration: int, workers: int = 4, reason: str | None = None) -> RunRecord:
    return RunRecord(
        run_id="r",
        status=RunStatus.RUNNING,
        training=TrainingSpec(workers=4, reducers=2, iterations=20, quorum=0.75, max_workers=8),
        iteration=iteration,
        workers=workers,
        workers_reason=reason,
        dataset="d",
        created_at=0.0,
        updated_at=0.0,
    )


def _counter(
    iteration: int,
    arrived: int,
    relaunches: int = 0,
    stale: set[int] | None = None,
    workers: int = 4,
    reason: str | None = None,
    late: set[int] | None = None,
) -> Counter:
    """The counter of an iteration whose reduce took workers 0–2; with ``late``: its record, in which those
    workers reported after it fired (``runs.wait_for_run`` reads the record where the counter's count is past
    the participants)."""
    if late is not None:
        counter = _counter(iteration, arrived, relaunches, stale, workers, reason)
        return IterationRecord(
            **counter.model_dump(),
            reports={w: WorkerReport(worker=w, samples=32) for w in {0, 1, 2} | late},
            participants=[Participant(worker=w, samples=32, etag=f'"{w:032x}"') for w in range(3)],
        )
    return Counter(
        iteration=iteration,
        launched_at=100.0,
        reduce_fired_at=100.25,
        merged_at=100.75,
        arrived=arrived,
        participant_count=3,
        reduce_fired_by=1,
        train_loss=0.5,
        train={"loss": 0.5, "accuracy": 0.8},
        reduce_relaunches=relaunches,
        stale_shards=stale or set(),
        workers=workers,
        workers_reason=reason,
    )


def test_the_line_shows_stage_times_what_the_run_met_and_dollars_so_far() -> None:
    calls: list[int] = []

    def spent(run: RunRecord) -> float:
        calls.append(run.iteration)
        return 0.0123

    progress = ProgressText(started=0.0, spent=spent)
    first = progress.update(_run(1), _counter(0, arrived=4, late={3}))
    assert "loss 0.5000" in first and "accuracy 0.800" in first
    assert "workers 0.25 s reduce+merge 0.50 s" in first
    assert "1 late" in first and "$0.0123 so far" in first
    again = progress.update(_run(1), _counter(0, arrived=4, late={3}))  # the same iteration seen twice counts once
    assert "1 late" in again
    later = progress.update(_run(2), _counter(1, arrived=4, relaunches=2, stale={1}, late={3}))
    assert "2 late" in later and "2 re-launched reducers" in later and "1 stale shards" in later
    assert calls == [1], "the usage lines are read at most every few seconds"


def test_reports_counted_twice_are_not_late() -> None:
    """A duplicate delivery of a report adds to the counter's count: past the participants, but no one was late,
    as the iteration's record says."""
    progress = ProgressText(started=0.0)
    assert "late" not in progress.update(_run(1), _counter(0, arrived=7))
    assert "late" not in progress.update(_run(2), _counter(1, arrived=7, late=set()))


def test_nothing_met_shows_nothing() -> None:
    line = ProgressText(started=0.0).update(_run(1), _counter(0, arrived=3))
    assert "late" not in line and "so far" not in line


def test_the_line_shows_the_workers_and_why_they_changed_lately() -> None:
    progress = ProgressText(started=0.0)
    assert "  W=4  " in progress.update(_run(1), _counter(0, arrived=3))
    scaled = progress.update(_run(2, workers=8, reason="run scale"), _counter(1, arrived=3))
    assert "  W=4→8 (run scale)  " in scaled  # the next iterations launched take 8
    # the WorkLauncher writes the run's reason on every counter it launches: the change is where the workers differ
    scale = "run scale"
    lines = {
        i: progress.update(_run(i + 1, workers=8, reason=scale), _counter(i, 6, workers=8, reason=scale))
        for i in range(2, 9)
    }
    assert all("  W=8 (run scale)  " in lines[i] for i in range(2, 2 + ProgressText.RECENT)), lines
    assert "  W=8  " in lines[2 + ProgressText.RECENT]
    tuner = "tuner (time): 0.9 s per round at 8 workers (measured), 0.7 s at 6 (predicted)"
    tuned = progress.update(_run(10, workers=6, reason=tuner), _counter(9, 5, workers=6, reason=tuner))
    assert "  W=6 (tuner, time)  " in tuned


def test_a_counter_without_workers_shows_the_runs() -> None:
    line = ProgressText(started=0.0).update(_run(1, workers=3), Counter(iteration=0, train_loss=0.5))
    assert line.endswith("  W=3")
