"""Keras models as the pipeline sees them: bytes in S3 ↔ a flat float32 vector in plan order, and
the worker's update computation. The only module (with ``steps.worker``/``steps.merger``) that
imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import io
import json
import math
import os
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from slsml.spec import samples
from slsml.spec.config import (
    HYPER_PARAMETERS,
    KERAS_OPTIMIZERS,
    LOSS_SCALE_OPTIMIZER_FIELDS,
    OptimizerConfig,
    optimizer_named,
)
from slsml.spec.errors import BadInputError, nearest
from slsml.spec.samples import Arrays
from slsml.spec.shardplan import ShardPlan, VariableSpec
from slsml.training import bounds
from slsml.training.generators import Draws
from slsml.training.optimizers import State, initial_state
from slsml.training.precision import LossScale, Scaling

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras
import tensorflow as tf
from keras.src.backend.common import global_state  # the list of variables awaiting their values


def load_model(data: bytes, where: str = "the model", limits: bounds.Limits | None = None) -> keras.Model:
    """A ``.keras`` archive → a Keras model; anything else → BadInputError naming the problem. An archive or a
    model that would not fit ``limits`` (this function's, by default) is refused before it is extracted or built."""
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise BadInputError(f"{where} is not a Keras model (.keras files are zip archives; got {len(data)} bytes)")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
    if "config.json" not in names and names and all(name.endswith(".npy") for name in names):
        raise BadInputError(
            f"{where} is a NumPy archive of arrays ({', '.join(n.removesuffix('.npy') for n in names[:4])}), not a"
            " Keras model: give it as the data, and the model's .keras file (model.save) as the model"
        )
    limits = limits or bounds.Limits.here()
    bounds.check_archive(data, where, limits)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        config = archive.read("config.json") if "config.json" in names else None
    if config is not None:
        with contextlib.suppress(ValueError):  # (Keras's loader names a config it cannot read)
            check_portable(json.loads(config), where)
    bounds.check_variables(where, *_declared_variables(config), len(data), limits)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as file:
            file.write(data)
        try:
            with warnings.catch_warnings():  # a compiled model saved before training has unbuilt optimizer state
                warnings.simplefilter("ignore")
                model = keras.saving.load_model(path)
        except Exception as error:  # keras raises many types for corrupt archives
            raise BadInputError(f"{where} could not be loaded as a Keras model: {error}") from None
    if not isinstance(model, keras.Model):
        raise BadInputError(f"{where} holds a {type(model).__name__}, not a Keras model")
    if not model.built:
        raise BadInputError(f"{where} is not built (its weights have no shapes yet): call it once before saving")
    return model


def check_model_portable(model: keras.Model) -> None:
    """``check_portable`` of a model in memory (before it is saved: a caller's own code refused before anything is
    stored or started)."""
    with warnings.catch_warnings():  # Keras's of a lambda it serializes, which the check names
        warnings.simplefilter("ignore")
        check_portable(keras.saving.serialize_keras_object(model))


def check_portable(config: Any, where: str = "the model") -> None:
    """BadInputError naming what ``config`` (a model's, as a ``.keras`` archive's config.json holds it) carries of the
    caller's own code: classes and functions not Keras's (a subclassed model or layer, a loss of one's own) and Lambda
    layers of Python code. slsml's functions hold Keras and slsml alone, and load a model as Keras's safe mode does:
    no code the model carries is run."""
    found: list[str] = []

    def visit(node: Any, key: str) -> None:  # key: the entry of its parent that holds it
        if isinstance(node, list):
            for item in node:
                visit(item, key)
        if not isinstance(node, dict):
            return
        name, module, registered = node.get("class_name"), node.get("module"), node.get("registered_name")
        function = node.get("config", {}).get("function") if isinstance(node.get("config"), dict) else None
        if name == "Lambda" and isinstance(function, dict) and function.get("class_name") == "__lambda__":
            found.append(f"Lambda layer {node['config'].get('name')!r} (Python code)")
            return
        if name == "__lambda__":
            found.append(f"{key} (a Python lambda)")
        elif name == "function" and module == "builtins":  # a function by its name, which Keras looks up
            if not _keras_function(node.get("config")):
                found.append(f"function {node.get('config')!r}")
        elif isinstance(name, str) and "module" in node and not _keras_module(module, registered, name):
            found.append(f"class {name!r}" + (f" ({registered})" if registered not in (None, name) else ""))
        for entry, value in node.items():
            visit(value, entry)

    visit(config, "model")
    if found:
        named = list(dict.fromkeys(found))
        raise BadInputError(
            f"{where} carries code of its own, which slsml's functions do not run: {', '.join(named)}; they hold Keras"
            " and slsml alone and load a model as Keras's safe mode does: build it from Keras's own layers, losses,"
            " metrics and optimizers (a Lambda's computation as a Keras layer)"
        )


def _keras_function(name: Any) -> bool:
    """Whether a function a model's config names is one of Keras's losses, metrics, activations or operations."""
    spaces = (keras.losses, keras.metrics, keras.activations, keras.ops)
    return isinstance(name, str) and any(hasattr(space, name) for space in spaces)


def _keras_module(module: Any, registered: Any, name: str) -> bool:
    """Whether an object of a model's config is Keras's own: of a Keras module, under its own name."""
    ours = isinstance(module, str) and (module == "keras" or module.startswith("keras."))
    return ours and registered in (None, name)


def _declared_variables(text: bytes | None) -> tuple[int, int]:
    """The bytes of the variables an archive's config (``text``, its config.json; None: none) declares, and the slots
    per weight of the optimizer it is compiled with: the model is built without its variables' values (nothing is
    allocated); (0, 0) for a config Keras cannot build, which its loader then names."""
    if text is None:
        return 0, 0
    try:
        return _declared_by(text)
    except _Unbuildable:  # not kept: the custom objects Keras knows may change
        return 0, 0


class _Unbuildable(Exception):
    """A model config Keras cannot build."""


@functools.lru_cache(maxsize=32)  # a process loads the same model again and again (a client starting runs)
def _declared_by(text: bytes) -> tuple[int, int]:
    """``_declared_variables`` of an archive whose config.json is ``text``."""
    try:
        config = json.loads(text)
    except ValueError:
        return 0, 0
    if not isinstance(config, dict):
        return 0, 0
    compiled = config.pop("compile_config", None) or {}
    optimizer = compiled.get("optimizer") if isinstance(compiled, dict) else None
    slots = 0  # per trainable weight, as the reducers hold them (an optimizer they refuse is named later)
    if isinstance(optimizer, dict) and isinstance(optimizer.get("config"), dict):
        with contextlib.suppress(BadInputError, ValidationError, TypeError):
            state = initial_state(OptimizerConfig.from_keras(str(optimizer.get("class_name")), optimizer["config"]), 1)
            slots = sum(1 for values in state.values() if values.ndim == 1)
    try:
        variables = list(getattr(_unvalued(config), "weights", []))
    except Exception as error:  # a config Keras cannot build: its loader names why
        raise _Unbuildable from error
    return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables), slots


