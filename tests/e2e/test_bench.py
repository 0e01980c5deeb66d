"""The straggler benchmark, in miniature: its six runs complete, a straggler that the quorum waits for
lengthens the iterations, and with bounded staleness the straggler's late updates are folded in; the asynchronous
benchmark's synchronous and ASP runs train the same samples."""

from __future__ import annotations

import pytest

from slsml.bench import asynchronous
from slsml.bench import pipeline as bench


def test_the_straggler_benchmark_compares_six_runs(local, services, digits):
    progress: dict[str, int] = {}
    report = bench.stragglers(
        local,
        workers=2,
        iterations=4,
        slow_iterations=3,
        factor=3,
        progress=lambda case, done, total: progress.__setitem__(case, total),
    )
    print(report.model_dump_json(indent=1))
    assert [c.name for c in report.cases] == ["a", "b", "c", "d", "e", "f"]
    assert progress == {"a": 4, "b": 4, "c": 4, "d": 3, "e": 4, "f": 4}
    assert [(c.quorum, c.straggler, c.staleness) for c in report.cases] == [
        (1, False, 0),
        (0.5, False, 0),
        (0.5, True, 0),
        (1, True, 0),
        (0.5, True, 0),
        (0.5, True, bench.STALENESS),
    ]
    for case in report.cases:
        summary = case.summary
        assert summary.status == "COMPLETED", (case.name, summary.reason)
        assert summary.iterations == progress[case.name] and summary.workers == 2 and summary.quorum == case.quorum
        assert summary.median_iteration_s is not None and summary.test_accuracy is not None
    assert report.straggler == 1 and report.baseline_s > 0
    assert report.delay_s == pytest.approx(2 * report.baseline_s)
    a, d = report.case("a").summary, report.case("d").summary
    # quorum 1 waits for the straggler: each of its iterations lasts the straggler's delay and more. (Against
    # (a), the reference, a 4-iteration miniature is noisy: its median may hold a process's cold start.)
    assert d.median_iteration_s > report.delay_s
    assert report.d_growth_s == pytest.approx(d.median_iteration_s - a.median_iteration_s)
    assert report.case("d").ratio == pytest.approx(d.median_iteration_s / a.median_iteration_s)
    assert local.host.faults is None  # the straggler is gone once the benchmark ends
    e, f = report.case("e").summary, report.case("f").summary
    assert e.late_workers > 0 and e.late_folded == 0  # without staleness the late updates are dropped
    assert report.f_folded > 0 and report.f_late == report.f_folded + report.f_dropped + report.f_at_the_end
    assert f.late_folded <= report.f_folded
    assert report.ssp_delay_s == pytest.approx((report.ssp_factor - 1) * report.baseline_s)


def test_the_asynchronous_benchmark_compares_the_synchronous_and_the_asp_run_on_the_same_samples(
    local, services, digits
):
    progress: dict[str, int] = {}
    report = asynchronous.asynchronous(
        local, workers=2, iterations=3, factor=3, progress=lambda run, done, total: progress.__setitem__(run, total)
    )
    assert progress == {"synchronous": 3, "asynchronous": 6}
    assert report.straggler == 1 and report.delay_s == pytest.approx(2 * report.baseline_s)
    sync, asp = report.synchronous, report.asynchronous
    assert (sync.training.staleness, asp.training.staleness) == (0, "unbounded")
    assert (sync.iterations, asp.iterations) == (3, 6) and report.same_samples
    assert sum(report.updates_by_worker.values()) == 6 and report.time_ratio == asp.wall_s / sync.wall_s
    assert 6 / report.workers <= report.versions <= 6  # each version applied one update of a worker at least, at most
