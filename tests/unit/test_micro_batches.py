"""A worker's step in micro-batches (``slsml.rounds``): its gradient, loss and metrics equal the whole batch's; a
BatchNormalization model sees each micro-batch alone, as a replica under ``tf.distribute``; a round handed on after
every micro-batch, through its stored bytes, ends bit-identical; the stream reads ahead a bounded number of
micro-batches; and the micro-batch the sizing picks is the largest whose step fits the memory."""

from __future__ import annotations

import itertools
import threading
import time

import keras
import numpy as np
import pytest

from slsml.rounds import accumulate, sizing, stream
from slsml.rules import averaging, gradient
from slsml.rules.base import Round
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.shardplan import ShardPlan
from slsml.training import evaluation, modelio, progress
from slsml.training.progress import Progress

KEY = keys.progress("run", 0, 0, 0, 1)
SAMPLES = 23  # micro-batches of 5: 5, 5, 5, 4, 4 (uneven)


def _trainer(batch_norm: bool = False) -> modelio.Trainer:
    keras.utils.set_random_seed(3)
    layers = [
        keras.Input((6,)),
        keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01)),
        *([keras.layers.BatchNormalization()] if batch_norm else []),
        keras.layers.Dense(3, activation="softmax"),
    ]
    model = keras.Sequential(layers)
    plan = ShardPlan.build(modelio.variable_specs(model), 2)
    loss = '"sparse_categorical_crossentropy"'
    trainer = modelio.Trainer(model, plan, loss)
    x, y, _ = _data()
    metrics = evaluation.encode_metrics(["accuracy"])
    trainer.meter = evaluation.Evaluator(model, loss, metrics, (x[:2], y[:2])).batch_state
    return trainer


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(SAMPLES, 6)).astype(np.float32)
    return x, rng.integers(0, 3, SAMPLES), rng.uniform(0.5, 2.0, SAMPLES).astype(np.float32)


def _stream(micro_batch: int, skip: int = 0, steps: int = 1) -> stream.Stream:
    x, y, w = _data()
    return stream.Stream(lambda i: (x[i], y[i], w[i]), [np.arange(SAMPLES)] * steps, micro_batch, skip)


