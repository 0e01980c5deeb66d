"""ADMM (``slsml.rules.admm``): its rounds reach the optimum of the whole objective where model averaging's fixed point
lies off it; the models it applies to; its slot state's checks; each worker's own partition of the data; and the
``bench admm`` verdict and report."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest

from slsml.bench import admm as bench_admm
from slsml.bench.algorithms import Variant
from slsml.cli import display_bench
from slsml.data import datasets as data
from slsml.pipeline.services import Services
from slsml.pipeline.steps.common import load_weights
from slsml.rounds.accumulate import Whole
from slsml.rules import admm
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.errors import BadInputError, RunFailed
from slsml.spec.shardplan import ShardPlan
from slsml.training import modelio, optimizers, updates

from . import cloud

WORKERS = 4


def _problem() -> tuple[modelio.Trainer, np.ndarray, np.ndarray, np.ndarray]:
    """An L2-regularized logistic regression (strongly convex) on 160 synthetic samples, sorted by label so that
    each worker's partition holds mostly one class: (trainer, initial flat weights, x, y)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(160, 5)).astype(np.float32)
    y = (x @ np.array([1.5, -2.0, 0.5, 1.0, 0.0]) + 0.3 * rng.normal(size=160) > 0).astype(np.int64)
    order = np.argsort(y, kind="stable")
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(2, activation="softmax", kernel_regularizer=keras.regularizers.L2(0.02))]
    )
    plan = ShardPlan.build(modelio.variable_specs(model), 1)
    trainer = modelio.Trainer(model, plan, '"sparse_categorical_crossentropy"')
    return trainer, modelio.get_flat(model, plan), x[order], y[order]


