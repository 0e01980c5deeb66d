"""The straggler benchmark, in miniature: its four runs complete, and a straggler that the quorum
waits for lengthens the iterations."""

from __future__ import annotations

import pytest

from slsml import bench


def test_the_straggler_benchmark_compares_four_runs(local, services, digits):
    progress: dict[str, int] = {}
    report = bench.stragglers(local, workers=2, iterations=3, slow_iterations=3, factor=3,
                              progress=lambda case, done, total: progress.__setitem__(case, total))
    print(report.model_dump_json(indent=1))
    assert [c.name for c in report.cases] == ["a", "b", "c", "d"]
    assert progress == {"a": 3, "b": 3, "c": 3, "d": 3}
    assert [(c.quorum, c.straggler) for c in report.cases] == [(1, False), (0.5, False), (0.5, True), (1, True)]
    for case in report.cases:
        summary = case.summary
        assert summary.status == "COMPLETED", (case.name, summary.reason)
        assert summary.iterations == 3 and summary.workers == 2 and summary.quorum == case.quorum
        assert summary.median_iteration_s is not None and summary.test_accuracy is not None
    assert report.straggler == 1 and report.baseline_s > 0
    assert report.delay_s == pytest.approx(2 * report.baseline_s)
    a, d = report.case("a").summary, report.case("d").summary
    assert d.median_iteration_s > a.median_iteration_s  # quorum 1 waits for the straggler
    assert report.d_growth_s == pytest.approx(d.median_iteration_s - a.median_iteration_s)
    assert report.case("d").ratio == pytest.approx(d.median_iteration_s / a.median_iteration_s)
    assert local.host.faults is None  # the straggler is gone once the benchmark ends
