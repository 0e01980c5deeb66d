"""Loss scaling for mixed precision: the scale moves as Keras's ``LossScaleOptimizer`` moves it, a
``LossScaleOptimizer`` reads as the optimizer it wraps with its settings, a model saved in float32 computes under
``mixed_precision`` as the model built under the policy, and through the real worker and reducer steps (moto) one
worker's non-finite gradient makes every shard skip the step and halve the scale, which the next iteration's workers
compute with."""

from __future__ import annotations

import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.pipeline.services import Services
from slsml.pipeline.steps import reducer, worker
from slsml.pipeline.steps.common import shard_etags
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec, config_digest
from slsml.spec.errors import BadInputError
from slsml.spec.messages import Manifest, Participant, ReduceMessage, WorkDone, WorkMessage
from slsml.spec.shardplan import ShardPlan
from slsml.state import records
from slsml.training import modelio, precision, shards
from slsml.training.precision import LossScale

from . import cloud

GROWTH = 3


def test_the_scale_moves_as_keras_loss_scale_optimizer_moves_it() -> None:
    """Over a sequence of finite and non-finite gradients: a non-finite one halves the scale, zeroes the count and
    leaves the weights as they were; GROWTH finite ones in a row double the scale."""
    variable = keras.Variable(np.ones(2, np.float32))
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.5), initial_scale=2.0**10, dynamic_growth_steps=GROWTH
    )
    optimizer.build([variable])
    finite = [True, True, False, True, True, True, True, False, False, True, True, True]
    scale = LossScale(2.0**10)
    scales = []
    for step, ok in enumerate(finite):
        before = variable.numpy()
        gradient = np.full(2, 4.0 if ok else np.inf, np.float32) * np.float32(optimizer.dynamic_scale.numpy())
        optimizer.apply([tf.constant(gradient)], [variable])
        scale = scale.after(ok, GROWTH)
        assert (scale.scale, scale.steps) == (float(optimizer.dynamic_scale.numpy()), int(optimizer.step_counter))
        assert np.array_equal(variable.numpy(), before) != ok, step  # skipped exactly where not finite
        scales.append(scale.scale)
    assert scales[:3] == [2.0**10, 2.0**10, 2.0**9]  # the third gradient is not finite: halved
    assert scales[5] == 2.0**10  # three finite steps in a row: doubled
    assert scales[7:9] == [2.0**9, 2.0**8]


def test_a_loss_scale_optimizer_reads_as_the_optimizer_it_wraps_and_back() -> None:
    inner = keras.optimizers.Adam(3e-3, beta_1=0.8)
    wrapped = keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0**8, dynamic_growth_steps=7)
    config = OptimizerConfig.from_keras("LossScaleOptimizer", wrapped.get_config())
    settings = {"dynamic_loss_scale": True, "initial_scale": 2.0**8, "dynamic_growth_steps": 7}
    assert config == OptimizerConfig.from_keras("Adam", inner.get_config()).model_copy(update=settings)
    assert config.beta_1 == 0.8
    back = modelio.keras_optimizer(config)
    assert isinstance(back, keras.optimizers.LossScaleOptimizer)
    assert (back.initial_scale, back.dynamic_growth_steps) == (2.0**8, 7)
    assert OptimizerConfig.from_keras("LossScaleOptimizer", back.get_config()) == config
    decayed = keras.optimizers.AdamW(weight_decay=0.1)
    decayed.exclude_from_weight_decay(var_names=["bias"])  # kept in memory only: read from the compiled model
    model = _dense()
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(decayed, dynamic_growth_steps=5), loss="mse")
    read = modelio.optimizer_config(model)
    assert (read.name, read.dynamic_loss_scale, read.dynamic_growth_steps) == ("adamw", True, 5)
    assert read.exclude_from_weight_decay == ("bias",)
    static = keras.optimizers.SGD(0.1, loss_scale_factor=64.0)
    assert OptimizerConfig.from_keras("SGD", static.get_config()).loss_scale_factor == 64.0


def test_contradicting_and_misplaced_mixed_precision_options_are_refused() -> None:
    with pytest.raises(ValueError, match="dynamic_loss_scale and loss_scale_factor contradict each other"):
        OptimizerConfig(dynamic_loss_scale=True, loss_scale_factor=8.0)
    with pytest.raises(ValueError, match="mixed_float16 needs loss scaling, which algorithm average's local steps"):
        TrainingSpec(algorithm="average", mixed_precision="mixed_float16")
    assert TrainingSpec(algorithm="average", mixed_precision="mixed_bfloat16").mixed_precision == "mixed_bfloat16"


def _dense(seed: int = 2) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    hidden = keras.layers.BatchNormalization()(keras.layers.Dense(8, activation="tanh")(inputs))
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))


def _under(policy: str) -> keras.Model:
    keras.config.set_dtype_policy(policy)
    try:
        return _dense()
    finally:
        keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_a_float32_model_under_the_option_computes_as_the_model_built_under_the_policy(policy: str) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 6)).astype(np.float32), rng.integers(0, 3, 16)
    built, saved = _under(policy), modelio.load_model(modelio.save_model(_dense()))
    plan = ShardPlan.build(modelio.variable_specs(saved), 1)
    loss = '"sparse_categorical_crossentropy"'
    option, reference = modelio.Trainer(saved, plan, loss), modelio.Trainer(built, plan, loss)
    statistics = option.untrained_values()  # BatchNormalization's, which each step moves: each starts from them

    def update(trainer: modelio.Trainer) -> np.ndarray:
        trainer.restore_untrained(statistics)
        return trainer.compute_update(x, y).vector

    plain = update(option)
    option.use_policy(policy)
    assert option.float16 == (policy == "mixed_float16") and {v.dtype for v in saved.weights} == {"float32"}
    assert np.array_equal(update(option), update(reference))
    assert not np.array_equal(update(option), plain)  # the policy changes what it computes
    option.use_policy(None)  # back to the model's own float32: the same as before, bit for bit
    assert np.array_equal(update(option), plain)
    with pytest.raises(BadInputError, match=f"the model computes under {policy}: it cannot train under"):
        reference.use_policy("mixed_bfloat16" if policy == "mixed_float16" else "mixed_float16")