def _unvalued(config: dict[str, Any]) -> Any:
    """The Keras object of ``config`` (a model's, its compile config left out) built with no value in any of its
    variables: each holds its shape, dtype and initializer alone until ``hold`` gives it one."""
    # Keras keeps variables made in a stateless scope in a global list to initialize later: restored untouched
    pending = list(global_state.get_global_attribute("uninitialized_variables", []) or [])
    try:
        with warnings.catch_warnings(), keras.StatelessScope(initialize_variables=False):
            warnings.simplefilter("ignore")
            return keras.saving.deserialize_keras_object(config, safe_mode=True)
    finally:
        global_state.set_global_attribute("uninitialized_variables", pending)


def skeleton(config_text: bytes, where: str = "the model") -> keras.Model:
    """The model of a ``.keras`` archive's config.json with no memory for its weights: its layers and their calls,
    each variable its shape alone (a pipeline stage's function gives values to its own layers' weights alone:
    ``hold``). BadInputError naming the problem where the config is not a model's, or carries code of its own."""
    try:
        config = json.loads(config_text)
    except ValueError as error:
        raise BadInputError(f"{where}'s config.json is not JSON: {error}") from None
    if not isinstance(config, dict):
        raise BadInputError(f"{where}'s config.json is not a model's config")
    check_portable(config, where)
    config.pop("compile_config", None)  # the run's loss and metrics are its own: the optimizer's state is unneeded
    try:
        model = _unvalued(config)
    except Exception as error:  # keras raises many types for configs it cannot build
        raise BadInputError(f"{where} could not be built as a Keras model: {error}") from None
    if not isinstance(model, keras.Model):
        raise BadInputError(f"{where} holds a {type(model).__name__}, not a Keras model")
    return model


def hold(model: keras.Model, weights: Iterable[Any]) -> None:
    """Give ``weights`` (of a ``skeleton``) their memory, with their initializers' values until they are set, and
    every variable of the model that is not a weight (its random generators' states: a few numbers each)."""
    kept = {id(v) for v in model.weights}
    for variable in [*weights, *(v for v in model.variables if id(v) not in kept)]:
        if not held(variable):
            variable._deferred_initialize()


def held(variable: Any) -> bool:
    """Whether ``variable`` has memory for its value (a ``skeleton``'s are given it by ``hold``)."""
    return getattr(variable, "_value", True) is not None


def save_model(model: keras.Model) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        with open(path, "rb") as file:
            return file.read()


def architecture(model: keras.Model) -> str:
    """A digest of what the model computes in training: its config without the compile config (workers take the
    loss from the run), the names of the model and its layers replaced by their order of appearance (Keras
    numbers the names of the models one process builds: two models built alike differ in nothing else)."""
    config = json.loads(model.to_json())
    config.pop("compile_config", None)
    names: dict[str, str] = {}

    def collect(node: Any, layer: bool) -> None:  # layer: a model or an entry of a "layers" list
        if isinstance(node, dict):
            own = node.get("config") if layer else None
            if isinstance(own, dict) and isinstance(own.get("name"), str):
                names.setdefault(own["name"], f"\0{len(names)}")
            for key, value in node.items():
                collect(value, key == "layers")
        elif isinstance(node, list):
            for value in node:
                collect(value, layer)

    def renamed(node: Any) -> Any:  # the names, and every reference to them (a functional model's wiring)
        if isinstance(node, dict):
            return {key: renamed(value) for key, value in node.items()}
        if isinstance(node, list):
            return [renamed(value) for value in node]
        return names.get(node, node) if isinstance(node, str) else node

    collect(config, True)
    return hashlib.sha256(json.dumps(renamed(config), sort_keys=True).encode()).hexdigest()


_WEIGHTS_ENTRY = "model.weights.h5"  # the entries of a .keras archive that change with the weights
_METADATA_ENTRY = "metadata.json"
_MARKER = -(2.0**20) - 0.5  # variable i is filled with _MARKER - i to find its dataset (exact in float32)
_LARGEST_KEPT_ARCHIVE = 64 * 2**20  # an ArchiveWriter keeps no copy of a bigger archive: it saves with Keras
FIT_DATA = "reshape or cast the data to the model's inputs, or build the model for the data (keras.Input(shape=...))"


