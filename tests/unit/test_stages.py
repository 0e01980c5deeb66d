"""Pipeline stages: a model's cut points, its stage sub-models, the step computed stage by stage (GPipe with
re-materialization) against the whole model's gradients, and the split balancing compute within memory."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from slsml.cost.stages import blocks_of
from slsml.rounds import sizing
from slsml.rounds.stages import Block, balance, bubble
from slsml.spec.errors import BadInputError
from slsml.training import stages


def _sequential() -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01)),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(7, activation="tanh"),
            keras.layers.Dense(5, activation="relu"),
            keras.layers.Dense(3),
        ],
        name="chain",
    )


def _residual_chain() -> keras.Model:
    """A functional chain with a residual block inside: cut points only around it."""
    keras.utils.set_random_seed(4)
    x = keras.Input((6,))
    h = keras.layers.Dense(8, activation="relu", name="d1")(x)
    r = keras.layers.Dense(8, activation="relu", name="r1")(h)
    r = keras.layers.Dense(8, name="r2")(r)
    h = keras.layers.Add(name="add")([h, r])
    h = keras.layers.Dense(5, activation="relu", name="d2")(h)
    return keras.Model(x, keras.layers.Dense(3, name="out")(h), name="residual")


def _skip_over_all() -> keras.Model:
    """A skip connection from the input across every boundary."""
    x = keras.Input((6,))
    h = keras.layers.Dense(6, name="a")(x)
    h = keras.layers.Dense(6, name="b")(h)
    return keras.Model(x, keras.layers.Add(name="skip")([x, h]), name="skipping")


def _whole_gradients(model: keras.Model, loss_fn, x, y) -> tuple[float, list[np.ndarray]]:
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True)) + tf.add_n(model.losses or [tf.constant(0.0)])
    return float(loss), [np.asarray(g) for g in tape.gradient(loss, model.trainable_weights)]


def _data(samples: int = 12) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(samples, 6)).astype(np.float32), rng.integers(0, 3, samples)


def test_cut_points_of_a_sequential_model_and_of_a_functional_chain() -> None:
    assert stages.cut_points(_sequential()) == [1, 2, 3, 4]  # every boundary of five layers
    residual = stages.cut_points(_residual_chain())
    names = [n.operation.name for n in stages.graph(_residual_chain()).nodes]
    assert [names[p - 1] for p in residual] == ["d1", "add", "d2"]  # not inside the residual block (r1, r2)


@pytest.mark.parametrize("build", [_sequential, _residual_chain])
def test_stage_gradients_equal_the_whole_models(build) -> None:
    model = build()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _data()
    untrained = [np.asarray(v.numpy()) for v in model.non_trainable_weights]
    whole_loss, whole = _whole_gradients(model, loss_fn, x, y)
    for v, value in zip(model.non_trainable_weights, untrained, strict=True):  # the step starts from the same
        v.assign(value)
    count = len(stages.cut_points(model)) + 1
    parts = stages.split(model, [1] * count)
    assert len(parts) == count >= 3
    staged = stages.step(parts, loss_fn, [(x, y)])
    flat = [g for each in staged.gradients for g in each]
    assert len(flat) == len(whole)
    for got, want in zip(flat, whole, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert staged.loss == pytest.approx(whole_loss, rel=1e-5)


def test_micro_batched_stages_train_to_the_weights_of_single_process_tensorflow() -> None:
    """Three SGD steps of a batch of 12 in 3 micro-batches through 3 stages end at the weights of the same steps
    on the whole model in one process (BatchNormalization's moving statistics averaged over the micro-batches)."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _data()
    reference, staged_model = _sequential(), _sequential()
    parts = stages.split(staged_model, [2, 2, 1])
    rate = 0.1
    for _ in range(3):
        start = [np.asarray(v.numpy()) for v in reference.non_trainable_weights]
        total = [np.zeros(v.shape) for v in reference.trainable_weights]
        moving = [np.zeros(v.shape) for v in reference.non_trainable_weights]
        for part in np.split(np.arange(12), 3):  # micro-batches in one process, as accumulate adds them
            for v, value in zip(reference.non_trainable_weights, start, strict=True):
                v.assign(value)
            _, grads = _whole_gradients(reference, loss_fn, x[part], y[part])
            total = [t + g / 3 for t, g in zip(total, grads, strict=True)]
            moving = [
                m + np.asarray(v.numpy()) / 3 for m, v in zip(moving, reference.non_trainable_weights, strict=True)
            ]
        for v, g in zip(reference.trainable_weights, total, strict=True):
            v.assign(v.numpy() - rate * g)
        for v, m in zip(reference.non_trainable_weights, moving, strict=True):
            v.assign(m)
        done = stages.step(parts, loss_fn, [(x[p], y[p]) for p in np.split(np.arange(12), 3)])
        weights = [v for part in parts for v in part.trainable_weights]
        for v, g in zip(weights, [g for each in done.gradients for g in each], strict=True):
            v.assign(v.numpy() - rate * g)
    for got, want in zip(staged_model.weights, reference.weights, strict=True):
        np.testing.assert_allclose(np.asarray(got.numpy()), np.asarray(want.numpy()), atol=1e-5)


def test_a_model_with_a_skip_across_every_cut_is_refused_naming_the_layer() -> None:
    model = _skip_over_all()
    assert stages.cut_points(model) == []
    with pytest.raises(BadInputError, match=r"layer 'skip' takes the output of 'the input' across every boundary"):
        stages.split(model, [1, 1])
    assert stages.refusal(model, 1) is None


def test_a_model_of_one_layer_is_refused_naming_it() -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="only")])
    assert stages.refusal(model, 2) == (
        f"--pipeline-stages 2: model {model.name!r} can be cut at 0 layer boundaries, into 1 stage at most: its one"
        " layer, 'only', has no boundary to cut at; train it in one stage (--pipeline-stages 1)"
    )


