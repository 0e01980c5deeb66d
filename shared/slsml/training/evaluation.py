"""A split evaluated across the workers, as ``model.evaluate`` would on the whole of it.

Each worker evaluates its slice with the weights it holds and returns the state of the loss and of the model's
compiled metrics (Keras's ``CompileMetrics``: the metrics ``compile`` was given, ``"accuracy"`` resolved by the
labels' shape as Keras resolves it; per output for a model of several, named ``<output>_<metric>``): one float64
vector, the loss's weighted sum and sample count, then every metric variable (``metric.variables``) flattened,
those of each output's loss (``<output>_loss``, a model of several outputs) first.
The states of the slices add up to the state of the whole split; the result is computed once from their sum. Training
tracks the same state on each batch's forward pass (``batch_state``, as ``fit``'s train step does), summed over a
worker's batches, then over an iteration's workers. The vector's size is that of the metrics' variables (AUC: 4 × its
thresholds, MeanIoU: classes², most metrics: 2), whatever the split's size.

A metric whose state does not add up (a maximum, a last value) would give a wrong result, so ``check_mergeable``
evaluates a sample whole and in two parts and refuses, by name, a metric whose merged result differs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from slsml.spec import samples
from slsml.spec.errors import BadInputError
from slsml.spec.messages import MAX_METRIC_VALUES
from slsml.spec.samples import Arrays
from slsml.training.modelio import deserialize_metrics, keras, output_names, tf, training_loss

MERGE_TOLERANCE = 1e-5  # relative: the parts' sums in float64 against the whole's in float32
EVALUATION_BATCH = 1024


def _compiled(metrics: Any, outputs: list[str]) -> Any:
    from keras.src.trainers.compile_utils import CompileMetrics  # what compile() builds: names and accuracy kinds

    return CompileMetrics(metrics, None, output_names=outputs or None) if metrics else None


def _tensors(arrays: Arrays) -> Any:
    return tf.nest.map_structure(tf.convert_to_tensor, arrays)


def _prediction_like(model: keras.Model, x: Arrays) -> Any:
    """A prediction of ``model`` on ``x`` to build its metrics on: of a Sequential or functional model, zeros of its
    outputs' shapes and dtypes, computed symbolically (its forward pass, called eagerly, holds every layer's output at
    once: a model of large layer outputs would need their sum); of another model, or of inputs that are not numbers
    (strings, which a symbolic tensor cannot hold), its forward pass."""
    numeric = all(np.asarray(a).dtype.kind in "biuf" for a in tf.nest.flatten(x))
    if not numeric or not isinstance(model, keras.Sequential | keras.src.models.functional.Functional):
        return model(x, training=False)
    symbolic = tf.nest.map_structure(lambda a: keras.KerasTensor(np.shape(a), np.asarray(a).dtype.name), x)
    return tf.nest.map_structure(lambda t: tf.zeros(t.shape, t.dtype), model.compute_output_spec(symbolic))


def _vector(loss_total: float, count: int, values: Iterable[Any]) -> np.ndarray:
    """A state: the loss's weighted sum and sample count, then the metric variables' ``values`` flattened."""
    head = np.array([loss_total, count], dtype=np.float64)
    return np.concatenate([head, *(np.asarray(v, np.float64).ravel() for v in values)])


class Evaluator:
    """The loss and compiled metrics of one model, as states that add up across slices of a split."""

    def __init__(self, model: keras.Model, loss: str, metrics: str, sample: tuple[Arrays, Arrays]) -> None:
        """``sample``: a sample or two of the data, on which the metrics are built (their kinds and shapes)."""
        self.model = model
        self.loss_fn: Callable[..., Any] = training_loss(loss, model)
        self._metrics = _compiled(deserialize_metrics(metrics), output_names(model))
        y, prediction = _tensors(sample[1]), _prediction_like(model, sample[0])
        self.loss_fn(y, prediction)  # a compiled loss makes the trackers of each output's loss
        self.loss_trackers = list(getattr(self.loss_fn, "metrics", []))  # each output's loss (several outputs)
        if self._metrics is not None:
            self._metrics.build(y, prediction)
            self._metrics.update_state(y, prediction)  # some metrics (R2Score) make their variables on the first
        self._reset()
        self.size = 2 + sum(math.prod(v.shape) for v in self._variables)
        # each output's loss is counted by its batch's shape: traced for each size of batch where there are several
        self._track = tf.function(self._track_fn, reduce_retracing=not self.loss_trackers)
        self._evaluate = tf.function(self._evaluate_fn)  # traced for a whole batch's shape, which Keras counts by

    @property
    def metrics(self) -> list[Any]:
        """The compiled metrics, in Keras's order."""
        return [] if self._metrics is None else list(self._metrics.metrics)

    @property
    def _variables(self) -> list[Any]:
        own = [] if self._metrics is None else list(self._metrics.variables)
        return [v for tracker in self.loss_trackers for v in tracker.variables] + own

    def _reset(self) -> None:
        for metric in [*self.loss_trackers, *([self._metrics] if self._metrics is not None else [])]:
            metric.reset_state()

    @property
    def traces(self) -> int:
        """How often ``state``'s batch step was traced: once for each size and kind of whole batch (the first)."""
        return int(self._evaluate.experimental_get_tracing_count())

    def state(self, x: Arrays, y: Arrays, w: np.ndarray | None = None, batch: int = EVALUATION_BATCH) -> np.ndarray:
        """The state of evaluating ``x``, ``y`` (each one array or named arrays; no samples: zeros), each sample's
        loss and metrics weighted by ``w`` as ``model.evaluate(x, y, sample_weight=w)`` weights them."""
        return self.state_of([(x, y, w)], batch)

    def state_of(
        self, parts: Iterable[tuple[Arrays, Arrays, np.ndarray | None]], batch: int = EVALUATION_BATCH
    ) -> np.ndarray:
        """The state of evaluating ``parts`` (x, y, w each) one after another in batches of ``batch`` samples, as
        ``state`` evaluates them joined where each part but the last holds whole batches: a split read a part at a
        time."""
        loss_total, count = 0.0, 0
        self._reset()
        for x, y, w in parts:
            size_of = samples.count(x)
            for start in range(0, size_of, batch):
                part = slice(start, start + batch)
                xb, yb = _tensors(samples.take(x, part)), _tensors(samples.take(y, part))
                wb = None if w is None else tf.convert_to_tensor(w[part])
                size = min(size_of, start + batch) - start  # a whole batch in its graph; a shorter last one eagerly
                loss_total += float((self._evaluate if size == batch else self._evaluate_fn)(xb, yb, wb)) * size
            count += size_of
        return _vector(loss_total, count, [v.numpy() for v in self._variables])

    def _evaluate_fn(self, x: Any, y: Any, w: Any) -> Any:
        """One batch's loss, its metrics added to the state: traced for whole batches, one call of a graph each, as
        ``evaluate`` runs its test step (a graph of another size would be traced for each size of slice)."""
        loss = self._scored(y, self.model(x, training=False), w)
        if self.model.losses:  # regularization penalties, as compute_loss adds them
            loss = loss + tf.add_n(self.model.losses)
        return loss

    def _scored(self, y: Any, prediction: Any, w: Any) -> Any:
        """The loss of a batch's ``prediction`` (regularization left out), its metrics added to the state."""
        loss = self.loss_fn(y, prediction, sample_weight=w)
        if self._metrics is not None:
            self._metrics.update_state(y, prediction, sample_weight=w)
        return loss

    def state_of_predictions(self, batches: Iterable[tuple[Any, Arrays, np.ndarray | None, float]]) -> np.ndarray:
        """The state of evaluating ``batches`` whose model outputs are computed already: each batch's prediction,
        labels, samples' weights and the regularization penalties of the model's layers (a model evaluated through
        pipeline stages, ``slsml.pipeline.staged``), as ``state_of`` evaluates their inputs."""
        loss_total, count = 0.0, 0
        self._reset()
        for prediction, y, w, regularization in batches:
            size = samples.count(y)
            weights = None if w is None else tf.convert_to_tensor(w)
            loss_total += (float(self._scored(_tensors(y), prediction, weights)) + regularization) * size
            count += size
        return _vector(loss_total, count, [v.numpy() for v in self._variables])

    def batch_state(self, y: Arrays, prediction: Any, w: Any, loss: float) -> np.ndarray:
        """The state of one training batch as ``fit``'s train step tracks it, from its forward pass (``prediction``)
        and its loss (``loss``, regularization included): the loss weighted by the batch's samples, each output's
        loss and the metrics given the samples' weights ``w`` (None: unweighted) as Keras gives them."""
        count = samples.count(y)
        return _vector(loss * count, count, self._track(_tensors(y), prediction, w))

    def _track_fn(self, y: Any, prediction: Any, w: Any) -> list[Any]:
        """One batch's metric variables from reset state (traced: one call of a graph per batch)."""
        self._reset()
        if self.loss_trackers:
            self.loss_fn(y, prediction, sample_weight=w)
        if self._metrics is not None:
            self._metrics.update_state(y, prediction, sample_weight=w)
        return [tf.identity(v.value) for v in self._variables]

    def result(self, states: Iterable[np.ndarray]) -> dict[str, float]:
        """``loss`` and each metric by its Keras name, from the sum of ``states``; ValueError for states that
        are not this evaluator's or hold no sample."""
        total = np.sum(np.stack(list(states)), axis=0)
        if total.shape != (self.size,):
            raise ValueError(f"evaluation states of {total.size} values where this model's have {self.size}")
        if total[1] <= 0:
            raise ValueError("no samples were evaluated")
        figures = {"loss": float(total[0] / total[1])}
        offset = 2
        for variable in self._variables:
            n = math.prod(variable.shape)
            variable.assign(total[offset : offset + n].reshape(variable.shape).astype(variable.dtype))
            offset += n
        figures |= {tracker.name: float(tracker.result()) for tracker in self.loss_trackers}
        if self._metrics is None:
            return figures
        return figures | {name: float(np.asarray(value)) for name, value in self._metrics.result().items()}