class ArchiveWriter:
    """``save_model`` for a model of which only the values of ``model.weights`` change between saves (the
    Merger's): the first save is Keras' own, with each weight filled with a marker that finds its dataset
    in the archive's weights file; every later save is that archive with the weights written into their
    datasets and the save date renewed, the archive Keras would write, without walking the model again.
    Where the datasets cannot all be told apart, or the archive is large, every save is Keras' own."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self._archive: bytes | None = None
        self._datasets: list[str] = []  # the weights file's dataset of each of model.weights
        self._plain = False

    def save(self) -> bytes:
        if not self._plain and self._archive is None:
            self._locate()
        if self._plain:
            return save_model(self.model)
        return self._rewrite()

    def _locate(self) -> None:
        import h5py

        values = [v.numpy() for v in self.model.weights]
        try:
            for index, variable in enumerate(self.model.weights):
                variable.assign(np.full(variable.shape, _MARKER - index, dtype=np.float32))
            archive = save_model(self.model)
        finally:
            for variable, value in zip(self.model.weights, values, strict=True):
                variable.assign(value)
        found: dict[int, list[str]] = {}

        def visit(name: str, node: Any) -> None:
            if isinstance(node, h5py.Dataset) and node.dtype == np.float32 and node.size:
                data = node[()]
                index = _MARKER - float(data.flat[0])
                if index.is_integer() and 0 <= index < len(values) and (data == np.float32(_MARKER - index)).all():
                    found.setdefault(int(index), []).append(name)

        with zipfile.ZipFile(io.BytesIO(archive)) as entries:
            if _WEIGHTS_ENTRY in entries.namelist():
                with h5py.File(io.BytesIO(entries.read(_WEIGHTS_ENTRY)), "r") as h5:
                    h5.visititems(visit)
        located = all(len(found.get(i, ())) == 1 for i in range(len(values)))
        if not located or len(archive) > _LARGEST_KEPT_ARCHIVE:
            self._plain = True
            return
        self._archive, self._datasets = archive, [found[i][0] for i in range(len(values))]

    def _rewrite(self) -> bytes:
        import h5py

        assert self._archive is not None
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(self._archive)) as template, zipfile.ZipFile(out, "w") as archive:
            for entry in template.infolist():
                body = template.read(entry.filename)
                if entry.filename == _WEIGHTS_ENTRY:
                    weights = io.BytesIO(body)
                    with h5py.File(weights, "r+") as h5:
                        for name, variable in zip(self._datasets, self.model.weights, strict=True):
                            h5[name][...] = variable.numpy()
                    body = weights.getvalue()
                elif entry.filename == _METADATA_ENTRY:
                    metadata = json.loads(body)
                    metadata["date_saved"] = datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S")  # as Keras
                    body = json.dumps(metadata).encode()
                info = zipfile.ZipInfo(entry.filename, date_time=time.localtime()[:6])
                info.compress_type = entry.compress_type
                archive.writestr(info, body)
        return out.getvalue()


def variable_specs(model: keras.Model) -> list[VariableSpec]:
    """The shard plan's variables: the model's weights, float32 (an integer weight that is not trained, such as an
    adapted Normalization's sample count, travels as float32 too: its value, exact to 2^24, is never stepped)."""
    trainable = {id(v) for v in model.trainable_weights}
    specs = []
    for variable in model.weights:
        carried = id(variable) not in trainable and np.dtype(variable.dtype).kind in "iub"
        if variable.dtype != "float32" and not carried:
            raise BadInputError(f"weight {variable.path} has dtype {variable.dtype}; slsml trains float32 models only")
        specs.append(VariableSpec(name=variable.path, shape=tuple(variable.shape), trainable=id(variable) in trainable))
    if not any(s.trainable for s in specs):
        raise BadInputError("the model has no trainable weights")
    return specs


def get_flat(model: keras.Model, plan: ShardPlan) -> np.ndarray:
    return plan.flatten([np.asarray(v.numpy()) for v in model.weights])


def set_flat(model: keras.Model, plan: ShardPlan, flat: np.ndarray) -> None:
    for variable, value in zip(model.weights, plan.unflatten(flat), strict=True):
        variable.assign(value)


def optimizer_config(model: keras.Model) -> OptimizerConfig:
    """The optimizer the model was compiled with, if the reducers can apply it exactly.

    Keras does not serialize ``exclude_from_weight_decay`` (a loaded model never carries it); set in
    memory, its ``var_names`` pattern is carried over, its ``var_list`` refused. A ``LossScaleOptimizer``'s is the
    optimizer it wraps, with its loss scaling."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise BadInputError(f"the model is not compiled: give {_MISSING['optimizer']}")
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        outer = optimizer.get_config()
        inner = {**outer["inner_optimizer"], "config": _readable_config(optimizer.inner_optimizer)}
        return OptimizerConfig.from_keras("LossScaleOptimizer", {**outer, "inner_optimizer": inner})
    return OptimizerConfig.from_keras(type(optimizer).__name__, _readable_config(optimizer))


def _readable_config(optimizer: keras.optimizers.Optimizer) -> dict[str, Any]:
    """An optimizer's ``get_config()`` with its ``exclude_from_weight_decay`` names, or BadInputError naming why it
    cannot be read."""
    if getattr(optimizer, "_exclude_from_weight_decay", None):
        raise BadInputError(
            "optimizer option exclude_from_weight_decay(var_list=...) is not supported: Keras keeps the ids of"
            " the variables, which cannot be turned into names reliably; give names instead (var_names=..., or"
            " --exclude-from-weight-decay)"
        )
    try:
        config = optimizer.get_config()
    except NotImplementedError as error:  # e.g. a custom learning-rate schedule without get_config
        raise BadInputError(f"optimizer {type(optimizer).__name__} cannot be read: {error}") from None
    pattern = getattr(optimizer, "_exclude_from_weight_decay_pattern", None)
    if pattern is not None and config.get("weight_decay"):  # without weight decay, Keras ignores it
        config = {**config, "exclude_from_weight_decay": (pattern.pattern,)}
    return config


def keras_optimizer(config: OptimizerConfig, loss_scaled: bool = False) -> keras.optimizers.Optimizer:
    """The Keras optimizer a run's optimizer config stands for (``optimizer_config`` turned back): wrapped in a
    ``LossScaleOptimizer`` where the config says so or ``loss_scaled`` (the run scaled its loss dynamically)."""
    fields: dict[str, Any] = {
        field: getattr(config, field)
        for field in HYPER_PARAMETERS
        if field not in {"exclude_from_weight_decay", *LOSS_SCALE_OPTIMIZER_FIELDS}
        and OptimizerConfig.applies(field, config.name)
    }
    rate = config.learning_rate
    fields["learning_rate"] = (
        rate
        if isinstance(rate, float)
        else keras.optimizers.schedules.deserialize(
            {"class_name": rate.class_name, "config": rate.model_dump(exclude={"class_name"})}
        )
    )
    optimizer = keras.optimizers.get({"class_name": KERAS_OPTIMIZERS[config.name], "config": fields})
    if config.exclude_from_weight_decay:
        optimizer.exclude_from_weight_decay(var_names=list(config.exclude_from_weight_decay))
    if not (config.dynamic_loss_scale or loss_scaled):
        return optimizer
    return keras.optimizers.LossScaleOptimizer(
        optimizer, initial_scale=config.initial_scale, dynamic_growth_steps=config.dynamic_growth_steps
    )


# The attribute of a built Keras optimizer that holds, per trainable variable, each per-weight slot of the
# reducers' state (slsml.training.optimizers); the moving average of the weights is the base optimizer's.
KERAS_SLOTS: dict[str, dict[str, str]] = {
    "sgd": {"momentum": "momentums"},
    "adam": {"m": "_momentums", "v": "_velocities", "v_hat": "_velocity_hats"},
    "adamw": {"m": "_momentums", "v": "_velocities", "v_hat": "_velocity_hats"},
    "rmsprop": {"velocity": "_velocities", "momentum": "_momentums", "average_gradient": "_average_gradients"},
    "adagrad": {"accumulator": "_accumulators"},
    "adamax": {"m": "_m", "u": "_u"},
    "nadam": {"m": "_momentums", "v": "_velocities"},
    "lion": {"momentum": "_momentums"},
    "adadelta": {"accumulated_grad": "_accumulated_grads", "accumulated_delta_var": "_accumulated_delta_vars"},
    "ftrl": {"accumulator": "_accumulators", "linear": "_linears"},
}
_AVERAGE_SLOT = "_model_variables_moving_average"
_SCALARS = {"step": "_iterations", "u_product": "_u_product"}  # one per optimizer: the step, Nadam's product


def set_optimizer_state(
    optimizer: keras.optimizers.Optimizer,
    model: keras.Model,
    config: OptimizerConfig,
    plan: ShardPlan,
    states: Iterable[State],
    loss_scale: LossScale | None = None,
) -> None:
    """Give ``optimizer`` (``config``'s, for ``model``) the reducers' state, one shard's at a time in shard order:
    the optimizer ``fit`` leaves after as many steps. A variable cut across shards is assigned once all its pieces
    are in; the step count is the furthest shard's (a shard the watchdog kept stepped once less). A
    ``LossScaleOptimizer`` takes ``loss_scale`` (its scale and finite steps), the optimizer it wraps the rest."""
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if loss_scale is not None:
            optimizer.dynamic_scale.assign(loss_scale.scale)
            optimizer.step_counter.assign(loss_scale.steps)
        optimizer = optimizer.inner_optimizer
    index = {id(v): i for i, v in enumerate(model.trainable_variables)}
    variables = [index.get(id(v)) for v in model.weights]  # each plan variable's trainable index (None: none)
    slots = {**KERAS_SLOTS[config.name], **({"average": _AVERAGE_SLOT} if config.use_ema else {})}
    filling: dict[tuple[str, int], tuple[np.ndarray, list[int]]] = {}  # (slot, variable) → its values, filled
    furthest: State = {}
    for shard, state in enumerate(states):
        if not furthest or int(state["step"]) > int(furthest["step"]):
            furthest = {name: state[name] for name in _SCALARS if name in state}
        cursor = 0  # the shard's slots hold its trainable elements, in plan order
        for piece in plan.pieces(shard):
            if not piece.variable.trainable:
                continue
            count = piece.span.stop - piece.span.start
            first = plan.bounds[shard] + piece.span.start - sum(v.size for v in plan.variables[: piece.number])
            for slot, attribute in slots.items():
                if slot not in state:  # an option's slot (SGD's momentum, RMSprop's centered average…) not taken
                    continue
                values, filled = filling.setdefault(
                    (slot, piece.number), (np.empty(piece.variable.size, np.float32), [0])
                )
                values[first : first + count] = state[slot][cursor : cursor + count]
                filled[0] += count
                if filled[0] == piece.variable.size:
                    target = getattr(optimizer, attribute)[variables[piece.number]]
                    if target is not None:  # Keras keeps no slot of a variable it overwrites with its gradient
                        target.assign(values.reshape(piece.variable.shape))
                    del filling[(slot, piece.number)]
            cursor += count
    for name, value in furthest.items():
        getattr(optimizer, _SCALARS[name]).assign(value)


def fitted_model(
    model: keras.Model,
    config: OptimizerConfig,
    loss: str,
    metrics: str,
    plan: ShardPlan,
    states: Iterable[State],
    loss_scale: LossScale | None = None,
) -> bytes:
    """``model`` as ``fit`` leaves it: compiled with the run's optimizer, loss and metrics, its optimizer holding the
    reducers' state (``states``: each shard's, in order), as a ``.keras`` archive; where the run scaled its loss
    dynamically (``loss_scale``: the scale it ended with), a ``LossScaleOptimizer`` holding that scale wraps it."""
    losses, weights, _ = _loss_structure(loss)
    model.compile(
        optimizer=keras_optimizer(config, loss_scaled=loss_scale is not None),
        loss=_each(losses, _loss_leaf),
        loss_weights=weights,
        metrics=deserialize_metrics(metrics),
    )
    set_optimizer_state(model.optimizer, model, config, plan, states, loss_scale)
    return save_model(model)


def take_training(model: keras.Model, trained: keras.Model) -> None:
    """Compile ``model`` as ``trained`` (a model of the same weights) is compiled and give its optimizer the state
    of ``trained``'s, if that one was built (a run's final model, ``fitted_model``): ``fit`` continues from there."""
    optimizer = getattr(trained, "optimizer", None)
    if optimizer is None or not optimizer.built:
        return
    model.compile_from_config(trained.get_compile_config())
    model.optimizer.build(model.trainable_variables)
    for variable, value in zip(model.optimizer.variables, optimizer.variables, strict=True):
        variable.assign(value)


def _declared(model: keras.Model, side: str) -> Any:
    """The inputs (``side`` "input") or outputs ("output") a model was built with, in the structure it was given them
    (a dict, a list or one tensor); None where it declares none (a subclassed model not yet called)."""
    try:
        return getattr(model, side)
    except (AttributeError, ValueError):  # Keras's answer for a model without symbolic inputs or outputs
        return None


def input_names(model: keras.Model) -> list[str]:
    """The names by which the model takes named arrays as x, as ``fit`` matches a dict: the keys of a functional
    model's dict of inputs, else its inputs' names."""
    inputs = _declared(model, "input")
    if isinstance(inputs, dict):
        return list(inputs)
    return [str(t.name) for t in getattr(model, "inputs", None) or []]


def output_names(model: keras.Model) -> list[str]:
    """The names by which the model's outputs take named arrays as y (and name their losses and metrics)."""
    outputs = _declared(model, "output")
    if isinstance(outputs, dict):
        return list(outputs)
    return list(getattr(model, "output_names", None) or [])


