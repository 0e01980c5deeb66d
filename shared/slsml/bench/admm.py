"""Benchmark ``admm``: ADMM against gradient averaging on a convex model, logistic regression (one softmax Dense
layer, 62 weights) on scikit-learn's breast cancer data (569 samples, 30 features standardized by the training
set's mean and deviation, 20 % held out), 4 workers and 2 reducers, global batch 64, evaluated every round, in one
local runtime, one after the other:

- gradient averaging for ``GRADIENT_ROUNDS`` rounds with SGD 0.1, momentum 0.9 on the reducers;
- ADMM for ``ADMM_ROUNDS`` rounds of ``LOCAL_STEPS`` local steps (SGD 0.2, momentum 0.9, ρ = ``RHO``), each worker
  on its own partition.

Gradient averaging's test accuracy after its budget is the target. The verdict: ADMM reaches it, less
``WITHIN`` (one point), in at most a third of the rounds gradient averaging took to reach it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel

from slsml.bench import pipeline as bench
from slsml.bench.algorithms import Variant, measure
from slsml.data import datasets as data
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch
from slsml.pipeline.services import Services
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, TrainingSpec

DATASET = "breast-cancer"
WORKERS, REDUCERS, BATCH = 4, 2, 64
GRADIENT_ROUNDS, ADMM_ROUNDS = 60, 20
GRADIENT = OptimizerConfig(name="sgd", learning_rate=0.1, momentum=0.9)
LOCAL_STEPS, RHO = 16, 0.03
LOCAL = {"local_optimizer": "sgd", "local_learning_rate": 0.2, "local_momentum": 0.9}
WITHIN = 0.01  # ADMM's accuracy counts from gradient averaging's less this (one point)
FEWER = 3  # ADMM's rounds to it at most 1/this of gradient averaging's

Progress = Callable[[str, int, int], None]  # (variant, rounds merged, rounds)


class AdmmReport(BaseModel):
    workers: int
    global_batch: int
    variants: list[Variant]  # gradient, admm
    target: float | None  # gradient averaging's test accuracy after its budget
    gradient_rounds: int | None  # rounds gradient averaging took to first reach the target
    admm_rounds: int | None  # rounds ADMM took to first reach the target less WITHIN (None: it did not)
    ratio: float | None  # admm_rounds / gradient_rounds
    admm_fewer: bool  # at most 1/FEWER

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


def breast_cancer(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): 30 features standardized by the training split's mean and deviation,
    labels 0 (malignant) or 1 (benign); 20 % held out."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    x_train, y_train, x_test, y_test = data.split_train_test(
        bunch.data.astype(np.float32), bunch.target.astype(np.int64), test_fraction=0.2, seed=seed
    )
    mean, deviation = x_train.mean(axis=0), x_train.std(axis=0)
    return (
        ((x_train - mean) / deviation).astype(np.float32),
        y_train,
        ((x_test - mean) / deviation).astype(np.float32),
        y_test,
    )


def logistic_regression(features: int = 30, classes: int = 2, seed: int = 0):
    """A compiled multinomial logistic regression: one softmax Dense layer, sparse categorical cross-entropy."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def put_breast_cancer(services: Services) -> None:
    """The breast cancer dataset in the store, put there once."""
    if not services.store.exists(keys.dataset_manifest(DATASET)):
        data.put_dataset(services.store, DATASET, *breast_cancer())


def variants() -> dict[str, tuple[str, TrainingSpec]]:
    """The runs compared: name → (description, spec)."""
    common = {"workers": WORKERS, "reducers": REDUCERS, "global_batch": BATCH, "eval_every": 1}
    return {
        "gradient": (
            "gradient averaging, SGD 0.1 momentum 0.9 on the reducers",
            TrainingSpec(iterations=GRADIENT_ROUNDS, optimizer=GRADIENT, **common),
        ),
        "admm": (
            f"ADMM, {LOCAL_STEPS} local steps of SGD 0.2 momentum 0.9, rho {RHO:g}",
            TrainingSpec(
                iterations=ADMM_ROUNDS, algorithm="admm", local_steps=LOCAL_STEPS, admm_rho=RHO, **LOCAL, **common
            ),
        ),
    }


def admm_against_gradient(local: LocalRuntime, progress: Progress | None = None) -> AdmmReport:
    """Run both variants on ``local`` (an entered runtime, best with ``WORKERS`` worker processes) and compare."""
    from slsml.training import modelio

    services = local.services
    put_breast_cancer(services)
    model_bytes = modelio.save_model(logistic_regression())
    stem = launch.new_run_id("admm")
    compared = []
    for name, (description, spec) in variants().items():
        run, started = bench.run_to_the_end(services, model_bytes, spec, f"{stem}-{name}", name, progress, DATASET)
        compared.append(measure(name, description, spec, run, services, local.log_dir, started))
    return judge(compared)


def judge(compared: list[Variant]) -> AdmmReport:
    """The report of the runs ``compared`` (gradient, admm), with its verdict."""
    by_name = {v.name: v for v in compared}
    gradient, admm = by_name["gradient"], by_name["admm"]
    target = gradient.final_accuracy

    def first(variant: Variant, accuracy: float) -> int | None:
        return next((r + 1 for r, a in enumerate(variant.accuracy_by_round) if a is not None and a >= accuracy), None)

    gradient_rounds = None if target is None else first(gradient, target)
    admm_rounds = None if target is None else first(admm, target - WITHIN)
    ratio = admm_rounds / gradient_rounds if admm_rounds and gradient_rounds else None
    return AdmmReport(
        workers=WORKERS,
        global_batch=BATCH,
        variants=compared,
        target=target,
        gradient_rounds=gradient_rounds,
        admm_rounds=admm_rounds,
        ratio=ratio,
        admm_fewer=ratio is not None and ratio <= 1 / FEWER,
    )