def figure_modes(model: keras.Model, loss: str, metrics: str, sample: tuple[Arrays, Arrays]) -> dict[str, str | None]:
    """Each figure an evaluation gives (``loss``, each output's loss and every compiled metric, by name) with whether
    it improves by falling ("min") or rising ("max"), as Keras's callbacks tell it in mode auto (None: Keras cannot
    tell)."""
    evaluator = Evaluator(model, loss, metrics, sample)
    directions = {"up": "max", "down": "min"}
    return (
        {"loss": "min"}
        | {tracker.name: "min" for tracker in evaluator.loss_trackers}
        | {m.name: directions.get(getattr(m, "_direction", None) or "") for m in evaluator.metrics}
    )


def check_size(evaluator: Evaluator) -> None:
    """BadInputError, naming each metric's share, if the evaluator's state is over the values a worker's report may
    carry (``MAX_METRIC_VALUES``)."""
    if evaluator.size > MAX_METRIC_VALUES:
        sizes = ", ".join(f"{m.name} {sum(math.prod(v.shape) for v in m.variables)}" for m in evaluator.metrics)
        raise BadInputError(
            f"the model's metrics hold {evaluator.size:,} state values (the loss 2, {sizes}), over the"
            f" {MAX_METRIC_VALUES:,} a worker's report may carry; compile the model with smaller ones (e.g. AUC"
            " with fewer num_thresholds)"
        )


