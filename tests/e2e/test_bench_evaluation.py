"""The evaluation benchmark, in miniature (test splits of 40 and 400 samples, W of 1 and 3, 2 iterations): a point
per size and W asked, in that order, each from its run's usage lines, and the table shows them side by side."""

from __future__ import annotations

from slsml.accounting import usage
from slsml.bench import evaluation as bench_evaluation
from slsml.cli import display
from slsml.spec import keys

SIZES, WORKERS, ITERATIONS = (40, 400), (1, 3), 2


def test_a_point_per_size_and_w_from_the_runs_usage_lines(local, services, capsys) -> None:
    progress: dict[str, int] = {}
    report = bench_evaluation.evaluation(
        local, SIZES, WORKERS, ITERATIONS, lambda name, done, total: progress.__setitem__(name, total)
    )
    assert progress == {f"{n} test samples, W={w}": ITERATIONS for n in SIZES for w in WORKERS}
    assert [(p.test_samples, p.workers) for p in report.points] == [(n, w) for n in SIZES for w in WORKERS]
    assert report.iterations == ITERATIONS
    for size in SIZES:
        manifest = services.store.get_json(keys.dataset_manifest(f"evaluation-{size}"))
        assert manifest["test"]["count"] == size
    for point in report.points:  # (durations are logged to 0.1 ms)
        assert 0 < point.slowest_worker_s <= point.evaluation_wall_s + 1e-3 and point.merger_s_per_round > 0
        records = usage.read_local(local.log_dir, point.run_id)
        assert bench_evaluation.measure(point.run_id, point.test_samples, point.workers, ITERATIONS, records) == point
        evaluating = {r.worker for r in records if r.function == "worker" and r.iteration == ITERATIONS}
        assert evaluating == set(range(point.workers))  # the round past the budget: every worker evaluates

    display.print_evaluation(report)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "│" in line and line.strip("│ ")[:1].isdigit()]
    assert [row.split("│")[1:3] for row in rows] == [[f" {n:<12,} ", f" {w} "] for n in SIZES for w in WORKERS]
    assert "Merger per evaluation round, 400 against 40 test samples: W=1 ×" in out
    for n in SIZES:  # each W's evaluation time per round side by side, against the fewest workers'
        at = {p.workers: p.evaluation_wall_s for p in report.points if p.test_samples == n}
        assert (
            f"evaluation wall time per round, {n:,} test samples: W=1 {at[1]:.3f} s (×1.00), W=3 {at[3]:.3f} s"
            f" (×{at[3] / at[1]:.2f})"
        ) in " ".join(out.split())
