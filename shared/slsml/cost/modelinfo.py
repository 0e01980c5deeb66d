"""A model's figures for the plan: from a ``.keras`` file (its weights, file, inputs, embedding tables, metrics'
state, its training FLOPs per sample and one timed gradient step; TensorFlow is imported for this only) or from its
size alone (a ResNet-50-like network)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np

from slsml.cost import flops
from slsml.cost.parameters import Parameters
from slsml.cost.timing import speedup
from slsml.cost.workload import Embedding
from slsml.data.manifest import DatasetManifest
from slsml.rounds import sizing
from slsml.spec.errors import BadInputError

GIVEN = "your own figure (--compute-per-sample)"


def from_params(params: int, parameters: Parameters, compute_per_sample_s: float | None = None) -> dict[str, Any]:
    """The model's figures from its size alone (a ResNet-50-like network on 224×224 images)."""
    if params <= 0:
        raise BadInputError(f"--params {params}: a model has at least one weight")
    compute = compute_per_sample_s
    source = GIVEN
    if compute is None:
        compute = params * parameters.compute_s_per_param_sample
        source = "estimated from the parameter count (ResNet-50-like): give --compute-per-sample or --model"
    return {
        "model": "model (--params)",
        "params": params,
        "trainable_params": params,
        "model_file_bytes": round(4 * params * (1 + parameters.keras_file_overhead)),
        "activation_bytes_per_sample": params * parameters.activation_bytes_per_param_sample,
        "compute_per_sample_s": compute,
        "compute_source": source,
    }


def from_keras_file(
    path: str | Path,
    batch: int,
    measure: bool,
    parameters: Parameters,
    loss: str | None = None,
    manifest: DatasetManifest | None = None,
) -> dict[str, Any]:
    """The model's figures from a ``.keras`` file (``from_keras``)."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"model file {path} does not exist")
    return from_keras(path.read_bytes(), path.name, str(path), batch, measure, parameters, loss, manifest)


def from_keras(
    data: bytes,
    name: str,
    where: str,
    batch: int,
    measure: bool,
    parameters: Parameters,
    loss: str | None = None,
    manifest: DatasetManifest | None = None,
) -> dict[str, Any]:
    """The figures of the ``.keras`` archive ``data`` (``name``, read from ``where``), its metrics' state as a run of
    ``loss`` (None: the compiled one) on the dataset of ``manifest`` tracks it (``metric_values``), its training
    FLOPs per sample as TensorFlow counts them (``slsml.cost.flops``); with
    ``measure``, one timed gradient step, converted from TensorFlow's threads here to one vCPU with
    ``parameters.vcpu_efficiency`` (see ``pin_one_thread``)."""
    from slsml.training import modelio

    model = modelio.load_model(data, where=where)
    specs = modelio.variable_specs(model)
    inputs = modelio.model_inputs(model)  # several: a sample is all of them
    shapes = [i.shape for i in inputs] if inputs else [model.input_shape]
    if any(not isinstance(s, tuple) or (s and isinstance(s[0], tuple | list)) for s in shapes):
        raise BadInputError(f"{where}: the plan reads models of flat inputs; give --params and --compute-per-sample")
    figures: dict[str, Any] = {
        "model": name,
        "params": sum(s.size for s in specs),
        "trainable_params": sum(s.size for s in specs if s.trainable),
        "model_file_bytes": len(data),
        "sample_bytes": sum(4 * math.prod(d or 1 for d in shape[1:]) for shape in shapes),
        "activation_bytes_per_sample": sizing.sample_bytes(model),
        "train_flops_per_sample": flops.count(model, _sample(model, 1)[0]).training,
        "embeddings": embeddings(model),
    }
    with suppress(BadInputError):  # not compiled, or not an optimizer the reducers apply: the default stands
        figures["optimizer"] = modelio.optimizer_config(model)
    run_loss = None
    with suppress(BadInputError):  # no loss, compiled or given: the run cannot start, and the loss alone stands
        run_loss = modelio.loss_config(model, loss)
    if run_loss is not None:
        figures["metric_values"] = metric_values(model, run_loss, manifest)
    if measure:
        threads = _threads()
        seconds = measure_step(model, specs, batch)
        figures["compute_per_sample_s"] = seconds / batch * speedup(threads, parameters.vcpu_efficiency)
        figures["compute_source"] = f"measured: one gradient step of {batch} samples on {threads:g} thread(s) here"
    return figures


def embeddings(model: Any) -> tuple[Embedding, ...]:
    """The model's trainable ``keras.layers.Embedding`` tables (in nested models too), each with the rows one sample
    looks up: its inputs' entries, over every call of a shared table (an input of unknown length: every row, the most
    a round can touch)."""
    import keras

    found = []
    for layer in _layers(model):
        if isinstance(layer, keras.layers.Embedding) and layer.trainable:
            shapes = [tuple(node.input_tensors[0].shape[1:]) for node in layer._inbound_nodes]  # each call's input
            known = shapes and all(None not in shape for shape in shapes)
            lookups = sum(math.prod(shape) for shape in shapes) if known else layer.input_dim
            found.append(Embedding(rows=layer.input_dim, width=layer.output_dim, lookups=max(1, lookups)))
    return tuple(found)


def _layers(model: Any) -> list[Any]:
    return [
        inner for layer in model.layers for inner in ([layer, *_layers(layer)] if hasattr(layer, "layers") else [layer])
    ]


def metric_values(model: Any, loss: str, manifest: DatasetManifest | None = None) -> int:
    """The values of the loss's and compiled metrics' state each worker of a run of ``model`` and ``loss`` (its
    JSON) sends in its WorkDone: the size of the run's ``Evaluator``, its metrics resolved as ``run start`` resolves
    them, built on two samples of labels as the dataset of ``manifest`` holds them (None: shaped as the model's
    outputs, class ids for a sparse loss). BadInputError if they are more than a worker's report may carry."""
    from slsml.training import evaluation, modelio

    classification = (manifest is not None and manifest.classes is not None) or modelio.classifies(loss)
    metrics = modelio.metrics_config(model, classification)
    x, y = _sample(model, 2, lambda output: "sparse" in json.dumps(modelio.output_loss(loss, output)))
    if manifest is not None:  # the dataset's labels, as a worker reads them
        y = (
            {a.name: np.zeros((2, *a.shape), a.dtype) for a in manifest.y_arrays}
            if manifest.y_arrays is not None
            else np.zeros((2, *(manifest.y_shape or ())), manifest.y_dtype)
        )
    evaluator = evaluation.Evaluator(model, loss, metrics, (x, y))
    evaluation.check_size(evaluator)
    return evaluator.size