def check_mergeable(model: keras.Model, loss: str, metrics: str, x: Arrays, y: Arrays) -> None:
    """BadInputError if the metrics cannot evaluate ``x``, ``y``, if their state is over the values a worker's
    report may carry (``check_size``), or naming each metric whose result from the states of two parts of
    them differs from its result on the whole: its state does not add up across workers."""
    cut = max(1, samples.count(x) // 3)
    head, tail = slice(None, cut), slice(cut, None)
    try:
        evaluator = Evaluator(model, loss, metrics, (samples.take(x, slice(2)), samples.take(y, slice(2))))
        whole = evaluator.result([evaluator.state(x, y)])
        parts = evaluator.result(
            [evaluator.state(samples.take(x, part), samples.take(y, part)) for part in (head, tail)]
        )
    except Exception as error:  # Keras raises many types for metrics that do not fit the labels
        raise BadInputError(
            f"the model's metrics cannot evaluate the data: {str(error).splitlines()[0][:300]}"
        ) from None
    check_size(evaluator)
    wrong = [
        name
        for name, value in whole.items()
        if not math.isclose(parts[name], value, rel_tol=MERGE_TOLERANCE, abs_tol=MERGE_TOLERANCE)
        and not (math.isnan(value) and math.isnan(parts[name]))
    ]
    if wrong:
        classes = {m.name: type(m).__name__ for m in evaluator.metrics}
        named = ", ".join(f"{name} ({classes.get(name, 'metric')})" for name in wrong)
        raise BadInputError(
            f"metric {named} cannot be computed across workers: its state does not add up over"
            " parts of the data (the sum of two parts' states gives another result than the whole);"
            " compile the model without it"
        )


def slice_of(count: int, workers: int, worker: int) -> np.ndarray:
    """Worker ``worker``'s contiguous, size-balanced slice of a split of ``count`` samples."""
    return np.array_split(np.arange(count), workers)[worker]


def encode_metrics(metrics: Sequence[Any]) -> str:
    """Metrics as ``compile`` takes them (names, Metric objects, serialized metrics) → the run's JSON."""
    return json.dumps([m if isinstance(m, str | dict) else keras.metrics.serialize(m) for m in metrics])
