"""ADMM through the pipeline equals its definition in TensorFlow: every round, each worker's dual steps by the
consensus, its local model takes K steps on its own partition's loss plus the proximal term, and the consensus is
the mean of local models plus duals. Models with hidden layers are refused before anything is stored, and an
ADMM run's workers cannot be scaled."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from slsml.accounting import usage
from slsml.bench import admm as bench_admm
from slsml.client import runs
from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.rules import admm
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.training import modelio

from .conftest import final_weights, finish

RUN, WORKERS, ROUNDS, LOCAL_STEPS, BATCH, LOCAL_RATE, RHO = "admm-w2", 2, 3, 3, 32, 0.2, 0.5
TOLERANCE = 1e-5  # × max|w|: float32 round-off of the local steps and the mean
SPEC = TrainingSpec(
    workers=WORKERS,
    reducers=2,
    global_batch=BATCH,
    iterations=ROUNDS,
    eval_every=0,
    algorithm="admm",
    local_steps=LOCAL_STEPS,
    local_learning_rate=LOCAL_RATE,
    admm_rho=RHO,
)


@pytest.fixture(scope="module")
def finished(services):
    bench_admm.put_breast_cancer(services)
    launch.start_run(
        services, modelio.save_model(bench_admm.logistic_regression(seed=1)), bench_admm.DATASET, SPEC, run_id=RUN
    )
    return finish(services, RUN)


def reference(dual: bool = True) -> np.ndarray:
    """ADMM in TensorFlow: per round and worker, u += x − z (``dual``; else u stays 0), then K steps of
    x −= rate · (∇loss(x) + ρ (x − z + u)) on the worker's partition batches; z = mean of x + u."""
    x_train, y_train, _, _ = bench_admm.breast_cancer()
    model = bench_admm.logistic_regression(seed=1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    z = [np.asarray(w) for w in model.get_weights()]
    local = [[w.copy() for w in z] for _ in range(WORKERS)]
    duals = [[np.zeros_like(w) for w in z] for _ in range(WORKERS)]
    for round_number in range(ROUNDS):
        sent = []
        for worker in range(WORKERS):
            if round_number and dual:
                duals[worker] = [u + x - c for u, x, c in zip(duals[worker], local[worker], z, strict=True)]
            elif not dual:
                local[worker] = [w.copy() for w in z]
            for number in range(round_number * LOCAL_STEPS, (round_number + 1) * LOCAL_STEPS):
                batch = data.partition_batch(len(x_train), BATCH, 0, WORKERS, worker, number)
                model.set_weights(local[worker])
                with tf.GradientTape() as tape:
                    loss = loss_fn(y_train[batch], model(x_train[batch], training=True))
                gradients = tape.gradient(loss, model.trainable_weights)
                local[worker] = [
                    x - np.float32(LOCAL_RATE) * (np.asarray(g) + np.float32(RHO) * (x - c + u))
                    for x, g, c, u in zip(local[worker], gradients, z, duals[worker], strict=True)
                ]
            sent.append([x + u for x, u in zip(local[worker], duals[worker], strict=True)])
        z = [np.mean(parts, axis=0) for parts in zip(*sent, strict=True)]
    return np.concatenate([w.ravel() for w in z])


def test_admm_through_the_pipeline_equals_admm_in_tensorflow(local, services, finished) -> None:
    assert finished.status == "COMPLETED", finished.reason
    weights, _ = final_weights(services, RUN)
    expected, without_dual = reference(), reference(dual=False)
    error = np.abs(weights - expected).max() / np.abs(expected).max()
    print(f"ADMM W={WORKERS}, K={LOCAL_STEPS}, {ROUNDS} rounds: max |Δw|/max|w| = {error:.2e}")
    assert error < TOLERANCE
    assert np.abs(without_dual - expected).max() / np.abs(expected).max() > 10 * TOLERANCE  # the dual counts
    # each slot stores its local model and dual each round, beside its update: the pipeline deletes them once
    # superseded, and the last ones with the completed run
    assert local.host.wait_idle(RUN, timeout_s=60)
    stored = {
        (r.iteration, r.worker): (r.requests.get("s3:PutObject"), r.bytes_written)
        for r in usage.read_local(local.log_dir, RUN)
        if r.function == "worker" and r.iteration is not None and r.iteration < ROUNDS
    }
    state_bytes = len(admm.SlotState(weights, weights).encode())
    update_bytes = {
        key: services.store.s3.head_object(Bucket=services.store.bucket, Key=key)["ContentLength"]
        for key in (keys.update(RUN, i, w) for i in range(ROUNDS) for w in range(WORKERS))
    }
    assert stored == {
        (i, w): (2, state_bytes + update_bytes[keys.update(RUN, i, w)]) for i in range(ROUNDS) for w in range(WORKERS)
    }
    assert not [key for key in services.store.list_keys(keys.run_prefix(RUN)) if "/local/" in key]


def test_an_admm_run_keeps_its_workers(services, finished) -> None:
    with pytest.raises(
        BadInputError, match=f"run '{RUN}' trains with algorithm admm: each worker keeps its data partition"
    ):
        runs.scale_run(services, RUN, 3)
    assert services.table.get_run(RUN).workers == WORKERS


def test_a_model_with_hidden_layers_is_refused_before_anything_is_stored(services, finished) -> None:
    keras.utils.set_random_seed(0)
    hidden = keras.Sequential(
        [
            keras.Input((30,)),
            keras.layers.Dense(8, activation="relu", name="hidden"),
            keras.layers.Dense(2, activation="softmax", name="out"),
        ]
    )
    hidden.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(BadInputError, match=r"admm applies to models without hidden layers .* hidden \(Dense\)"):
        launch.start_run(services, modelio.save_model(hidden), bench_admm.DATASET, SPEC, run_id="admm-hidden")
    assert not services.store.list_keys(keys.run_prefix("admm-hidden"))