def _leaf(value: Any) -> bool:
    """A loss or a metric (a name, an object, a serialized one, None) rather than a structure of them."""
    return not isinstance(value, list | tuple | dict) or (isinstance(value, dict) and "class_name" in value)


def _each(structure: Any, function: Any) -> Any:
    """``function`` of each loss or metric of a structure (by output: a dict or a list; of one output: a list)."""
    if _leaf(structure):
        return function(structure)
    if isinstance(structure, dict):
        return {name: _each(value, function) for name, value in structure.items()}
    return [_each(value, function) for value in structure]


def _by_output(model: keras.Model, structure: Any, what: str) -> Any:
    """A list per output as a dict by output name; BadInputError naming an output the model does not have."""
    names = output_names(model)
    if isinstance(structure, list | tuple) and len(names) > 1:
        if len(structure) != len(names):
            raise BadInputError(f"{what} lists {len(structure)} entries for the model's {len(names)} outputs")
        return dict(zip(names, structure, strict=True))
    if isinstance(structure, dict) and (unknown := sorted(set(structure) - set(names))):
        raise BadInputError(
            f"{what} names output{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} that the model"
            f" does not have (its outputs: {', '.join(map(repr, names)) or 'one, unnamed'})"
        )
    return structure


def loss_config(model: keras.Model, override: str | None) -> str:
    """The loss as JSON: a serialized Keras loss from ``override`` or the compiled model; a model of several
    outputs (or compiled with ``loss_weights``) has ``{"loss": …, "loss_weights": …}``, its loss by output name
    (or one for every output) and the weights as it was compiled with them."""
    loss = override if override is not None else getattr(model, "loss", None)
    if loss is None:
        raise BadInputError(f"the model is not compiled with a loss: give {_MISSING['loss']}")
    compiled = model.get_compile_config() if getattr(model, "compiled", False) else None
    weights = (compiled or {}).get("loss_weights")
    try:
        serialized = _each(
            _by_output(model, loss, "the loss"),
            lambda leaf: None if leaf is None else keras.losses.serialize(keras.losses.get(leaf)),
        )
    except (ValueError, TypeError) as error:
        known = [n for n in dir(keras.losses) if n.islower() and n not in {"get", "serialize", "deserialize"}]
        close = nearest(loss, known, 2) if isinstance(loss, str) else ""
        raise BadInputError(f"unknown loss {loss!r}{close}: {error}") from None
    if len(output_names(model)) <= 1 and weights is None and _leaf(serialized):
        return json.dumps(serialized)
    return json.dumps({"loss": serialized, "loss_weights": _by_output(model, weights, "loss_weights")})


