"""A worker's slice of an evaluation: which splits the workers of an iteration evaluate the model entering it on,
the samples of each split they share, the evaluator of the run's metrics, and what a slice's evaluation took
(``SliceEvaluated``, logged as ``SLICE_EVALUATED``). The worker step stores the slices' states and sums them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel

from slsml.data import datasets as data
from slsml.data.manifest import DatasetManifest, Split
from slsml.spec import samples as samples_
from slsml.spec.config import RunConfig
from slsml.training import evaluation, modelio

SLICE_EVALUATED, SLICE_KEY = "slice evaluated", "slice"  # the log line of a slice's evaluation and its record's key
READ: dict[str, Split] = {"test": "test", "val": "train"}  # where each split's samples are: validation is held out


def split_samples(config: RunConfig, manifest: DatasetManifest) -> dict[str, np.ndarray]:
    """The samples of each split the run evaluates on, in the dataset's split they are read from (``READ``)."""
    return {
        "test": np.arange(manifest.test.count),
        "val": data.held_out(config.training, manifest.train.count)[1],
    }


class SliceEvaluated(BaseModel):
    """A worker's evaluation of its slice of a split, once read (its log line ``SLICE_EVALUATED``): its samples, the
    wall seconds it took and the process's CPU seconds meanwhile (every thread's, TensorFlow's own included): on
    Lambda, one function's work, 1/W of the split's. ``traced``: it traced the evaluation step first (once per
    container), a container's warming rather than a round's work."""

    run_id: str
    iteration: int
    worker: int
    split: str
    samples: int
    wall_s: float
    cpu_s: float
    traced: bool


def evaluated(config: RunConfig, iteration: int, train_count: int) -> list[str]:
    """The splits the workers of ``iteration`` evaluate the model entering it on: the test split every
    ``eval_every`` iterations, the validation samples (``validation_split``) at each epoch's end, both for the final
    model (past the budget); under ASP the final model only. A run that watches the validation figures
    (``early_stopping``, ``keep_best``) also evaluates the test split at each epoch's end: the model it ends with
    there has its test figures."""
    spec, final = config.training, iteration >= config.training.iterations
    if spec.asynchronous and not final:  # ASP launches only the freed workers: the final model is evaluated only
        return []
    every = spec.eval_every
    epoch_end = spec.validation_split is not None and (
        final or (iteration and iteration % data.epoch_iterations(spec, train_count) == 0)
    )
    watched = epoch_end and any(m.startswith("val_") for m in spec.monitors)
    splits = ["test"] if final or watched or (every and iteration and iteration % every == 0) else []
    return [*splits, "val"] if epoch_end else splits


def evaluator_for(
    trainer: modelio.Trainer, config: RunConfig, sample: Callable[[], tuple[samples_.Arrays, samples_.Arrays]]
) -> evaluation.Evaluator:
    """The trainer's evaluator of the run's metrics, built once on ``sample()`` (a sample or two of the data, read
    only then)."""
    evaluator = trainer.evaluators.get(config.metrics)
    if evaluator is None:
        evaluator = evaluation.Evaluator(trainer.model, config.loss, config.metrics, sample())
        trainer.evaluators[config.metrics] = evaluator
    return evaluator
