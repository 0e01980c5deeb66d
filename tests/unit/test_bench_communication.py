"""`slsml bench communication` judges and draws its report: a row per compressor to the target and over the fixed
budget, the test accuracy by iteration, and the verdicts on fp16 and top-k. (The benchmark itself takes minutes:
it is not run here; tests/e2e/test_bench_communication.py runs a miniature.)"""

from __future__ import annotations

import re

import pytest

from slsml.bench import communication as bench_communication
from slsml.bench.communication import CommunicationReport, Variant
from slsml.cli import display_bench

DENSE_UPDATE = 32 + 4 * 38_282  # bytes of one dense update of the demo CNN
WORKERS, ITERATIONS = 8, 150
# name → (mean update bytes, iterations to 0.95, final test accuracy)
FIGURES: dict[str, tuple[int, int | None, float]] = {
    "dense": (DENSE_UPDATE, 40, 0.9721),
    "fp16": (32 + 2 * 38_282, 41, 0.9694),
    "topk": (32 + 8 * 384, 70, 0.9610),
    "significance": (20_000, 45, 0.9700),
}


def _accuracy(reached: int | None, final: float) -> list[float | None]:
    """Rising to 0.95 after ``reached`` iterations (never: up to 0.94), ``final`` after the last."""
    top = 0.95 if reached else 0.94
    rising = [round(0.1 + (top - 0.1) * (i + 1) / (reached or ITERATIONS), 4) for i in range(reached or ITERATIONS)]
    return [*(rising + [0.955] * ITERATIONS)[: ITERATIONS - 1], final]


def _variant(name: str, spec) -> Variant:
    update, reached, final = FIGURES[name]
    lossy = name != "dense"
    residual = 4 * 38_282 if lossy else 0

    def by(iterations: int | None, per_iteration: int) -> int | None:
        return None if iterations is None else iterations * per_iteration

    return Variant(
        name=name,
        run_id=f"communication-{name}",
        compress=spec.compress,
        spec=spec,
        iterations=ITERATIONS,
        wall_s=250.0,
        final_accuracy=final,
        iterations_to_target=reached,
        wall_to_target_s=None if reached is None else 1.5 * reached,
        update_objects=WORKERS * ITERATIONS,
        update_bytes=WORKERS * ITERATIONS * update,
        update_bytes_to_target=by(reached, WORKERS * update),
        residual_bytes=WORKERS * ITERATIONS * residual,
        residual_bytes_to_target=by(reached, WORKERS * residual),
        worker_usage_bytes_written=WORKERS * ITERATIONS * (update + residual),
        reducer_bytes_read=ITERATIONS * (WORKERS * (update - 32) + 459_000),
        reducer_bytes_read_to_target=by(reached, WORKERS * (update - 32) + 459_000),
        reducer_update_bytes_read=ITERATIONS * WORKERS * (update - 32),
        reducer_update_bytes_read_to_target=by(reached, WORKERS * (update - 32)),
        requests=40_000,
        requests_to_target=by(reached, 270),
        cost_usd=0.25,
        cost_to_target_usd=None if reached is None else 0.0012 * reached,
        accuracy_by_iteration=_accuracy(reached, final),
    )


def _report(**changed: tuple[int, int | None, float]) -> CommunicationReport:
    FIGURES.update(changed)
    try:
        specs = bench_communication.variants(ITERATIONS, WORKERS, 0.2)
        return bench_communication.judge(
            [_variant(name, spec) for name, spec in specs.items()], WORKERS, ITERATIONS, 0.2
        )
    finally:
        FIGURES.update(_SAVED)


_SAVED = dict(FIGURES)


def _rows(drawn: str, table: str) -> dict[str, list[str]]:
    """The rows of the table whose title holds ``table``, by variant."""
    lines = drawn.splitlines()
    start = next(i for i, line in enumerate(lines) if table in line)
    rows = {}
    for line in lines[start:]:
        cells = re.split(r"\s*│\s*", line.strip("│ "))
        if cells[0] in FIGURES and cells[0] not in rows:
            rows[cells[0]] = cells[1:]
        if len(rows) == len(FIGURES):
            break
    return rows