def _optimum(trainer: modelio.Trainer, start: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The minimizer of the whole objective: full-batch gradient descent until its steps vanish."""
    weights = start.copy()
    for _ in range(3000):
        modelio.set_flat(trainer.model, trainer.plan, weights)
        step = 0.5 * trainer.compute_update(x, y).vector
        weights -= step
        if np.abs(step).max() < 1e-7:
            break
    return weights


def _rounds(
    trainer: modelio.Trainer, start: np.ndarray, x: np.ndarray, y: np.ndarray, rounds: int, keep_state: bool
) -> np.ndarray:
    """``rounds`` rounds of W workers, each on its contiguous quarter, 10 full-partition local steps a round; the
    consensus is the mean of what they send applied as the reducers do (SGD at rate 1). Without ``keep_state``
    every round starts fresh: local models from the consensus, no dual (model averaging with a proximal term)."""
    local = OptimizerConfig(name="sgd", learning_rate=0.5)
    parts = np.array_split(np.arange(len(x)), WORKERS)
    consensus, states = start.copy(), [None] * WORKERS
    for _ in range(rounds):
        sent = []
        for worker, part in enumerate(parts):
            update, state = admm.local_round(
                trainer,
                consensus,
                states[worker] if keep_state else None,
                [Whole((x[part], y[part], None))] * 10,
                local,
                rho=0.1,
            )
            states[worker] = state
            sent.append(update.vector)
        consensus, _ = optimizers.apply(
            OptimizerConfig(name="sgd", learning_rate=1.0),
            consensus,
            np.mean(sent, axis=0),
            {"step": np.zeros((), dtype=np.int64)},
        )
    return consensus


def test_admm_reaches_the_optimum_of_the_whole_objective_where_model_averaging_stops_short() -> None:
    trainer, start, x, y = _problem()
    optimum = _optimum(trainer, start, x, y)
    admm_error = np.linalg.norm(_rounds(trainer, start, x, y, 50, keep_state=True) - optimum)
    averaging_error = np.linalg.norm(_rounds(trainer, start, x, y, 50, keep_state=False) - optimum)
    assert admm_error < 2e-3 * np.linalg.norm(optimum), (admm_error, np.linalg.norm(optimum))
    assert averaging_error > 20 * admm_error, (averaging_error, admm_error)
    print(f"distance to the optimum after 50 rounds: ADMM {admm_error:.2e}, model averaging {averaging_error:.2e}")


def test_a_slot_sends_the_consensus_less_its_model_and_dual_and_its_dual_steps_by_the_new_consensus() -> None:
    trainer, start, x, y = _problem()
    before = admm.SlotState(start + 0.1, np.full_like(start, 0.05))
    consensus = start + 0.02
    update, state = admm.local_round(
        trainer, consensus, before, [Whole((x[:8], y[:8], None))], OptimizerConfig(name="sgd"), rho=1.0
    )
    np.testing.assert_allclose(state.dual, before.dual + before.model - consensus, atol=1e-7)
    np.testing.assert_allclose(update.vector, consensus - state.model - state.dual, atol=1e-7)
    assert not np.allclose(state.model, before.model)  # it stepped


def test_models_with_hidden_layers_or_a_nonconvex_output_are_refused_with_the_reason() -> None:
    admm.check_model(bench_admm.logistic_regression())
    admm.check_model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))  # linear SVM / regression
    hidden = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu", name="hidden"),
            keras.layers.Dense(2, activation="softmax", name="out"),
        ]
    )
    with pytest.raises(
        BadInputError,
        match=r"without hidden layers .* 2 layers with weights: hidden \(Dense\),"
        r" out \(Dense\)",
    ):
        admm.check_model(hidden)
    with pytest.raises(BadInputError, match="activation relu is not one of linear, sigmoid, softmax"):
        admm.check_model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="relu")]))
    with pytest.raises(BadInputError, match=r"single Dense layer .* conv \(Conv1D\)"):
        admm.check_model(keras.Sequential([keras.Input((4, 1)), keras.layers.Conv1D(2, 4, name="conv")]))


def test_a_slot_state_that_does_not_fit_the_model_is_refused_naming_it() -> None:
    state = admm.SlotState(np.ones(6, dtype=np.float32), np.zeros(6, dtype=np.float32))
    decoded = admm.SlotState.decode(state.encode(), 6, "k")
    np.testing.assert_array_equal(decoded.model, state.model)
    with pytest.raises(BadInputError, match=r"^runs/r/x\.npz: an ADMM slot state holds a model and a dual of 7"):
        admm.SlotState.decode(state.encode(), 7, "runs/r/x.npz")
    with pytest.raises(BadInputError, match=r"^runs/r/x\.npz: not an ADMM slot state"):
        admm.SlotState.decode(b"garbage", 6, "runs/r/x.npz")
    half = admm.SlotState(np.ones(6, dtype=np.float16), np.zeros(6, dtype=np.float16))
    with pytest.raises(BadInputError, match="float32"):
        admm.SlotState.decode(half.encode(), 6, "k")


def test_the_worker_goes_on_from_its_slot_state_and_fails_the_run_on_one_that_does_not_fit(
    services: Services,
) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    config = cloud.register_run(services, modelio.save_model(model), "admm", algorithm="admm", local_steps=2)
    store, size = services.store, config.plan.size
    for iteration in range(2):
        cloud.work(services, "admm", iteration, 0)
    state = admm.SlotState.decode(store.get(keys.local_state("admm", 1, 0)), size, "s")
    sent = updates.decode(store.get(keys.update("admm", 1, 0)), "weight change", config.plan)[0]
    consensus = load_weights(store, config, 0)  # round 1's model is round 0's here (see _work)
    np.testing.assert_allclose(sent, consensus - state.model - state.dual, atol=1e-6)
    assert np.abs(state.dual).max() > 0  # round 1's dual stepped from round 0's model

    wrong = keys.local_state("admm", 0, 1)
    body = admm.SlotState(np.zeros(size - 1, np.float32), np.zeros(size - 1, np.float32)).encode()
    # stored as the pipeline stores it (signed: slsml.pipeline.signed), so that what is checked is its shape
    store.put_new(wrong, body, services.keys.sign_object("admm", wrong, body))
    with pytest.raises(RunFailed, match=f"{wrong}: an ADMM slot state holds a model and a dual of {size} float32"):
        cloud.work(services, "admm", 1, 1)
    assert not store.exists(keys.update("admm", 1, 1)) and not store.exists(keys.local_state("admm", 1, 1))


def test_each_worker_keeps_its_own_partition_and_goes_through_it_epoch_by_epoch() -> None:
    count, batch, workers = 103, 16, 4
    seen = {w: [data.partition_batch(count, batch, 7, workers, w, n) for n in range(12)] for w in range(workers)}
    partitions = [set(np.concatenate(batches)) for batches in seen.values()]
    assert sum(len(p) for p in partitions) == len(set().union(*partitions))  # disjoint
    for worker, batches in seen.items():
        assert all(len(b) == 4 for b in batches)  # the worker's share of the global batch
        per_epoch = len(partitions[worker]) // 4  # 25 or 26 samples: 6 batches an epoch
        first_epoch = np.concatenate(batches[:per_epoch])
        assert len(set(first_epoch)) == len(first_epoch)  # no sample twice within an epoch
    spec = TrainingSpec(workers=workers, global_batch=batch, algorithm="admm", local_steps=3, iterations=5, seed=7)
    assert [b.tolist() for b in data.round_batches(spec, count, workers, 2, 1)] == [
        b.tolist() for b in seen[2][3:6]
    ]  # round 1: the worker's batches 3, 4, 5


def _variant(name: str, curve: list[float | None]) -> Variant:
    description, spec = bench_admm.variants()[name]
    return Variant(
        name=name,
        description=description,
        spec=spec,
        rounds=len(curve),
        fleet=[],
        wall_s=9.5,
        requests=1_234,
        cost_usd=0.001,
        final_accuracy=curve[-1],
        rounds_to_target=None,
        wall_to_target_s=None,
        requests_to_target=None,
        cost_to_target_usd=None,
        accuracy_by_round=curve,
    )


@pytest.mark.parametrize(
    ("admm_curve", "rounds", "fewer"),
    [
        ([0.90, 0.955, 0.97, 0.97], 2, True),  # 0.955 is within a point of 0.96: round 2 of gradient's 6
        ([0.90, 0.94, 0.94, 0.951], 4, False),  # round 4: more than a third of 6
        ([0.90, 0.94, 0.94, 0.94], None, False),
    ],
)
def test_the_verdict_counts_admm_rounds_to_gradient_averaging_s_accuracy_less_a_point(
    admm_curve: list[float],
    rounds: int | None,
    fewer: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    gradient = [0.5, 0.8, 0.9, 0.95, None, 0.96, 0.95, 0.96]  # reaches its final 0.96 at round 6
    report = bench_admm.judge([_variant("gradient", gradient), _variant("admm", admm_curve)])
    assert (report.target, report.gradient_rounds, report.admm_rounds, report.admm_fewer) == (0.96, 6, rounds, fewer)
    monkeypatch.setenv("COLUMNS", "200")
    display_bench.print_admm(report)
    drawn = capsys.readouterr().out
    rows = {
        cells[0]: cells[1:]
        for line in drawn.splitlines()
        if (cells := re.split(r"\s*│\s*", line.strip("│ ")))[0] in ("gradient", "admm")
    }
    assert rows["gradient"][:3] == ["8", "0.9600", "6"]
    assert rows["admm"][2] == (str(rounds) if rounds else "–")
    assert f"at most 1/3: {'yes' if fewer else 'no'}" in drawn