def _loss_structure(config: str) -> tuple[Any, Any, bool]:
    """A run's loss (``loss_config``'s JSON) → (the serialized loss or losses, the loss weights: None for none,
    whether it is a compiled loss of several outputs or weights)."""
    stored = json.loads(config)
    if isinstance(stored, dict) and set(stored) == {"loss", "loss_weights"}:
        return stored["loss"], stored["loss_weights"], True
    return stored, None, False


def output_loss(config: str, output: str) -> Any:
    """The serialized loss that a run's loss (``loss_config``'s JSON) applies to ``output`` (None: none)."""
    losses = _loss_structure(config)[0]
    return losses if _leaf(losses) else losses.get(output)


def _loss_leaf(serialized: Any) -> Any:
    return None if serialized is None else keras.losses.deserialize(serialized)


def training_loss(config: str, model: keras.Model) -> Any:
    """A run's loss as ``fit`` computes it, called as ``loss(y, prediction, sample_weight=w)``: for one loss
    (``deserialize_loss``) the loss; for a model of several outputs Keras's compiled loss (``CompileLoss``): each
    output's loss on its labels (y by output name), times its loss weight, summed."""
    from keras.src.trainers.compile_utils import CompileLoss  # what compile() builds from loss and loss_weights

    losses, weights, compiled = _loss_structure(config)
    if not compiled:
        return deserialize_loss(config)
    return CompileLoss(_each(losses, _loss_leaf), weights, output_names=output_names(model) or None)


_MISSING = {
    "loss": "a loss (e.g. --loss sparse_categorical_crossentropy)",
    "optimizer": "an optimizer (e.g. --optimizer adam)",
}
# the same, to a Python caller (``slsml.fit``, ``slsml.tune``): its arguments, as ``compile`` takes them
ARGUMENTS_MISSING = {
    "loss": 'loss= (e.g. loss="sparse_categorical_crossentropy")',
    "optimizer": 'optimizer= (e.g. optimizer="adam")',
}
COMPILED = ("optimizer", "loss", "metrics", "loss_weights", "weighted_metrics")  # what compile takes that a run uses


def check_compiled(model: keras.Model, loss: bool, optimizer: bool, missing: dict[str, str] = _MISSING) -> None:
    """BadInputError naming, in one message, every piece of training that neither the model was compiled with
    nor the run gives (``loss``, ``optimizer``: the run gives one); ``missing``: how to give each (default: the
    flags)."""
    found = [
        missing[piece]
        for piece, given in (("loss", loss), ("optimizer", optimizer))
        if not given and getattr(model, piece, None) is None
    ]
    if found:
        raise BadInputError(f"the model is not compiled: give {' and '.join(found)}")


def compile_with(model: keras.Model, given: dict[str, Any]) -> None:
    """Compile ``model`` as ``compile`` does with the arguments ``given`` (``COMPILED``; None: not given) and the
    others it was compiled with (its optimizer itself, with its state); left as it is where nothing is given.
    BadInputError naming an optimizer the reducers do not apply, or what ``compile`` refuses."""
    given = {name: value for name, value in given.items() if value is not None}
    if not given:
        return
    optimizer = given.get("optimizer")
    if isinstance(optimizer, str):
        given["optimizer"] = optimizer_named(optimizer, "or a keras.optimizers instance")
    kept: dict[str, Any] = {}
    if getattr(model, "compiled", False):
        config = keras.saving.deserialize_keras_object(model.get_compile_config())
        kept = {name: config.get(name) for name in COMPILED} | {"optimizer": model.optimizer}
    try:
        model.compile(**(kept | given))
    except (ValueError, TypeError) as error:
        raise BadInputError(f"compile refuses {', '.join(f'{n}=' for n in given)}: {error}") from None