def test_micro_batch_sizes_are_even_and_within_the_micro_batch() -> None:
    for samples, micro in itertools.product(range(1, 40), range(1, 12)):
        found = accumulate.sizes(samples, micro)
        assert sum(found) == samples and max(found) <= micro
        assert len(found) == -(-samples // micro) and max(found) - min(found) <= 1


def test_a_step_in_uneven_micro_batches_equals_the_whole_batch() -> None:
    trainer = _trainer()
    x, y, w = _data()
    whole = trainer.compute_update(x, y, w)
    with _stream(5) as parts:
        assert len(parts.steps[0]) == 5
        split = accumulate.step_update(trainer, parts.steps[0])
    assert not isinstance(split, progress.Partial)
    np.testing.assert_allclose(split.vector, whole.vector, rtol=1e-5, atol=1e-7)
    assert split.loss == pytest.approx(whole.loss, rel=1e-6)  # the sample weights and the L2 term included
    assert split.metrics is not None and whole.metrics is not None
    np.testing.assert_allclose(split.metrics, whole.metrics, rtol=1e-6)


def test_batch_normalization_sees_each_micro_batch_alone() -> None:
    """Each micro-batch's forward pass normalizes by its own statistics from the same moving averages, and the
    step's moving averages are the micro-batches' averaged by their samples: what replicas under tf.distribute
    compute without synchronized batch statistics, and not the whole batch's."""
    trainer = _trainer(batch_norm=True)
    start = modelio.get_flat(trainer.model, trainer.plan)
    x, y, w = _data()
    sizes = accumulate.sizes(SAMPLES, 5)
    expected = np.zeros(trainer.plan.size)
    for first, size in zip(itertools.accumulate([0, *sizes]), sizes, strict=False):
        modelio.set_flat(trainer.model, trainer.plan, start)
        alone = trainer.compute_update(x[first : first + size], y[first : first + size], w[first : first + size])
        expected += size / SAMPLES * alone.vector
    modelio.set_flat(trainer.model, trainer.plan, start)
    whole = trainer.compute_update(x, y, w)
    modelio.set_flat(trainer.model, trainer.plan, start)
    with _stream(5) as parts:
        split = accumulate.step_update(trainer, parts.steps[0])
    assert not isinstance(split, progress.Partial)
    np.testing.assert_allclose(split.vector, expected, rtol=1e-5, atol=1e-7)
    untrained = ~trainer.plan.trainable_mask()
    assert not np.allclose(split.vector[untrained], start[untrained])  # the moving averages moved
    assert not np.allclose(split.vector, whole.vector, rtol=1e-3)  # batch statistics of micro-batches, not the batch's


def _every_micro_batch() -> object:
    """A pause that hands the round on before each micro-batch but an invocation's first."""
    calls = itertools.count()
    return lambda: next(calls) > 0


@pytest.mark.parametrize("rule", ["gradient", "average"])
def test_a_round_handed_on_after_every_micro_batch_ends_bit_identical(rule: str) -> None:
    steps = 1 if rule == "gradient" else 3
    spec = TrainingSpec() if rule == "gradient" else TrainingSpec(algorithm=rule, local_steps=steps)
    trainer = _trainer(batch_norm=True)
    start = modelio.get_flat(trainer.model, trainer.plan)

    def run(resumed: Progress | None, pause: object) -> object:
        modelio.set_flat(trainer.model, trainer.plan, start)
        done = 0 if resumed is None else resumed.steps
        with _stream(5, 0 if resumed is None else resumed.micro_batches, steps - done) as parts:
            if rule == "gradient":
                work = Round(trainer, start, parts.steps, spec, None, resumed, pause)  # type: ignore[arg-type]
                return gradient.RULE.round(work)
            adam = OptimizerConfig(name="adam", learning_rate=0.01)
            reached, finished = averaging.local_steps(trainer, start, parts.steps, adam, None, None, resumed, pause)
            return averaging.weight_change(trainer, start, reached) if finished else reached

    whole = run(None, progress.never)
    resumed, invocations = None, 0
    while True:
        invocations += 1
        ended = run(resumed, _every_micro_batch())
        if not isinstance(ended, Progress):
            break
        resumed = Progress.decode(ended.encode(), trainer.plan.size, KEY)  # through its stored bytes
        assert resumed.partial is not None or rule == "average"
    assert invocations == 5 * steps  # one micro-batch an invocation
    assert ended.vector.tobytes() == whole.vector.tobytes()
    assert ended.loss == whole.loss
    assert ended.metrics.tobytes() == whole.metrics.tobytes()


def test_the_stream_reads_a_bounded_number_of_micro_batches_ahead_in_order() -> None:
    lock, reading, most, seen = threading.Lock(), [0], [0], []

    def read(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
        with lock:
            reading[0] += 1
            most[0] = max(most[0], reading[0])
        time.sleep(0.01)
        with lock:
            reading[0] -= 1
        return indices, indices, None

    with stream.Stream(read, [np.arange(40), np.arange(40, 70)], 7) as parts:
        time.sleep(0.1)  # nothing is taken: only the first micro-batches are read
        for step in parts.steps:
            seen.extend(int(i) for batch in step for i in batch[0])
        timing = parts.timing()
    assert seen == list(range(70))
    assert most[0] <= stream.AHEAD
    assert timing.micro_batches == 6 + 5 and timing.read_s >= 11 * 0.01


def test_the_sized_micro_batch_is_the_largest_that_fits() -> None:
    memory = sizing.WorkerMemory(3008, 1504, 4 * 23_600_000, sizing.sample_bytes(_resnet()))
    fitting = memory.micro_batch()
    assert fitting >= 1
    assert memory.needed_mb(fitting, 2) <= 3008 < memory.needed_mb(fitting + 1, 2)
    assert sizing.WorkerMemory(1600, 800, 4 * 23_600_000, memory.sample_bytes).refusal() is not None


def _resnet() -> keras.Model:
    return keras.applications.ResNet50(weights=None, input_shape=(96, 96, 3), classes=10)
