"""A round's progress (``slsml.training.progress``): its record round-trips bit for bit and is stored create-only;
its size is what the plan counts; the pacer hands a round on only once an invocation's time runs short, never
before its first step; and a round of local steps (model averaging, ADMM) handed on after every step, through its
stored bytes, ends bit-identical to the same round in one go."""

from __future__ import annotations

import itertools
from dataclasses import replace

import keras
import numpy as np
import pytest

from slsml.aws.storage import ObjectStore
from slsml.rounds import accumulate
from slsml.rules import admm, averaging
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig
from slsml.spec.errors import BadInputError
from slsml.spec.shardplan import ShardPlan
from slsml.training import evaluation, modelio, optimizers, progress
from slsml.training.progress import Pacer, Progress

ADAM = OptimizerConfig(name="adam", learning_rate=0.01)
KEY = keys.progress("run", 3, 1, 0, 2)


def _progress(size: int = 7) -> Progress:
    rng = np.random.default_rng(5)
    state = optimizers.initial_state(ADAM, size)
    state = {
        name: (rng.normal(size=value.shape).astype(value.dtype) if value.ndim else value + 2)
        for name, value in state.items()
    }
    return Progress(
        2, rng.normal(size=size).astype(np.float32), state, (0.1 + 0.2, 1 / 3), np.array([0.6, 16.0, 12.0, 16.0]), 1.25
    )


def test_progress_round_trips_bit_for_bit_and_its_size_is_the_plans() -> None:
    sent = _progress()
    body = sent.encode()
    got = Progress.decode(body, 7, KEY)
    assert (got.steps, got.losses, got.compute_s) == (sent.steps, sent.losses, 1.25)
    assert got.metrics is not None and sent.metrics is not None and got.metrics.tobytes() == sent.metrics.tobytes()
    assert got.weights.tobytes() == sent.weights.tobytes()
    assert got.state.keys() == sent.state.keys()
    assert all(got.state[k].tobytes() == v.tobytes() and got.state[k].dtype == v.dtype for k, v in sent.state.items())
    assert got.loss == float(np.mean([0.1 + 0.2, 1 / 3]))
    assert progress.stored_bytes(7, 7, ADAM, 2, 4) == len(body)
    untracked = replace(sent, metrics=None)
    assert Progress.decode(untracked.encode(), 7, KEY).metrics is None
    assert progress.stored_bytes(7, 7, ADAM, 2, 0) == len(untracked.encode())


def test_progress_is_stored_create_only(store: ObjectStore) -> None:
    first = _progress().encode()
    assert store.put_new(KEY, first)
    other = Progress(2, np.zeros(7, np.float32), {}, (), None).encode()
    assert not store.put_new(KEY, other)  # a second writer finds it stored: nothing is overwritten
    assert store.get(KEY) == first
    assert keys.is_transient(KEY)  # scratch of its iteration: the lifecycle rule expires it


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"not an archive", "not a round's progress"),
        (Progress(1, np.zeros(5, np.float32), {}, (), None).encode(), "(or none), not (5,) float32"),
        (Progress(1, np.zeros(7, np.float64), {}, (), None).encode(), "(or none), not (7,) float64"),
    ],
)
def test_stored_bytes_that_are_not_a_rounds_progress_are_named(body: bytes, problem: str) -> None:
    with pytest.raises(BadInputError, match=KEY) as error:
        Progress.decode(body, 7, KEY)
    assert problem in str(error.value)


def test_the_pacer_hands_on_only_when_time_runs_short_and_never_before_a_first_step() -> None:
    plenty = Pacer(lambda: 3600.0, 10**6)
    assert not any(plenty.pause() for _ in range(5))
    short = Pacer(lambda: progress.PAUSE_RESERVE_S - 0.01, 0)
    assert [short.pause() for _ in range(3)] == [False, True, True]
    big = Pacer(lambda: progress.PAUSE_RESERVE_S + 1.0, 10**8)  # storing 100 MB at 65 MB/s takes 1.5 s more
    assert [big.pause() for _ in range(2)] == [False, True]


def _trainer() -> tuple[modelio.Trainer, np.ndarray, list[tuple[np.ndarray, np.ndarray, None]]]:
    rng = np.random.default_rng(2)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    plan = ShardPlan.build(modelio.variable_specs(model), 1)
    trainer = modelio.Trainer(model, plan, '"sparse_categorical_crossentropy"')
    x, y = rng.normal(size=(40, 6)).astype(np.float32), rng.integers(0, 3, size=40)
    metrics = evaluation.encode_metrics(["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
    loss = '"sparse_categorical_crossentropy"'
    trainer.meter = evaluation.Evaluator(model, loss, metrics, (x[:2], y[:2])).batch_state
    return (
        trainer,
        modelio.get_flat(model, plan),
        [accumulate.Whole((x[i : i + 8], y[i : i + 8], None)) for i in range(0, 40, 8)],
    )


def _every_step() -> object:
    """A pause that hands the round on after each step (never before an invocation's first)."""
    calls = itertools.count()
    return lambda: next(calls) > 0


@pytest.mark.parametrize("rule", ["average", "admm"])
def test_a_round_handed_on_after_every_step_ends_bit_identical(rule: str) -> None:
    trainer, start, batches = _trainer()
    size = trainer.plan.size

    def run(resumed: Progress | None, left: list, pause) -> object:
        if rule == "average":
            reached, finished = averaging.local_steps(trainer, start, left, ADAM, None, None, resumed, pause)
            return averaging.weight_change(trainer, start, reached) if finished else reached
        before = admm.SlotState(start + 0.01, np.full(size, 0.02, np.float32))
        return admm.local_round(trainer, start, before, left, ADAM, 0.5, resumed, pause)

    whole = run(None, batches, progress.never)
    resumed, invocations = None, 0
    while True:
        invocations += 1
        done = 0 if resumed is None else resumed.steps
        ended = run(resumed, batches[done:], _every_step())
        if not isinstance(ended, Progress):
            break
        resumed = Progress.decode(ended.encode(), size, KEY)  # through its stored bytes
    assert invocations == len(batches)
    whole_update, ended_update = (whole[0], ended[0]) if rule == "admm" else (whole, ended)
    assert ended_update.vector.tobytes() == whole_update.vector.tobytes()
    assert ended_update.loss == whole_update.loss
    assert ended_update.metrics is not None and whole_update.metrics is not None
    assert ended_update.metrics.tobytes() == whole_update.metrics.tobytes()
    if rule == "admm":
        assert ended[1].model.tobytes() == whole[1].model.tobytes()