def test_the_verdicts_follow_the_figures() -> None:
    report = _report()
    assert [v.name for v in report.variants] == ["dense", "fp16", "topk", "significance"]
    assert [v.compress for v in report.variants] == ["none", "fp16", "topk:0.01", "significance:0.2"]
    assert all(
        v.spec.workers == 8
        and v.spec.reducers == 2
        and v.spec.global_batch == 128
        and v.spec.eval_every == 1
        and v.spec.iterations == ITERATIONS
        for v in report.variants
    )
    assert [
        (v.spec.optimizer.name, v.spec.optimizer.learning_rate, v.spec.optimizer.momentum) for v in report.variants
    ] == [("adam", 3e-3, 0.0)] * 2 + [("sgd", 0.1, 0.9), ("adam", 3e-3, 0.0)]
    assert report.fp16_ratio == pytest.approx(DENSE_UPDATE / (32 + 2 * 38_282)) and report.fp16_fewer
    assert report.fp16_accuracy_gap == pytest.approx(0.9694 - 0.9721) and report.fp16_close
    assert report.topk_ratio == pytest.approx(40 * DENSE_UPDATE / (70 * (32 + 8 * 384))) and report.topk_fewer
    assert report.topk_best_accuracy == 0.961 and report.topk_best_iteration == ITERATIONS

    wide = _report(fp16=(32 + 2 * 38_282, 41, 0.9660), topk=(32 + 8 * 384, 140, 0.9500))
    assert not wide.fp16_close and wide.fp16_accuracy_gap == pytest.approx(-0.0061)
    assert wide.topk_ratio == pytest.approx(40 * DENSE_UPDATE / (140 * (32 + 8 * 384))) and not wide.topk_fewer
    short = _report(topk=(32 + 8 * 384, None, 0.9400))
    assert short.topk_ratio is None and not short.topk_fewer
    assert short.topk_best_accuracy == 0.94 and short.topk_best_iteration == ITERATIONS


def test_the_tables_and_the_verdict_lines(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    display_bench.print_communication(_report())
    drawn = capsys.readouterr().out
    reaching = _rows(drawn, "to the first model at test accuracy 0.95")
    assert reaching["dense"] == [
        "none",
        "40",
        "60.0",
        "49.0 MB",
        "1.0×",
        "0 B",
        "67.4 MB",
        "49.0 MB",
        "10,800",
        "$0.048",
    ]
    assert reaching["topk"][:6] == ["topk:0.01", "70", "105.0", "1.74 MB", "28.2×", "85.8 MB"]
    total = _rows(drawn, "in total: 150 iterations each")
    assert total["fp16"] == [
        "76.6 kB",
        "91.9 MB",
        "2.0×",
        "184 MB",
        "276 MB",
        "161 MB",
        "91.9 MB",
        "40,000",
        "$0.25",
        "250.0",
        "0.9694",
    ]
    accuracy = _rows(drawn, "test accuracy after iteration")
    assert accuracy["dense"][-2:] == ["0.9721", "0.9721 (150)"] and accuracy["dense"][3] == "0.9550"  # after 50
    assert (
        "fp16: 2.00× fewer update bytes than dense over 150 iterations (at least 1.9×: yes); test accuracy 0.9694"
        " against dense's 0.9721, -0.27 points (within 0.5: yes)" in drawn
    )
    assert (
        "top-k 0.01 with error feedback: 28.2× fewer update bytes than dense to 0.95 (70 iterations against"
        " dense's 40); at least 20×: yes" in drawn
    )
    assert "significance:0.2: 7.7× fewer update bytes than dense over 150 iterations, 6.8× to 0.95" in drawn


def test_top_k_short_of_the_target_shows_how_close(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    report = _report(topk=(32 + 8 * 384, None, 0.9400))
    display_bench.print_communication(report)
    drawn = capsys.readouterr().out
    assert _rows(drawn, "to the first model")["topk"][1:5] == ["–", "–", "–", "–"]
    assert (
        "top-k 0.01 with error feedback: no ratio (top-k did not reach 0.95 within 150 iterations; top-k's best"
        " test accuracy 0.9400 after iteration 150, dense reached 0.95 at iteration 40); at least 20×: no" in drawn
    )
    assert _rows(drawn, "test accuracy after iteration")["topk"][-1] == "0.9400 (150)"


def test_accuracy_checkpoints() -> None:
    assert display_bench.accuracy_checkpoints(150) == [10, 20, 30, 50, 75, 100, 150]
    assert display_bench.accuracy_checkpoints(3) == [1, 2, 3]
