"""bench stages on a small model: its step in one bigger function and in pipeline stages, side by side, each
stage timed, the round priced as the plan prices it, and the stages' gradient equal to the whole model's."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import pytest

from slsml.cli.main import main
from slsml.cost import stages as staged
from slsml.cost.parameters import Parameters


def test_stages_and_one_bigger_function_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), *(keras.layers.Dense(256, activation="relu") for _ in range(4)), keras.layers.Dense(5)]
    )
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    path = tmp_path / "chain.keras"
    model.save(path)
    argv = ["bench", "stages", "--model", str(path), "--stages", "3", "--batch", "64", "--micro-batch", "16"]
    assert main([*argv, "--repeats", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    bigger, stages = report["cases"]
    assert (bigger["name"], bigger["functions"], stages["name"], stages["functions"]) == (
        "one bigger function",
        1,
        "3 stages",
        3,
    )
    assert len(report["split"]) == 3 and len(stages["per_stage_s"]) == 3 and len(bigger["per_stage_s"]) == 1
    assert stages["measured_step_s"] == pytest.approx(sum(stages["per_stage_s"]))
    assert report["max_gradient_difference"] <= 1e-6 * report["gradient_scale"]
    for case in (bigger, stages):
        assert case["round_s"] > 0 and case["ms_per_sample"] == pytest.approx(1000 * case["round_s"] / 64)
        assert case["dollars_per_million_samples"] == pytest.approx(case["dollars_per_round"] / 64 * 1e6)
    # the pipeline's round: M + S − 1 slots each way of its slowest stage and a hop, past the weights' reads
    p = Parameters()
    assert stages["round_s"] > (4 + 3 - 1) * 2 * staged.hop_seconds(p, 16 * 256 * 4, 3)
