"""A model whose one-sample training step needs more than twice a worker's memory trains in pipeline stages on the
local cloud, to the weights of single-process TensorFlow.

The model: 256×256 images sampled up to 2,048×2,048, 150 single-channel 3×3 convolutions on them, and pooled back to
256×256 (1,500 weights; its layer outputs 16 MB each, a sample; its data 256 KB a sample). A run of it in one stage is
refused at start, naming the memory one sample's step needs; in 15 stages of ten layers on 2,048 MB Worker processes
(killed past their memory, as Lambda kills a container) it trains to COMPLETED. Prints the refusal, the stages' peak
memory (their REPORT lines) and the largest difference of the final weights from single-process TensorFlow's on the
same global batches (each sample's gradient added up, as the stages' micro-batches of one are).

    PYTHONPATH=shared .venv/bin/python scripts/stages_beyond_memory.py

Needs about 16 GB of memory and a few minutes on two cores."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import tensorflow as tf

from slsml.client import runs
from slsml.data import datasets as data
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.training import modelio

SIDE, SCALE, LAYERS, STAGES, MEMORY_MB = 256, 8, 150, 15, 2048
SAMPLES, BATCH, ITERATIONS, RATE = 4, 4, 2, 0.01


def model() -> keras.Model:
    """The model, its convolutions near the identity (each kernel's centre 1, the rest small), so that every layer's
    gradient is of the same order."""
    keras.utils.set_random_seed(0)
    convolutions = [keras.layers.Conv2D(1, 3, padding="same") for _ in range(LAYERS)]
    built = keras.Sequential(
        [
            keras.Input((SIDE, SIDE, 1)),
            keras.layers.UpSampling2D(SCALE),
            *convolutions,
            keras.layers.AveragePooling2D(SCALE),
        ]
    )
    rng = np.random.default_rng(1)
    for layer in convolutions:
        kernel = rng.normal(0.0, 0.01, (3, 3, 1, 1)).astype(np.float32)
        kernel[1, 1, 0, 0] += 1.0
        layer.set_weights([kernel, np.zeros(1, np.float32)])
    built.compile(optimizer=keras.optimizers.SGD(RATE), loss="mse")
    return built


def reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Single-process TensorFlow: each global batch's gradient, a sample at a time, weighted by its share."""
    single = model()
    loss_fn, optimizer = keras.losses.MeanSquaredError(), keras.optimizers.SGD(RATE)
    for iteration in range(ITERATIONS):
        batch = data.global_batch_indices(len(x), BATCH, seed=0, iteration=iteration)
        total = [np.zeros(v.shape, np.float64) for v in single.trainable_weights]
        for index in batch:
            with tf.GradientTape() as tape:
                loss = loss_fn(y[index : index + 1], single(x[index : index + 1], training=True))
            for sum_, g in zip(total, tape.gradient(loss, single.trainable_weights), strict=True):
                sum_ += np.asarray(g, np.float64) / len(batch)
        optimizer.apply_gradients(zip([g.astype(np.float32) for g in total], single.trainable_weights, strict=True))
    return np.concatenate([np.asarray(w).ravel() for w in single.get_weights()])


def main() -> int:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES + 1, SIDE, SIDE, 1)).astype(np.float32)
    y = (0.5 * x + 0.1).astype(np.float32)
    logs = Path(tempfile.mkdtemp(prefix="stages-"))
    with LocalRuntime(workers=STAGES, reducers=1, pool=STAGES, memory_mb={"worker": MEMORY_MB}, log_dir=logs) as local:
        services = local.services
        data.put_dataset(services.store, "wide", x[:SAMPLES], y[:SAMPLES], x[SAMPLES:], y[SAMPLES:])
        source = modelio.save_model(model())
        spec = TrainingSpec(
            workers=1,
            reducers=1,
            global_batch=BATCH,
            iterations=ITERATIONS,
            eval_every=0,
            optimizer=OptimizerConfig(name="sgd", learning_rate=RATE),
        )
        try:
            launch.start_run(services, source, "wide", spec, run_id="one-stage")
            print("one stage: started (expected a refusal)", file=sys.stderr)
            return 1
        except BadInputError as refused:
            print(f"one stage, refused at start: {refused}")
        staged = spec.model_copy(update={"pipeline_stages": STAGES})
        config = launch.start_run(services, source, "wide", staged, run_id="in-stages")
        print(f"{STAGES} stages of {config.stage_blocks} blocks, micro-batch {config.training.micro_batch}")
        run = runs.wait_for_run(services, "in-stages", timeout_s=3600, poll_s=1)
        print(f"run: {run.status} {run.reason or ''}")
        if run.status != "COMPLETED":
            return 1
        final = modelio.load_model(services.store.get(keys.final_model("in-stages")))
        got = np.concatenate([np.asarray(w).ravel() for w in final.get_weights()])
    peaks = [int(m) for m in re.findall(r"Max Memory Used: (\d+) MB", (logs / "worker.log").read_text())]
    median = int(np.median(peaks))
    print(f"Worker invocations: {len(peaks)}, peak memory {max(peaks):,} MB of {MEMORY_MB:,} (median {median:,})")
    expected = reference(x[:SAMPLES], y[:SAMPLES])
    moved = np.abs(expected - np.concatenate([np.asarray(w).ravel() for w in model().get_weights()])).max()
    error = np.abs(got - expected).max() / np.abs(expected).max()
    scale = np.abs(expected).max()
    print(
        f"final weights against single-process TensorFlow: max|Δw|/max|w| = {error:.2e} (training moved them by"
        f" {moved / scale:.2e} of max|w|)"
    )
    return 0 if error <= 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