def stored_arguments(given: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``compile`` ``given`` (None: not given) as JSON, to compile other models with later
    (``compile_with(model, revived_arguments(stored))``): names as they are, objects (an optimizer, a loss, a metric)
    as Keras serializes them. BadInputError naming one Keras cannot serialize."""
    stored: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            continue
        try:
            stored[name] = keras.saving.serialize_keras_object(value)
        except (TypeError, ValueError) as error:
            raise BadInputError(f"{name}={value!r}: Keras cannot save it ({error})") from None
    return stored


def revived_arguments(stored: dict[str, Any]) -> dict[str, Any]:
    """``stored_arguments``' JSON as ``compile`` takes it: each object Keras serialized made anew (an optimizer a
    fresh instance, with no state)."""

    def revived(value: Any) -> Any:
        if isinstance(value, dict) and "class_name" in value:
            return keras.saving.deserialize_keras_object(value)
        if isinstance(value, dict):
            return {key: revived(item) for key, item in value.items()}
        if isinstance(value, list):
            return [revived(item) for item in value]
        return value

    return {name: revived(value) for name, value in stored.items()}


def deserialize_loss(config: str) -> keras.losses.Loss:
    """A mean-reduced Keras loss as ``compile`` makes it: a plain loss function is wrapped as a Loss, which
    squeezes or expands the labels to the rank of the predictions ((n,) against (n, 1)) and averages over the
    batch."""
    from keras.src.losses.losses import LossFunctionWrapper  # what compile() wraps a loss function in

    loss = keras.losses.deserialize(json.loads(config))
    return loss if isinstance(loss, keras.losses.Loss) else LossFunctionWrapper(loss)


def deserialize_metrics(config: str) -> Any:
    """The metrics of a run (JSON: names, or Keras's serialized metrics; a list, or lists by output name) as
    ``compile`` takes them."""
    return _each(json.loads(config), lambda m: m if isinstance(m, str) or m is None else keras.metrics.deserialize(m))


def classifies(loss: str) -> bool:
    """Whether a run's loss (``loss_config``'s JSON) is a cross-entropy: its labels are classes."""
    return "crossentropy" in json.dumps(json.loads(loss)).lower()


def metrics_config(model: keras.Model, classification: bool) -> str:
    """The metrics a run evaluates, as JSON: those the model was compiled with (a list; for a model of several
    outputs, lists by output name), else accuracy for a classifier of one output."""
    compiled = model.get_compile_config() if getattr(model, "compiled", False) else None
    metrics = (compiled or {}).get("metrics")
    if metrics is None:
        return json.dumps(["accuracy"] if classification and len(output_names(model)) <= 1 else [])
    if (compiled or {}).get("weighted_metrics"):
        raise BadInputError("the model is compiled with weighted metrics: slsml evaluates its metrics unweighted")
    return json.dumps(
        _each(
            _by_output(model, metrics, "the metrics"),
            lambda m: keras.metrics.serialize(m) if isinstance(m, keras.metrics.Metric) else m,
        )
    )


@dataclass
class Update:
    vector: np.ndarray  # gradient for trainable weights, new values for non-trainable ones
    loss: float
    metrics: np.ndarray | None = None  # the state of the loss and metrics over its batches (Trainer.meter's), summed


# a batch's labels, its forward pass, its samples' weights and its loss → the state of its metrics
Meter = Callable[[Arrays, Any, Any, float], np.ndarray]


def _layers(model: keras.Model) -> list[Any]:
    """The model and every layer within it, its inputs' layers left out (their dtype is the data's)."""
    return [
        layer
        for layer in model._flatten_layers(include_self=True, recursive=True)
        if not isinstance(layer, keras.layers.InputLayer)
    ]


def computes_float16(model: keras.Model) -> bool:
    """Whether a layer of the model computes in float16 (mixed_float16): its gradients need loss scaling."""
    return any(layer.dtype_policy.compute_dtype == "float16" for layer in _layers(model))


def check_policy(model: Any, policy: str | None) -> None:
    """BadInputError where ``model`` was built under a mixed-precision policy other than ``policy``
    (``TrainingSpec.mixed_precision``): it trains under its own only."""
    _mixed({layer.dtype_policy.name for layer in _layers(model)}, policy)


def _mixed(policies: set[str], policy: str | None) -> set[str]:
    """The mixed-precision policies of ``policies`` (a model's layers'); BadInputError if ``policy`` is another."""
    built = {name for name in policies if name.startswith("mixed_")}
    if policy is not None and built and built != {policy}:
        raise BadInputError(
            f"the model computes under {', '.join(sorted(built))}: it cannot train under mixed_precision {policy}"
            " (give a model saved in float32, or leave mixed_precision out)"
        )
    return built


class Trainer:
    """A warm model for one run: set its weights, compute an update or evaluate."""

    def __init__(self, model: keras.Model, plan: ShardPlan, loss: str) -> None:
        self.model = model
        self.plan = plan
        self.loss_fn = training_loss(loss, model)
        self._trainable_index = {id(v): i for i, v in enumerate(model.trainable_weights)}
        self._step = tf.function(self._step_fn, reduce_retracing=True)
        self._writer: ArchiveWriter | None = None
        self.evaluators: dict[str, Any] = {}  # a run's metrics (JSON) → its evaluation.Evaluator, built once
        self.meter: Meter | None = None  # tracks each batch's metrics on its forward pass (None: none)
        self.scaling: Scaling | None = None  # the loss scaling of each batch's gradient (None: none)
        self.draws: Draws | None = None  # sets the random generators for each batch (None: they go on as they are)
        self._own = [(layer, layer.dtype_policy) for layer in _layers(model)]  # the policies it was built with
        self.policy: str | None = None  # the mixed-precision policy it computes under (None: its own)

    def use_policy(self, policy: str | None) -> None:
        """Compute under the mixed-precision ``policy`` (``TrainingSpec.mixed_precision``), as the model built under
        it would: each layer that computes in float32 computes under it, its weights staying float32; None: under
        the model's own policies. A model built under a mixed policy keeps its own: BadInputError for another."""
        built = _mixed({own.name for _, own in self._own}, policy)
        wanted = None if built else policy
        if wanted == self.policy:
            return
        for layer, own in self._own:
            layer.dtype_policy = wanted if wanted is not None and own.name == "float32" else own
        self.policy = wanted
        self._step = tf.function(self._step_fn, reduce_retracing=True)  # traced anew: its dtypes change
        self.evaluators.clear()
        self._writer = None

    @property
    def float16(self) -> bool:
        """Whether the model computes in float16 under the policy it uses (its loss then needs scaling)."""
        return computes_float16(self.model)

    def save(self) -> bytes:
        """The model as a ``.keras`` archive (an ``ArchiveWriter``'s: only its weights change between saves)."""
        if self._writer is None:
            self._writer = ArchiveWriter(self.model)
        return self._writer.save()

    def _step_fn(
        self, x: tf.Tensor, y: tf.Tensor, w: tf.Tensor | None, factor: tf.Tensor
    ) -> tuple[tf.Tensor, list[tf.Tensor], Any]:
        with tf.GradientTape() as tape:
            prediction = self.model(x, training=True)
            loss = self.loss_fn(y, prediction, sample_weight=w)  # Σ wᵢ·lossᵢ / n, as fit weights a batch
            if self.model.losses:
                loss = loss + tf.add_n(self.model.losses)
            scaled = loss * factor  # the loss scale (1: none), as LossScaleOptimizer.scale_loss multiplies it
        gradients = tape.gradient(scaled, self.model.trainable_weights)
        return loss, gradients, prediction

    def untrained_values(self) -> list[np.ndarray]:
        """The values of the model's weights that are not trained (a BatchNormalization's moving statistics)."""
        return [np.asarray(v.numpy()) for v in self.model.weights if id(v) not in self._trainable_index]

    def restore_untrained(self, values: list[np.ndarray]) -> None:
        """Set the weights that are not trained to ``values`` (``untrained_values``'s)."""
        untrained = [v for v in self.model.weights if id(v) not in self._trainable_index]
        for variable, value in zip(untrained, values, strict=True):
            variable.assign(value)

    def compute_update(self, x: Arrays, y: Arrays, w: np.ndarray | None = None) -> Update:
        """The gradient of the batch's loss, each sample's weighted by ``w`` (None: unweighted), with the state of
        its metrics (``meter``'s) on the forward pass that gave it, its random generators set by ``draws``; x and y
        each one array or named arrays (by the model's input and output names). With ``scaling``, the loss is
        multiplied by its factor for the batch before the gradient is computed and the gradient divided by it (float32,
        as ``LossScaleOptimizer`` unscales it)."""
        weights = None if w is None else tf.convert_to_tensor(w)
        xt, yt = tf.nest.map_structure(tf.convert_to_tensor, x), tf.nest.map_structure(tf.convert_to_tensor, y)
        if self.draws is not None:
            self.draws.next()
        if not getattr(self.loss_fn, "built", True):  # a compiled loss makes its trackers once, outside the graph
            self.loss_fn(yt, self.model(xt, training=False))
        factor = np.float32(1.0 if self.scaling is None else self.scaling.factor(samples.count(y)))
        loss, gradients, prediction = self._step(xt, yt, weights, tf.constant(factor))
        arrays = []
        for variable in self.model.weights:
            index = self._trainable_index.get(id(variable))
            if index is None:
                arrays.append(np.asarray(variable.numpy()))
            elif gradients[index] is None:
                arrays.append(np.zeros(variable.shape, dtype=np.float32))
            elif factor == 1:
                arrays.append(np.asarray(tf.convert_to_tensor(gradients[index])))
            else:
                arrays.append(np.asarray(tf.convert_to_tensor(gradients[index])) / factor)
        return Update(
            vector=self.plan.flatten(arrays),
            loss=float(loss),
            metrics=None if self.meter is None else self.meter(y, prediction, weights, float(loss)),
        )