def test_a_shard_carries_its_loss_scale_and_whether_its_step_was_skipped() -> None:
    shard = shards.Shard(np.arange(3, dtype=np.float32), {}, [0], loss_scale=LossScale(2.0**14, 5), skipped=True)
    body = shards.encode(shard)
    decoded = shards.decode(body)
    assert (decoded.loss_scale, decoded.skipped, decoded.kept) == (LossScale(2.0**14, 5), True, False)
    assert np.array_equal(decoded.weights, shard.weights)
    assert shards.loss_scale(body[: shards.HEADER_SIZE]) == LossScale(2.0**14, 5)
    assert shards.decode(shards.encode(shards.Shard(shard.weights, {}, [0]))).loss_scale is None


# ---- through the worker and reducer steps -------------------------------------------------------------------------

SAMPLES, BATCH, BIG = 64, 16, 1e5  # BIG: past float16's range, a forward pass of it is not finite


@pytest.fixture
def services(monkeypatch: pytest.MonkeyPatch):
    with cloud.moto_services(monkeypatch) as services:
        yield services


def _register(services: Services, run_id: str, overflowing: int) -> RunConfig:
    """A run of 2 workers and 2 reducers of a mixed_float16 model on samples of which one, in worker
    ``overflowing``'s share of iteration 0, is BIG."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((SAMPLES, 6)).astype(np.float32), rng.integers(0, 3, SAMPLES)
    spec = TrainingSpec(workers=2, reducers=2, global_batch=BATCH, iterations=4, eval_every=0)
    x[data.round_batches(spec, SAMPLES, 2, overflowing, 0)[0][3]] = BIG
    data.put_dataset(services.store, "big", x, y, x[:8] * 0, y[:8])
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    keras.config.set_dtype_policy("float32")
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    config = launch.prepare_run(services, modelio.save_model(model), "big", spec, run_id)
    services.table.table.put_item(
        Item=records.run_item(run_id, "big", spec, time.time(), config_digest(config.stored()))
    )
    return config


def _work(services: Services, run_id: str, iteration: int) -> list[WorkDone]:
    """Both workers' steps of ``iteration``."""
    messages = [WorkMessage(run_id=run_id, iteration=iteration, worker=w, workers=2) for w in range(2)]
    done = [worker.work(message, services) for message in messages]
    assert all(d is not None for d in done)
    return [d for d in done if d is not None]


def _reduce(services: Services, config: RunConfig, iteration: int, done: list[WorkDone]) -> list[shards.Shard]:
    """Both reducers' steps of ``iteration`` on the workers' updates, and the shards they stored; the iteration after
    is placed (its manifest)."""
    participants = tuple(Participant(worker=d.worker, attempt=d.attempt, samples=d.samples, etag=d.etag) for d in done)
    for shard in range(2):
        message = ReduceMessage(run_id=config.run_id, iteration=iteration, shard=shard, participants=participants)
        reducer.reduce(message, services)
    manifest = Manifest(iteration=iteration + 1, shards=shard_etags(services.store, config, iteration + 1) or [])
    key, body = keys.manifest(config.run_id, iteration + 1), manifest.model_dump_json().encode()
    services.store.put_new(key, body, services.keys.sign_object(config.run_id, key, body))  # as the Merger stores it
    return [
        shards.decode(services.store.get(keys.shard(config.run_id, iteration + 1, r)), config.plan.shard(r).size)
        for r in range(2)
    ]


def _scales(services: Services, config: RunConfig, iteration: int) -> list[precision.Reported | None]:
    return [
        precision.reported(services.store.read(keys.update(config.run_id, iteration, w, 0), (0, 0)).metadata)
        for w in range(2)
    ]


def test_one_workers_non_finite_gradient_makes_every_shard_skip_and_halve_the_scale(services: Services) -> None:
    config = _register(services, "overflow", overflowing=1)
    entering = [shards.decode(services.store.get(keys.shard("overflow", 0, r))) for r in range(2)]
    done = _work(services, "overflow", 0)
    assert all(d.finite for d in done)  # both take part: the non-finite one is not left out
    first = LossScale(2.0**15)  # Keras's initial scale
    assert _scales(services, config, 0) == [precision.Reported(first, True), precision.Reported(first, False)]
    stored = _reduce(services, config, 0, done)
    for shard, before, after in zip(range(2), entering, stored, strict=True):
        trainable = config.plan.shard(shard).trainable
        assert after.skipped and after.loss_scale == LossScale(2.0**14, 0), shard
        assert np.array_equal(after.weights[trainable], before.weights[trainable])  # the step skipped, on each
        assert int(after.state["step"]) == 0  # the optimizer did not step: its schedule and slots stay

    # the next iteration's workers compute with the halved scale; their gradients are finite: every shard steps
    done = _work(services, "overflow", 1)
    assert _scales(services, config, 1) == [precision.Reported(LossScale(2.0**14), True)] * 2
    stepped = _reduce(services, config, 1, done)
    for shard, before, after in zip(range(2), stored, stepped, strict=True):
        trainable = config.plan.shard(shard).trainable
        assert not after.skipped and after.loss_scale == LossScale(2.0**14, 1)
        assert not np.array_equal(after.weights[trainable], before.weights[trainable])
        assert int(after.state["step"]) == 1
