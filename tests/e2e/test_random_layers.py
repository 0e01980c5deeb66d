"""Random layers (Dropout, GaussianNoise) draw what the run defines, whatever process computes a round
(``slsml.training.generators``): one worker in whole batches draws what single-process Keras draws, and ends at its
weights; runs of several workers, with layers built without a seed, end bit-identical to each other; and a run in
pipeline stages draws what the same run in one stage draws."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from slsml.client import demo
from slsml.data import datasets as data
from slsml.spec.config import TrainingSpec
from slsml.training import modelio

from .conftest import final_weights, finish, train

BATCH, ITERATIONS = 64, 4


def _noisy(seeded: bool) -> keras.Model:
    """A small CNN on digits with a Dropout and a GaussianNoise layer, built with their own seeds or without."""
    keras.utils.set_random_seed(2)
    seed = (lambda n: n) if seeded else (lambda n: None)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.GaussianNoise(0.3, seed=seed(5)),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(0.4, seed=seed(7)),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy")
    return model


def _spec(**options) -> TrainingSpec:
    return TrainingSpec.model_validate(
        {"workers": 1, "reducers": 2, "global_batch": BATCH, "iterations": ITERATIONS, "eval_every": 0, **options}
    )


def _keras() -> np.ndarray:
    """Single-process Keras on the same model and global batches: the final weights."""
    x, y, _, _ = demo.digits()
    model = _noisy(seeded=True)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    for iteration in range(ITERATIONS):
        batch = data.global_batch_indices(len(x), BATCH, seed=0, iteration=iteration)
        with tf.GradientTape() as tape:
            loss = model.compute_loss(y=y[batch], y_pred=model(x[batch], training=True))
        gradients = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(gradients, model.trainable_weights, strict=True))
    return np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])


@pytest.fixture(scope="module")
def ended(services, digits) -> dict[str, np.ndarray]:
    """The final weights of each run, trained at once (the run in stages after the others)."""
    seeded, unseeded = modelio.save_model(_noisy(seeded=True)), modelio.save_model(_noisy(seeded=False))
    runs = {
        "random-one": (_spec(), seeded),
        "random-many-a": (_spec(workers=3, micro_batch=8), unseeded),
        "random-many-b": (_spec(workers=3, micro_batch=8), unseeded),
        "random-whole": (_spec(workers=2, micro_batch=12), seeded),
        "random-staged": (_spec(workers=2, micro_batch=12, pipeline_stages=2), seeded),
    }
    found = {}
    for batch in ([r for r in runs if r != "random-staged"], ["random-staged"]):  # its stages wait on each other
        for run_id in batch:
            train(services, runs[run_id][0], run_id, runs[run_id][1])
        for run_id in batch:
            run = finish(services, run_id)
            assert run.status == "COMPLETED", run.reason
            found[run_id] = final_weights(services, run_id)[0]
    return found


def test_one_worker_draws_what_single_process_keras_draws_and_ends_at_its_weights(ended):
    expected = _keras()
    error = np.abs(ended["random-one"] - expected).max() / np.abs(expected).max()
    assert error <= 1e-5, error


def test_runs_of_layers_built_without_a_seed_end_bit_identical(ended):
    assert ended["random-many-a"].tobytes() == ended["random-many-b"].tobytes()


def test_a_run_in_stages_draws_what_the_run_in_one_stage_draws(ended):
    whole = ended["random-whole"]
    assert np.abs(ended["random-staged"] - whole).max() / np.abs(whole).max() <= 1e-5