@dataclass(frozen=True)
class InputSpec:
    """One input of a model: its name, its shape with the batch dimension (None: any size) and its dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str


def model_inputs(model: keras.Model) -> list[InputSpec] | None:
    """The inputs a model declares, by the names it takes named arrays by; None for a subclassed model, which
    declares none."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    struct = _declared(model, "input")
    named = struct.items() if isinstance(struct, dict) else [(str(t.name), t) for t in inputs]
    return [InputSpec(name=name, shape=tuple(t.shape), dtype=str(t.dtype)) for name, t in named]


def _shape(shape: tuple[int | None, ...]) -> str:
    return f"({', '.join(str(d) for d in shape)}{',' if len(shape) == 1 else ''})"


def _kind(dtype: str) -> str:
    """numpy's kind of a Keras dtype name ("f", "i", "u", "b"; "?" for others, e.g. strings)."""
    if "float" in dtype:  # bfloat16 too, which numpy does not know
        return "f"
    try:
        return np.dtype(dtype).kind
    except TypeError:
        return "?"


def input_mismatch(
    inputs: list[InputSpec], x_shape: tuple[int, ...], x_dtype: str, x_range: tuple[float, float] | None
) -> str | None:
    """Why data of per-sample shape ``x_shape`` and dtype ``x_dtype`` (values within ``x_range``, if known)
    cannot be a model's input, naming both shapes and dtypes; None if it can.

    Dimensions the model leaves free (None) take any size. Integer or boolean data may feed a float input
    (it is cast exactly, up to 2**24 in float32); an integer input takes integer or boolean data whose values
    its dtype holds (by ``x_range``, else by the data's dtype), never float data (the cast would truncate it);
    a boolean input takes boolean data only."""
    if len(inputs) != 1:
        named = "; ".join(f"{i.name!r} {_shape(i.shape[1:])} {i.dtype}" for i in inputs)
        return (
            f"the model takes {len(inputs)} inputs ({named}) and the dataset holds one array x: give x as named"
            " arrays, one per input (a dict by input name from Python, x_<name> arrays in an .npz)"
        )
    return _mismatch(inputs[0], x_shape, x_dtype, x_range)


def named_inputs_mismatch(inputs: list[InputSpec], arrays: dict[str, tuple[tuple[int, ...], str, Any]]) -> str | None:
    """``input_mismatch`` for x of named arrays (name → per-sample shape, dtype and range), matched to the
    model's inputs by name as ``fit`` matches a dict: the names that do not match, or each input's problem."""
    wanted = [i.name for i in inputs]
    if set(arrays) != set(wanted):
        unknown, missing = [n for n in arrays if n not in wanted], [n for n in wanted if n not in arrays]
        problems = []
        if unknown:
            problems.append(f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} no input of it")
        if missing:
            problems.append(f"{', '.join(map(repr, missing))} {'has' if len(missing) == 1 else 'have'} no array")
        return (
            f"the data's inputs do not match the model's by name: {'; '.join(problems)} (the model takes"
            f" {', '.join(map(repr, wanted))}; the data has {', '.join(map(repr, arrays))})"
        )
    found = [_mismatch(spec, *arrays[spec.name]) for spec in inputs]
    return "; ".join(problem for problem in found if problem) or None


