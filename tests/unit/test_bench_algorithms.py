"""`slsml bench algorithms` draws its report: a row per variant, to the target and over the sample budget, and
the two verdicts. (The benchmark itself takes minutes: it is not run here.)"""

from __future__ import annotations

import re

import pytest

from slsml.bench import algorithms as bench_algorithms
from slsml.bench.algorithms import AlgorithmsReport, Variant
from slsml.cli import display_bench
from slsml.client.runs import FleetChange

# name → (rounds to the target, seconds to it, fleet): averaging K=16 is fast, the tuner near the fastest fixed W
FIGURES: dict[str, tuple[int | None, float | None, list[int]]] = {
    "gradient-w2": (60, 90.0, [2]),
    "gradient-w4": (60, 80.0, [4]),
    "gradient-w8": (60, 100.0, [8]),
    "gradient-auto": (62, 88.0, [2, 3, 2]),
    "average-k4": (None, None, [4]),
    "average-k16": (5, 12.0, [4]),
}


def _report() -> AlgorithmsReport:
    variants = []
    for name, (description, spec) in bench_algorithms.variants().items():
        rounds, seconds, fleet = FIGURES[name]
        reached = rounds is not None
        variants.append(
            Variant(
                name=name,
                description=description,
                spec=spec,
                rounds=spec.iterations,
                fleet=[
                    FleetChange(iteration=3 * i, workers=w, reason="tuner (time): …" if i else None)
                    for i, w in enumerate(fleet)
                ],
                wall_s=150.0,
                requests=12_345,
                cost_usd=0.0123,
                final_accuracy=0.97123,
                rounds_to_target=rounds,
                wall_to_target_s=seconds,
                requests_to_target=6_000 if reached else None,
                cost_to_target_usd=0.006 if reached else None,
                accuracy_by_round=[0.5, 0.96],
            )
        )
    return AlgorithmsReport(
        global_batch=128,
        sample_budget=19_200,
        target=0.95,
        variants=variants,
        averaging_ratio=12.0 / 80.0,
        averaging_fast=True,
        tuned_ratio=88.0 / 80.0,
        tuned_close=True,
    )


def test_a_row_per_variant_and_the_verdicts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    display_bench.print_algorithms(_report())
    drawn = capsys.readouterr().out
    rows: dict[str, list[str]] = {}  # variant → its cells to the target, then over the budget
    for line in drawn.splitlines():
        if (cells := re.split(r"\s*│\s*", line.strip("│ ")))[0] in FIGURES:
            rows.setdefault(cells[0], []).extend(cells[1:])
    assert rows["gradient-auto"] == [
        "62",
        "88.0",
        "6,000",
        "$0.006",
        "2→3→2",
        "150",
        "0.9712",
        "150.0",
        "12,345",
        "$0.0123",
    ]
    assert rows["average-k4"][:4] == ["–"] * 4 and rows["average-k4"][5] == "37"  # 19,200 samples / (128 × 4)
    assert rows["average-k16"][:2] == ["5", "12.0"] and rows["average-k16"][5] == "9"
    assert rows["gradient-w8"][4] == "8"
    assert "model averaging, K=16, against gradient averaging, W=4: 0.15× the time to 0.95; at most 1/4: yes" in drawn
    assert "workers auto against the fastest fixed W (gradient-w4): 1.10× the time to 0.95; within 15%: yes" in drawn


def test_a_verdict_without_the_figures_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    report = _report()
    for v in report.variants:
        v.wall_to_target_s = None
    display_bench.print_algorithms(
        report.model_copy(
            update={"averaging_ratio": None, "averaging_fast": False, "tuned_ratio": None, "tuned_close": False}
        )
    )
    drawn = capsys.readouterr().out
    assert "W=4: no ratio (not both reached 0.95); at most 1/4: no" in drawn
    assert "fastest fixed W (none reached it): no ratio (not both reached 0.95); within 15%: no" in drawn
