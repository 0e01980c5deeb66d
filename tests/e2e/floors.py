"""Every update rule and every compression trains the demo's CNN on digits (4 workers, 2 reducers, Adam 3e-3; ADMM:
its linear model) to a test accuracy no more than a point below what it reached when these floors were set: the
synchronous run and the run on stale weights at the demo's size (global batch 128, 150 iterations), the others on the
same samples in half the rounds (global batch 256, 75 iterations; ADMM 30), as sensitive to what they guard. A change
to what workers send, what the reducers apply, the error feedback or the data order that costs accuracy fails here,
as top-k's fall from 0.97 to 0.92 did not: top-k compressing from the first round, as it did then
(``compress_warmup=0``), reaches 0.8217 at the smaller size, 13 points below its floor's 0.9526. The cases are
split between two test files (dense and sparse updates), which two test processes run at once; the dense file's
synchronous run (``gradient``) is also the reference of the run on weights one round stale (``stale_weights``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import keras

from slsml.client import demo
from slsml.pipeline.services import Services
from slsml.spec.config import TrainingSpec
from slsml.state.records import RunRecord
from slsml.training import modelio

from .conftest import finish, train

DEMO = {"workers": 4, "reducers": 2, "global_batch": 128, "iterations": 150, "eval_every": 0}
AVERAGING = {"algorithm": "average", "local_steps": 2, "local_learning_rate": 0.05}
ADMM = {"algorithm": "admm", "local_steps": 3, "local_learning_rate": 0.2, "admm_rho": 0.5}


def _cnn() -> keras.Model:
    return demo.digits_cnn(learning_rate=3e-3, seed=0)


def _linear() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")])
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    return model


SMALLER = {"global_batch": 256, "iterations": 75}  # the demo's samples in half its rounds
# case → (the run's options beside the demo's, its model, the test accuracy it reached less a point): reached
# 0.9694 and 0.9749 at the demo's size; 0.9777, 0.9526, 0.9721, 0.9304, 0.8384 and 0.9109 at the smaller one (at
# the demo's: 0.9694, 0.9805, 0.9833, 0.9331, 0.9526 and 0.9359; top-k 0.9164 before its warm-up and frozen moments)
CASES: dict[str, tuple[dict[str, Any], Callable[[], keras.Model], float]] = {
    "gradient": ({}, _cnn, 0.959),
    "gradient-stale": ({"stale_weights": 1}, _cnn, 0.964),
    "gradient-fp16": ({**SMALLER, "compress": "fp16"}, _cnn, 0.967),
    "gradient-topk": ({**SMALLER, "compress": "topk:0.01"}, _cnn, 0.942),
    "gradient-significance": ({**SMALLER, "compress": "significance:0.01"}, _cnn, 0.962),
    "average": ({**SMALLER, **AVERAGING}, _cnn, 0.920),
    "average-topk": ({**SMALLER, **AVERAGING, "compress": "topk:0.01"}, _cnn, 0.828),
    "admm": ({**SMALLER, **ADMM, "iterations": 30}, _linear, 0.900),
}
SPARSE = ("gradient-topk", "gradient-significance", "average-topk")  # the others: dense


def completed(services: Services, cases: Iterable[str]) -> dict[str, RunRecord]:
    """The run of each of ``cases`` (``floor-<case>``), trained at once (a run mostly waits on the pipeline), once
    it completed."""
    cases = tuple(cases)
    for case in cases:
        options, model, _ = CASES[case]
        train(services, TrainingSpec(**{**DEMO, **options}), f"floor-{case}", modelio.save_model(model()))
    ended = {}
    for case in cases:
        ended[case] = finish(services, f"floor-{case}", timeout_s=900)
        assert ended[case].status == "COMPLETED", f"{case}: {ended[case].reason}"
    return ended


def check_floor(ended: dict[str, RunRecord], case: str) -> None:
    reached, floor = ended[case].test_accuracy, CASES[case][2]
    assert reached is not None and reached >= floor, f"{case}: {reached} < {floor}"
