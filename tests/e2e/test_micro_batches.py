"""A share of the batch whose step does not fit a worker's memory at once: the worker computes it in micro-batches
sized to its function's memory, and the run completes with every invocation's peak memory (its REPORT line) within
the function's, through training and the final evaluation."""

from __future__ import annotations

import keras
import numpy as np

from slsml.accounting import usage
from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.rounds import accumulate, sizing
from slsml.spec import keys
from slsml.spec.config import RunConfig, TrainingSpec
from slsml.spec.deployment import DEFAULT_FUNCTIONS
from slsml.training import modelio

from .conftest import finish
from .test_memory import USED

SIDE, LAYERS = 128, 30  # each layer's output a MB a sample: a share of 64 takes ~2 GB at once
SPEC = TrainingSpec(workers=2, reducers=2, global_batch=128, iterations=2, eval_every=0)


def _wide_model() -> keras.Model:
    """Cheap to compute, large to keep for the backward pass: a 1×1 convolution, then a chain of activations."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input((SIDE, SIDE, 3))
    hidden = keras.layers.Conv2D(16, 1)(inputs)
    for _ in range(LAYERS):
        hidden = keras.layers.Activation("tanh")(hidden)
    outputs = keras.layers.Dense(2, activation="softmax")(keras.layers.GlobalAveragePooling2D()(hidden))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def test_a_share_past_the_workers_memory_trains_in_micro_batches_within_it(local, services) -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (320, SIDE, SIDE, 3), dtype=np.uint8)
    y = rng.integers(0, 2, 320).astype(np.int32)
    data.put_dataset(services.store, "wide", x[:256], y[:256], x[256:], y[256:])
    log = local.log_dir / "worker.log"
    start = len(log.read_bytes())
    launch.start_run(services, modelio.save_model(_wide_model()), "wide", SPEC, run_id="wide-micro")
    run = finish(services, "wide-micro", timeout_s=600)
    assert run.status == "COMPLETED", run.reason

    config = RunConfig.model_validate(services.store.get_json(keys.run_config("wide-micro")))
    memory_mb = DEFAULT_FUNCTIONS["worker"].memory_mb
    share = SPEC.global_batch // SPEC.workers
    fitting = sizing.of_run(config, memory_mb, memory_mb / 2, 0).micro_batch()
    assert 1 < fitting < share  # the share at once is past the memory
    assert sizing.of_run(config, memory_mb, memory_mb / 2, 0).needed_mb(share, 1) > memory_mb
    streamed = [r.streamed for r in usage.read_local(local.log_dir, "wide-micro") if r.streamed is not None]
    assert len(streamed) == SPEC.workers * SPEC.iterations
    assert {(s.micro_batch, s.micro_batches) for s in streamed} == {(fitting, len(accumulate.sizes(share, fitting)))}
    reports = USED.findall(log.read_bytes()[start:].decode())
    assert reports and all(int(used) < int(size) == memory_mb for size, used in reports)