def _sample(model: Any, batch: int, sparse: Callable[[str], bool] = lambda output: False) -> tuple[Any, Any]:
    """``batch`` random inputs of ``model`` (several: by input name) and zero labels shaped as its outputs (several:
    by output name), class ids of an output ``sparse`` names."""
    from slsml.training import modelio

    rng = np.random.default_rng(0)

    def sized(shape: Any) -> tuple[int, ...]:
        return (batch, *(d or 1 for d in shape[1:]))

    def label(output: str, shape: Any) -> np.ndarray:
        return np.zeros(sized(shape)[:-1], np.int32) if sparse(output) else np.zeros(sized(shape), np.float32)

    inputs = modelio.model_inputs(model) or []
    x = (
        {i.name: rng.random(sized(i.shape), dtype=np.float32) for i in inputs}  # several inputs: by name
        if len(inputs) > 1
        else rng.random(sized(model.input_shape), dtype=np.float32)
    )
    outputs = modelio.output_names(model)
    if len(outputs) > 1:
        return x, {name: label(name, shape) for name, shape in zip(outputs, model.output_shape, strict=True)}
    return x, label(outputs[0] if outputs else "", model.output_shape)


def pin_one_thread() -> None:
    """Run TensorFlow on one thread (a measured step is then per vCPU), if it has not started yet."""
    import tensorflow as tf

    with suppress(RuntimeError):  # already running: it keeps its threads, and _threads() says how many
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def _threads() -> float:
    import os

    import tensorflow as tf

    return float(tf.config.threading.get_intra_op_parallelism_threads() or len(os.sched_getaffinity(0)))


def measure_step(model: Any, specs: list, batch: int) -> float:
    """Seconds of one gradient step of ``batch`` random samples (after one untimed step that traces it)."""
    import time

    from slsml.spec.shardplan import ShardPlan
    from slsml.training import modelio

    several = len(modelio.output_names(model)) > 1  # the loss of each output, on labels by output name
    loss = json.dumps({"loss": "mean_squared_error", "loss_weights": None} if several else "mean_squared_error")
    trainer = modelio.Trainer(model, ShardPlan.build(specs, 1), loss)
    x, y = _sample(model, batch)
    trainer.compute_update(x, y)
    started = time.perf_counter()
    trainer.compute_update(x, y)
    return time.perf_counter() - started
