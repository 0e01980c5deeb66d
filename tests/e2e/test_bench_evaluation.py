"""The evaluation benchmark, in miniature (test splits of 40 and 2,100 samples, W of 1 and 3, 5 iterations): a point
per size and W asked, in that order, each from its run's usage lines and its workers' records of their slices, which
partition the test split at every evaluation round; the table shows them side by side."""

from __future__ import annotations

import statistics

from slsml.accounting import usage
from slsml.bench import evaluation as bench_evaluation
from slsml.cli import display_bench
from slsml.spec import keys
from slsml.training import evaluation

SIZES, WORKERS, ITERATIONS = (40, 2_100), (1, 3), 5  # more rounds than warm worker processes (4)


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
        slices = bench_evaluation.read_slices(local.log_dir, point.run_id)
        run = (point.run_id, point.test_samples, point.workers, ITERATIONS)
        assert bench_evaluation.measure(*run, records, slices) == point
        final = {r.worker: r for r in records if r.function == "worker" and r.iteration == ITERATIONS}
        assert set(final) == set(range(point.workers))  # the round past the budget: every worker evaluates
        # every round evaluated (eval_every 1, the first model aside) split the test samples among the W workers,
        # each a slice of ⌊n/W⌋ or ⌈n/W⌉, timed within its worker's invocation
        n, w = point.test_samples, point.workers
        for iteration in range(1, ITERATIONS + 1):
            got = {s.worker: s for s in slices if s.iteration == iteration and s.split == "test"}
            assert set(got) == set(range(w))
            assert sum(s.samples for s in got.values()) == n
            assert {s.samples for s in got.values()} <= {n // w, -(-n // w)}
            assert all(s.cpu_s > 0 and s.wall_s > 0 for s in got.values())
        assert all(s.wall_s <= final[s.worker].duration_s + 1e-3 for s in slices if s.iteration == ITERATIONS)
        # a slice of fewer samples than a batch is evaluated eagerly; each of the 4 worker processes traces the whole
        # batch's step once at most, and that evaluation is left out
        assert not any(s.traced for s in slices if s.samples < evaluation.EVALUATION_BATCH)
        assert sum(s.traced for s in slices) <= 4
        warm = {i: [s.cpu_s for s in slices if s.iteration == i and not s.traced] for i in range(1, ITERATIONS + 1)}
        assert point.slice_cpu_s == statistics.median(max(cpu) for cpu in warm.values() if cpu)

    display_bench.print_evaluation(report)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "│" in line and line.strip("│ ")[:1].isdigit()]
    cells = [[cell.strip() for cell in row.split("│")[1:3]] for row in rows]
    assert cells == [[f"{n:,}", f"{w}"] for n in SIZES for w in WORKERS]
    assert "Merger per evaluation round, 2,100 against 40 test samples: W=1 ×" in out
    for n in SIZES:  # each W's slowest slice CPU and evaluation time per round side by side, against the fewest's
        points = {p.workers: p for p in report.points if p.test_samples == n}
        cpu, wall = ({w: getattr(p, name) for w, p in points.items()} for name in ("slice_cpu_s", "evaluation_wall_s"))
        assert (
            f"slowest worker's evaluation CPU per round, {n:,} test samples: W=1 {cpu[1]:.3f} s (×1.00), W=3"
            f" {cpu[3]:.3f} s (×{cpu[3] / cpu[1]:.2f})"
        ) in " ".join(out.split())
        assert (
            f"evaluation wall time per round, {n:,} test samples: W=1 {wall[1]:.3f} s (×1.00), W=3 {wall[3]:.3f} s"
            f" (×{wall[3] / wall[1]:.2f})"
        ) in " ".join(out.split())