def test_more_stages_than_blocks_are_refused_with_the_most_that_fit() -> None:
    why = stages.refusal(_residual_chain(), 5)
    assert why is not None and "into 4 stages at most" in why and "layer 'add' takes the output of 'd1'" in why


def test_blocks_count_each_blocks_weights_outputs_and_flops() -> None:
    model = _residual_chain()
    found = blocks_of(model)
    assert [(b.first, b.last) for b in found] == [("d1", "d1"), ("r1", "add"), ("d2", "d2"), ("out", "out")]
    assert sum(b.weight_bytes for b in found) == 4 * model.count_params()
    assert found[1].outputs == (8, 8, 8) and found[1].input_values == 8
    # a Dense layer's training step: forward and backward multiply-adds grow with its weights
    assert found[1].flops > found[0].flops > found[2].flops > found[3].flops > 0


def _block(flops: int, weight_mb: float, name: str) -> Block:
    return Block(name, name, int(weight_mb * sizing.MB), (1000,), 1000, flops)


def test_balance_evens_compute_and_keeps_each_stage_within_memory() -> None:
    blocks = [_block(f, 10, str(i)) for i, f in enumerate([4, 1, 1, 1, 1, 4])]
    even = balance(blocks, 2, lambda stage: True)
    assert even is not None and [len(s.blocks) for s in even] == [3, 3]  # 6 and 6
    three = balance(blocks, 3, lambda stage: True)
    assert three is not None and max(s.flops for s in three) == 4
    small = balance(blocks, 2, lambda stage: stage.weight_bytes <= 20 * sizing.MB)  # two blocks a stage at most
    assert small is None
    fitting = balance(blocks, 3, lambda stage: stage.weight_bytes <= 20 * sizing.MB)
    assert fitting is not None and [len(s.blocks) for s in fitting] == [2, 2, 2]


def test_bubble_is_the_pipelines_fill_and_drain() -> None:
    assert bubble(1, 8) == 0
    assert bubble(4, 8) == pytest.approx(3 / 11)
    assert bubble(4, 32) < bubble(4, 8)