def _mismatch(
    spec: InputSpec, x_shape: tuple[int, ...], x_dtype: str, x_range: tuple[float, float] | None
) -> str | None:
    """Why samples of ``x_shape``, ``x_dtype`` (within ``x_range``) cannot be model input ``spec``; None if they
    can."""
    wanted, kind, given = spec.shape[1:], _kind(spec.dtype), np.dtype(x_dtype)
    problems = []
    if len(wanted) != len(x_shape) or any(w is not None and w != d for w, d in zip(wanted, x_shape, strict=False)):
        if len(wanted) == len(x_shape) == 1:
            problems.append(f"{x_shape[0]} features where the model takes {wanted[0]}")
        elif len(wanted) != len(x_shape):
            problems.append(f"samples of {len(x_shape)} dimensions where the model takes {len(wanted)}")
        else:
            dims = [
                f"dimension {i + 1}: {d} vs {w}"
                for i, (w, d) in enumerate(zip(wanted, x_shape, strict=True))
                if w is not None and w != d
            ]
            problems.append(", ".join(dims))
    if kind in "iu":
        if given.kind in "fc":
            problems.append(f"{given} data for an integer input: the cast would truncate it; give integers")
        elif given.kind in "iu":
            info = np.iinfo(spec.dtype)
            low, high = x_range if x_range is not None else (np.iinfo(given).min, np.iinfo(given).max)
            if low < info.min or high > info.max:
                where = f"values from {low:g} to {high:g}" if x_range is not None else f"{given} values"
                problems.append(f"{where} do not fit {spec.dtype} ({info.min} to {info.max})")
    elif kind == "b" and given.kind != "b":
        problems.append(f"{given} data for a boolean input")
    elif kind not in "fb":
        problems.append(f"inputs of dtype {spec.dtype} are not supported")
    if not problems:
        return None
    return (
        f"samples of shape {_shape(x_shape)} {given} vs model input {spec.name!r} of shape {_shape(wanted)}"
        f" {spec.dtype}: {'; '.join(problems)}"
    )


def check_fits(
    model: keras.Model,
    loss: str,
    x: Arrays,
    y: Arrays,
    classes: int | None,
    x_range: tuple[float, float] | dict[str, tuple[float, float] | None] | None = None,
) -> None:
    """Raise BadInputError unless the data's samples (shape and dtype, values within ``x_range``: default those
    of ``x``; of each named array, for named arrays) fit the model's declared inputs, named arrays matched to the
    inputs and outputs by name, and a forward pass and the loss run on a few of them."""
    inputs = model_inputs(model)
    if inputs is not None:
        if isinstance(x, dict):
            ranges = x_range if isinstance(x_range, dict) else {}
            arrays = {name: (a.shape[1:], str(a.dtype), ranges.get(name) or _range(a)) for name, a in x.items()}
            problem = named_inputs_mismatch(inputs, arrays)
        else:
            problem = input_mismatch(
                inputs, x.shape[1:], str(x.dtype), x_range if isinstance(x_range, tuple) else _range(x)
            )
        if problem:
            raise BadInputError(f"the data does not fit the model: {problem}; {FIT_DATA}")
    outputs = output_names(model)
    if isinstance(y, dict) and set(y) != set(outputs):
        raise BadInputError(
            f"the data's labels do not match the model's outputs by name: the data has {', '.join(map(repr, y))};"
            f" the model's outputs are {', '.join(map(repr, outputs)) or 'one, unnamed'}"
        )
    if not isinstance(y, dict) and len(outputs) > 1:
        raise BadInputError(
            f"the model has {len(outputs)} outputs ({', '.join(map(repr, outputs))}) and the dataset holds one"
            " array y: give y as named arrays, one per output (a dict by output name from Python, y_<name>"
            " arrays in an .npz)"
        )
    width = model.output_shape[-1] if isinstance(model.output_shape, tuple) else None
    if classes is not None and width is not None and width > 1 and classes > width:
        raise BadInputError(
            f"labels go up to {classes - 1} but the model has only {width} outputs (classes 0 to {width - 1})"
        )
    if not isinstance(y, dict) and width is not None and (problem := _label_form(loss, y, width)):
        raise BadInputError(problem)
    try:
        prediction = model(samples.take(x, slice(2)), training=False)
        float(training_loss(loss, model)(samples.take(y, slice(2)), prediction))
    except Exception as error:
        raise BadInputError(
            f"the data does not fit the model: samples of x {samples.describe(x)} / y {samples.describe(y)}"
            f" vs model input {model.input_shape}: {str(error).splitlines()[0][:300]}; {FIT_DATA}"
        ) from None


def _label_form(loss: str, y: np.ndarray, width: int) -> str | None:
    """Where a categorical cross-entropy meets labels of the other form (Keras's most common mix-up): what to give."""
    losses, _, several = _loss_structure(loss)
    named = json.dumps(losses).lower().replace("_", "")
    if several or "categoricalcrossentropy" not in named or width < 2:
        return None
    ids, one_hot = y.shape[1:] in {(), (1,)}, y.shape[1:] == (width,)
    if "sparsecategorical" in named and one_hot:  # (width ≥ 2: not also ids)
        return (
            f"the labels are one-hot ({width} columns) but loss sparse_categorical_crossentropy takes class ids:"
            " compile the model with loss='categorical_crossentropy', or give the labels as class ids (y.argmax(-1))"
        )
    if "sparsecategorical" not in named and ids:
        return (
            f"the labels are class ids (one number a sample) but loss categorical_crossentropy takes one-hot labels"
            f" of the model's {width} classes: compile the model with loss='sparse_categorical_crossentropy', or give"
            f" one-hot labels (keras.utils.to_categorical(y, {width}))"
        )
    return None


def _range(x: np.ndarray) -> tuple[float, float] | None:
    """The smallest and the largest value of integer or boolean samples (None: others, or none)."""
    return (float(x.min()), float(x.max())) if len(x) and x.dtype.kind in "iub" else None