def test_dropout_draws_the_same_masks_through_stages_as_in_one_process() -> None:
    """The forward pass computed again at the backward pass starts from the seed state of the forward pass: the
    stages' gradient is the whole model's, its micro-batches drawing the same masks as in one process."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.5, seed=1),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.5, seed=2),
            keras.layers.Dense(3),
        ]
    )
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _data()
    seeds = [np.asarray(v.numpy()) for v in model.non_trainable_variables]  # the Dropouts' generators
    assert seeds
    whole = [np.zeros(v.shape) for v in model.trainable_weights]
    for part in np.split(np.arange(12), 2):  # as accumulate adds micro-batches: the generators go on
        _, grads = _whole_gradients(model, loss_fn, x[part], y[part])
        whole = [w + g / 2 for w, g in zip(whole, grads, strict=True)]
    for v, value in zip(model.non_trainable_variables, seeds, strict=True):
        v.assign(value)
    staged = stages.step(stages.split(model, [2, 2, 1]), loss_fn, [(x[p], y[p]) for p in np.split(np.arange(12), 2)])
    flat = [g for each in staged.gradients for g in each]
    with tf.GradientTape() as tape:  # without dropout: another gradient (the masks act)
        plain = tape.gradient(loss_fn(y, model(x, training=False)), model.trainable_weights)
    assert not np.allclose(np.asarray(plain[0]), whole[0], atol=1e-4)
    for got, want in zip(flat, whole, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _dropping() -> keras.Model:
    """Dropout, BatchNormalization and a regularizer: each stage carries random generators and moving statistics."""
    keras.utils.set_random_seed(6)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01)),
            keras.layers.Dropout(0.5, seed=1),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.3, seed=2),
            keras.layers.Dense(3),
        ]
    )


def _gpipe(handed_on: bool) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """A step of 12 samples in 4 micro-batches through 3 stages of ``_dropping`` in a pipeline's order (every forward
    pass, then every backward pass), each stage's runner, where ``handed_on``, saved after every pass, its state
    stored as a stage's progress is and restored into a runner of a model built afresh (another invocation's); each
    stage's gradient and new non-trainable values."""
    from slsml.pipeline.staged import Reached

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = _data()
    micro = np.split(np.arange(12), 4)

    def runner(stage: int, saved: dict[str, np.ndarray] | None = None) -> stages.StageRunner:
        made = stages.StageRunner(stages.split(_dropping(), [2, 2, 2])[stage], last=stage == 2)
        if saved is not None:
            made.restore(Reached.decode(Reached(0, saved, None, 0.0).encode()).runner)
        return made

    runners = [runner(stage) for stage in range(3)]

    def unit(stage: int, run) -> np.ndarray | None:
        done = run(runners[stage])
        if handed_on:
            runners[stage] = runner(stage, runners[stage].saved())
        return None if done is None else np.asarray(done)

    inputs = [[x[m] for m in micro]]
    for stage in range(2):
        inputs.append([unit(stage, lambda r, n=n, s=stage: r.forward(n, inputs[s][n], 0.25)) for n in range(4)])
    for n, m in enumerate(micro):
        gradient = unit(2, lambda r, n=n, m=m: r.backward(n, inputs[2][n], 0.25, lambda out, m=m: loss_fn(y[m], out)))
        for stage in (1, 0):
            gradient = unit(
                stage, lambda r, n=n, s=stage, g=gradient: r.backward(n, inputs[s][n], 0.25, stages.handed_back(g))
            )
    return [r.finish() for r in runners]


def test_a_stage_handed_on_after_every_pass_ends_bit_identical_to_one_that_was_not() -> None:
    whole, handed = _gpipe(handed_on=False), _gpipe(handed_on=True)
    for (gradients, untrained), (got_gradients, got_untrained) in zip(whole, handed, strict=True):
        for want, got in zip([*gradients, *untrained], [*got_gradients, *got_untrained], strict=True):
            assert got.tobytes() == want.tobytes()


def test_a_stage_refuses_to_go_on_from_another_stages_state() -> None:
    parts = stages.split(_dropping(), [2, 2, 2])
    saved = stages.StageRunner(parts[0], last=False).saved()
    with pytest.raises(ValueError, match="not a saved state of this stage"):
        stages.StageRunner(parts[1], last=False).restore(saved)


class _Context:
    """A Lambda context of ``seconds`` left."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def get_remaining_time_in_millis(self) -> int:
        return int(self.seconds * 1000)


@pytest.mark.parametrize(
    ("lifetime_s", "computed", "waited", "hands_on"),
    [
        (0.5, True, 0, True),  # a pass computed, its progress not storable in the time left: handed on
        (30.0, True, 0, False),  # time enough: it waits on
        (0.5, False, 0, True),  # no pass computed, its time nearly out: the same progress handed on
        (0.5, False, 119, True),  # its waits (120 of 0.5 s) within the deadline of 60 s
        (0.5, False, 120, False),  # past it: left to the deadline
        (30.0, False, 0, False),  # time enough to wait on
    ],
)
def test_a_waiting_stage_hands_on_when_its_time_runs_short_and_its_waits_stay_within_the_deadline(
    lifetime_s, computed, waited, hands_on
) -> None:
    from slsml.pipeline import lifetime
    from slsml.pipeline.staged import Pace

    pace = Pace(3, 1000, waited=waited, deadline_s=60.0)
    pace.before(4 if computed else 3)
    with lifetime.invocation(_Context(lifetime_s)):
        assert pace.waiting() is hands_on


@pytest.mark.parametrize("moved_on", ["failed", "went past the round"])
def test_a_stage_waiting_for_its_input_stops_once_its_run_moved_on(services, model_bytes, moved_on) -> None:
    """A stage function polls for what it waits on up to the run's deadline; once its run failed (or stopped), or
    went on to the next iteration without its round, it stops within ``RUN_CHECK_S`` of waiting, not at the deadline."""
    import time

    from slsml.pipeline import staged
    from slsml.rounds.stages import RUN_CHECK_S
    from slsml.spec import keys
    from slsml.spec.messages import WorkMessage

    from . import cloud

    run_id = f"waits-{moved_on.split()[0]}"
    config = cloud.register_run(services, model_bytes, run_id, deadline_s=600.0)
    hand = staged.Hand(services, WorkMessage(run_id=run_id, iteration=0, worker=0, workers=2), config)
    if moved_on == "failed":
        assert services.table.fail(run_id, "failed while a stage waits") is not None
    else:
        assert services.table.advance(run_id, 1, 0) is not None
    started = time.monotonic()
    with pytest.raises(staged.RunMovedOn, match=keys.handed(run_id, 0, 0, 0, 0, 3, False)):
        hand.take(0, 3, False)
    assert time.monotonic() - started < 3 * RUN_CHECK_S < config.training.deadline_s


def test_each_stage_is_sized_with_its_own_weights_and_what_it_stores_its_part_of_the_update_through() -> None:
    from dataclasses import replace

    from slsml.rounds.stages import UPLOAD_BYTES, Stage, deployed, held, unfit

    heavy = Block("dense", "dense", 50 * sizing.MB, (1000,), 1000, 10)  # most of the weights, small outputs
    wide = Block("conv", "conv", sizing.MB, (40_000_000,), 1000, 10)  # few weights, ~640 MB a sample's step
    whole = sizing.WorkerMemory(3008, 1504, heavy.weight_bytes + wide.weight_bytes, 0.0)
    # the second stage beside the whole model's buffers: not one sample (the run's start refused it so before)
    assert replace(whole, sample_bytes=Stage((wide,)).sample_bytes).micro_batch() == 0
    split = deployed([heavy, wide], 2, whole)
    assert split is not None and [s.blocks for s in split] == [(heavy,), (wide,)]
    # each its own weights, and the parts in flight as it stores its part (a small part: joined, its bytes)
    first, second = held(split[0], whole), held(split[1], whole)
    assert (first.model_bytes, first.other_bytes) == (heavy.weight_bytes, UPLOAD_BYTES) and UPLOAD_BYTES < 50 * 2**20
    assert (second.model_bytes, second.other_bytes) == (wide.weight_bytes, wide.weight_bytes)
    # the wide block's step past the function's memory in any stage: refused naming it
    small = replace(whole, memory_mb=2000)
    assert deployed([heavy, wide], 2, small) is None
    said = unfit([heavy, wide], 2, small)
    assert said.startswith("--pipeline-stages 2: no split into 2 stages fits a worker of 2,000 MB")
    assert "layer 'conv' needs ~" in said
