"""``slsml.fit``: Keras's ``model.fit`` through the pipeline, from Python (a script, a notebook).

The data (arrays, dicts of arrays, a ``tf.data.Dataset``, a generator or ``keras.utils.PyDataset`` of ``(x, y[,
sample_weight])``) is streamed batch by batch into a dataset (``DatasetWriter``: bounded memory) in a local runtime of
the call's own (or in a deployed stack's bucket); the run trains ``epochs`` epochs of ``batch_size`` global batches
(the last one of an epoch smaller where the samples do not fill it, as Keras trains it), the model takes the final
weights and its optimizer's state in place, and the result is a ``keras.callbacks.History`` as ``fit`` returns it:
per epoch, the loss and compiled metrics over the batches of its iterations (their states summed over the epoch, as
Keras sums them over an epoch's batches) and the figures of the validation samples at its end (``val_`` forms).
While the run trains, ``fit`` shows what Keras shows, from the run's iteration records: ``Epoch k/N``, a bar per epoch
with the epoch's running figures, and its final line with the ``val_`` figures, which History holds. The local runtime
ends with the call, however the call ends.
"""

from __future__ import annotations

import inspect
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slsml.client import runs
from slsml.client.arguments import check_keywords, said_as_keywords, training_spec
from slsml.data.sources.base import validate_arrays
from slsml.data.writer import DatasetWriter
from slsml.pipeline import launch
from slsml.pipeline.services import Services
from slsml.spec import samples
from slsml.spec.config import RunConfig, TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError
from slsml.spec.samples import Arrays
from slsml.state.records import Counter, RunRecord

DEFAULT_BATCH = 32  # Keras's batch_size, left out
SAVED_POLL_S = 0.1  # between reads of whether an epoch's model is stored
UPLOAD_BATCH = 1024  # samples of an unbatched dataset read at once while it is uploaded
Chunk = tuple[Arrays, Arrays, np.ndarray | None]  # samples' x, y and weights (None: none)
Figures = Callable[[list[np.ndarray]], dict[str, float]]


@dataclass
class Data:
    """What ``fit`` was given as data, as chunks of samples: ``first`` (read already), then ``rest``; ``batch``: the
    batch size the data comes in (a batched dataset's, a generator's first batch; None: arrays)."""

    first: Chunk
    rest: Iterator[Chunk]
    batch: int | None

    def chunks(self) -> Iterator[Chunk]:
        return itertools.chain([self.first], self.rest)


@said_as_keywords
def fit(
    model: Any,
    x: Any = None,
    y: Any = None,
    batch_size: int | None = None,
    epochs: int = 1,
    verbose: int | str = "auto",
    callbacks: Sequence[Any] = (),
    validation_split: float | None = None,
    validation_data: Any = None,
    sample_weight: np.ndarray | None = None,
    steps_per_epoch: int | None = None,
    loss: Any = None,
    optimizer: Any = None,
    metrics: Any = None,
    loss_weights: Any = None,
    stack: str | None = None,
    pool: int | None = None,
    shuffle: bool | str = True,
    initial_epoch: int = 0,
    validation_steps: int | None = None,
    validation_batch_size: int | None = None,
    validation_freq: int = 1,
    **options: Any,
) -> Any:
    """Train ``model`` (compiled, or given ``loss`` and ``optimizer``) on ``x``, ``y`` as ``model.fit`` would: each an
    array, or for a model of several inputs or outputs a dict of arrays by input and output name; or ``x`` a
    ``tf.data.Dataset`` (batched or not), a generator or a ``keras.utils.PyDataset`` of ``(x, y)`` or ``(x, y,
    sample_weight)`` and no ``y``. ``batch_size`` samples per iteration spread over the workers (left out: a batched
    dataset's or a generator's own batch size, else 32), each sample's loss weighted by ``sample_weight`` (or
    ``class_weight=``) as ``fit`` weights it. ``validation_data``: ``(x, y[, sample_weight])`` or a dataset or
    generator as ``x`` takes; ``validation_split``: arrays only, as Keras. ``steps_per_epoch``: for a dataset or
    generator, an epoch is its first ``steps_per_epoch`` batches (needed for one without an end: a repeated dataset).
    ``validation_split``: the last fraction of the samples, before shuffling, as Keras holds them out (or drawn by the
    seed: ``validation_samples="seeded"``). ``loss``, ``optimizer`` (a name or a ``keras.optimizers`` instance),
    ``metrics``, ``loss_weights``: as ``compile`` takes them, for a model not compiled or to override what it was
    compiled with (the model is compiled with them, the rest as it was). ``verbose``: 0 silent, 1 (``"auto"``) a bar
    per epoch, 2 one line per epoch. ``options``: any other TrainingSpec field (``workers=8``, ``reducers=2``,
    ``quorum=0.75``…; another keyword is a TypeError naming the closest one; ``early_stopping="val_loss:3"`` and
    ``keep_best="val_auc"``: the run's own early stopping and best model, which ``callbacks`` may also give as Keras's
    EarlyStopping). ``callbacks`` also takes ModelCheckpoint saving at epochs' ends, CSVLogger, LambdaCallback and
    callbacks of the caller's own whose hooks are the training's and its epochs' (``on_epoch_end``…): told as Keras
    tells them, the model holding each epoch's weights at its end; one that sets ``model.stop_training`` stops the run
    after that epoch, as Keras stops. Returns a ``keras.callbacks.History``; the model holds the trained weights.
    ``stack``: train on the deployed stack of this name; else on the local service if one is up (``slsml local up``),
    else on a local runtime of the call's own, whose warm processes per function ``pool`` bounds (as ``--pool``;
    default: ``SLSML_POOL``, else what the machine holds). Keras's ``shuffle=True`` (each epoch's batches drawn anew, by
    ``seed=``; or slsml's order, ``"global"`` or ``"blocks"``), ``initial_epoch=0``, ``validation_freq=1`` and
    ``validation_batch_size`` (the figures do not depend on it) are taken as Keras takes them; ``shuffle=False``, a
    later initial epoch, a sparser validation or ``validation_steps`` are refused, saying what slsml does instead."""
    import keras

    from slsml.training import evaluation, modelio, stages

    check_keywords("fit", options, FIT_ARGUMENTS)
    options |= _keras_options(shuffle, initial_epoch, validation_steps, validation_freq)
    if pool is not None and stack is not None:
        raise BadInputError(f"pool={pool} sizes the local runtime fit starts: a stack's functions are deployed")
    level = 1 if verbose == "auto" else int(verbose)
    if validation_split == 0:  # Keras's default
        validation_split = None
    x, y, validation_data = _by_names(model, x, y, validation_data)
    train = training_data(x, y, sample_weight, steps_per_epoch)
    if validation_split is not None and train.batch is not None:
        raise BadInputError(
            "validation_split is for arrays: give a dataset's or a generator's validation samples as validation_data"
        )
    validation = validation_chunks(validation_data)
    if batch_size is not None and batch_size < 1:  # Keras divides by it
        raise BadInputError(f"batch_size={batch_size}: give the samples of a step, 1 or more (or leave it out: 32)")
    batch = batch_size or train.batch or DEFAULT_BATCH
    fit_options = options | callback_options(callbacks)
    spec = _options_spec(batch, epochs, validation, validation_split, fit_options)  # before anything is stored
    compiled = {"loss": loss, "optimizer": optimizer, "metrics": metrics, "loss_weights": loss_weights}
    modelio.compile_with(model, compiled)
    modelio.check_model_portable(model)  # code of its own the functions cannot run
    # the data against the model before anything is stored (prepare_run checks it again, with the whole data's range)
    modelio.check_compiled(model, loss=False, optimizer=False, missing=modelio.ARGUMENTS_MISSING)
    modelio.optimizer_config(model)  # one the reducers apply
    if (why := stages.refusal(model, spec.pipeline_stages)) is not None:  # a model with too few cut points
        raise BadInputError(why)
    first_x, first_y, _ = train.first
    modelio.check_fits(model, modelio.loss_config(model, None), first_x, first_y, None)
    run_id = launch.new_run_id("fit")
    named = "test" if validation is not None else "val" if validation_split is not None else None
    job = _Job(modelio.save_model(model), run_id, epochs, batch, validation, validation_split, fit_options, named)
    job.verbose = level
    watching = [c for c in callbacks if observes(c)]
    if watching:
        job.observers = keras.callbacks.CallbackList(watching, model=model, epochs=epochs, verbose=level)
        job.epoch_weights = any(not isinstance(c, keras.callbacks.CSVLogger) for c in watching)
    shown = [(samples.take(first_x, slice(2)), samples.take(first_y, slice(2)))]

    def figures(config: RunConfig) -> Figures:  # the loss and metrics of summed train states, as the workers sum them
        return evaluation.Evaluator(model, config.loss, config.metrics, shown[0]).result

    from slsml.local import service

    if stack is not None:
        from slsml.client.stack import services_for_stack

        epochs_shown = job.train(services_for_stack(stack), train, figures)
    elif (state := service.status()) is not None:  # as a run given no target: its warm processes started already
        if level:
            print(f"running on the local service at {state.endpoint} (no stack given)", file=sys.stderr)
        with service.connected(state) as services:
            epochs_shown = job.train(services, train, figures)
    else:
        from slsml.local.runtime import LocalRuntime, sized_for

        with LocalRuntime(
            **sized_for(spec),
            pool=pool,
            log_dir=Path(".slsml/logs") / run_id,
        ) as local:
            epochs_shown = job.train(local.services, train, figures)
    trained = _take_weights(model, job.final)
    modelio.take_training(model, trained)  # the optimizer's state as fit leaves it
    if job.observers is not None:
        job.observers.on_train_end(epochs_shown[-1] if epochs_shown else None)
    history = keras.callbacks.History()
    history.set_model(model)
    history.params = {"verbose": verbose, "epochs": epochs, "steps": job.per_epoch}
    history.epoch = list(range(len(epochs_shown)))
    history.history = {}
    for epoch_figures_ in epochs_shown:
        for name, value in epoch_figures_.items():
            history.history.setdefault(name, []).append(value)
    return history


FIT_ARGUMENTS = tuple(inspect.signature(fit).parameters)[:-1]  # its own keywords (not ``options``)


def _keras_options(
    shuffle: bool | str, initial_epoch: int, validation_steps: int | None, validation_freq: int
) -> dict[str, Any]:
    """The training options of Keras's ``fit`` keywords that slsml takes as Keras does (``shuffle=True``: the run's
    own order; a name: slsml's order); BadInputError, saying what slsml does, for those it does not."""
    if shuffle is False:
        raise BadInputError(
            "shuffle=False: slsml draws each epoch's global batches anew (from seed=, the same for every run of it);"
            ' leave shuffle out, or give shuffle="blocks" for its block order'
        )
    if initial_epoch:
        raise BadInputError(
            f"initial_epoch={initial_epoch}: a fit trains from its first epoch; to go on with a model it trained,"
            " fit it again (its weights and its optimizer's state are the model's)"
        )
    if validation_steps is not None:
        raise BadInputError(
            f"validation_steps={validation_steps}: slsml validates on every sample of validation_data; leave it out"
            " (or give fewer samples)"
        )
    if validation_freq != 1:
        raise BadInputError(
            f"validation_freq={validation_freq}: slsml validates at the end of every epoch; leave it out"
        )
    return {} if shuffle is True else {"shuffle": shuffle}


def training_data(x: Any, y: Any, weights: Any, steps: int | None) -> Data:
    """``fit``'s training data as chunks (``Data``); BadInputError naming what it cannot take."""
    if _streamed(x):
        if y is not None or weights is not None:
            raise BadInputError(
                f"x is a {type(x).__name__}, which holds its labels (and sample weights): give no y or sample_weight"
            )
        return _stream(x, "x", steps)
    if x is None or y is None:
        raise BadInputError("fit needs x and y (arrays), or x a dataset or generator of (x, y) or (x, y, weights)")
    if steps is not None:
        raise BadInputError(
            "steps_per_epoch is for a dataset or generator: an epoch of arrays is all their samples (leave it out)"
        )
    chunk = samples.as_arrays(x, "x"), samples.as_arrays(y, "y"), None if weights is None else np.asarray(weights)
    validate_arrays(chunk[0], chunk[1], "training data")  # before anything starts: the upload checks it again
    return Data(chunk, iter(()), None)


def _by_names(model: Any, x: Any, y: Any, validation: Any) -> tuple[Any, Any, Any]:
    """``x``, ``y`` and the ``validation`` data's with each list of arrays for a model of several inputs or outputs
    named (``_by_name``)."""
    from slsml.training import modelio

    inputs, outputs = modelio.input_names(model), modelio.output_names(model)
    if isinstance(validation, tuple | list) and len(validation) in (2, 3):
        named = _by_name(inputs, validation[0], "validation x"), _by_name(outputs, validation[1], "validation y")
        validation = (*named, *validation[2:])
    return _by_name(inputs, x, "x"), _by_name(outputs, y, "y"), validation


def _by_name(names: list[str], arrays: Any, what: str) -> Any:
    """A list or tuple of arrays for a model of several inputs (or outputs: ``names``) as Keras's ``fit`` takes it,
    in their order, as named arrays; anything else as it is."""
    if len(names) < 2 or not isinstance(arrays, list | tuple):
        return arrays
    if len(arrays) != len(names):
        raise BadInputError(
            f"{what} is a list of {len(arrays)} arrays and the model has {len(names)} ({', '.join(names)}): give one"
            " array each, in their order, or a dict of them by name"
        )
    return dict(zip(names, arrays, strict=True))


def validation_chunks(validation: Any) -> Iterable[Chunk] | None:
    """The validation samples ``fit`` was given, as chunks (None: none): ``(x, y[, w])`` or a dataset or generator."""
    if validation is None:
        return None
    if _streamed(validation):
        return _stream(validation, "validation_data", None).chunks()
    if not isinstance(validation, tuple | list) or len(validation) not in (2, 3):
        raise BadInputError(
            f"validation_data is a {type(validation).__name__}: give (x, y), (x, y, sample_weight), or a dataset or"
            " generator of them"
        )
    x, y = samples.as_arrays(validation[0], "validation x"), samples.as_arrays(validation[1], "validation y")
    weights = np.asarray(validation[2]) if len(validation) == 3 and validation[2] is not None else None
    return [(x, y, weights)]


def _streamed(value: Any) -> bool:
    """Whether ``value`` is data read batch by batch: a ``tf.data.Dataset``, a ``PyDataset``, a generator or any
    iterator (not arrays, dicts or tuples of them)."""
    if value is None or isinstance(value, np.ndarray | Mapping | tuple | list):
        return False
    return _is_dataset(value) or _is_py_dataset(value) or isinstance(value, Iterator)


def _is_dataset(value: Any) -> bool:
    if "tensorflow" not in type(value).__module__:
        return False
    import tensorflow as tf

    return isinstance(value, tf.data.Dataset)


def _is_py_dataset(value: Any) -> bool:
    import keras

    return isinstance(value, keras.utils.PyDataset)


def _stream(source: Any, what: str, steps: int | None) -> Data:
    """A dataset's, a PyDataset's or a generator's batches as chunks, read as they are uploaded; BadInputError where
    it yields nothing, something else than ``(x, y[, w])``, or has no end and no ``steps``."""
    batch: int | None = None
    if _is_dataset(source):
        import tensorflow as tf

        batch = _dataset_batch(source)
        cardinality = int(source.cardinality())
        if cardinality == tf.data.INFINITE_CARDINALITY and steps is None:
            raise BadInputError(
                f"{what}: the dataset repeats without end: give steps_per_epoch (its batches an epoch), or leave"
                " out its .repeat()"
            )
        if batch is None and not _batched(source):  # single samples, read in batches as they are uploaded
            if steps is not None:
                raise BadInputError(
                    f"{what}: steps_per_epoch counts batches: give the dataset batched (.batch(n)), or leave it out"
                )
            source = source.batch(UPLOAD_BATCH)
            batch = -1  # the data has no batch size of its own
        elif steps is not None:
            source = source.take(steps)
        batches: Iterator[Any] = iter(source.as_numpy_iterator())
    elif _is_py_dataset(source):
        count = len(source) if steps is None else min(steps, len(source))
        batches = (source[i] for i in range(count))
    else:
        batches = iter(source) if steps is None else itertools.islice(source, steps)
    chunks = (_chunk(element, what) for element in batches)
    try:
        first = next(chunks)
    except StopIteration:
        raise BadInputError(f"{what}: the {type(source).__name__} yields no batch") from None
    own = batch or samples.count(first[0])
    return Data(first, chunks, None if own == -1 else own)


def _dataset_batch(dataset: Any) -> int | None:
    """The batch size a ``tf.data.Dataset`` was batched with (``.batch(n)``, through the datasets built on it: map,
    prefetch, …), None where it was not."""
    while dataset is not None:
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            return int(size)
        dataset = getattr(dataset, "_input_dataset", None)
    return None


def _batched(dataset: Any) -> bool:
    """Whether a dataset's elements are batches: their leading dimension is unknown (batched some other way)."""
    import tensorflow as tf

    shapes = [spec.shape for spec in tf.nest.flatten(dataset.element_spec)]
    return bool(shapes) and all(shape.rank and shape[0] is None for shape in shapes)


def _chunk(element: Any, what: str) -> Chunk:
    """A batch ``(x, y)`` or ``(x, y, sample_weight)`` as arrays; BadInputError naming anything else."""
    if not isinstance(element, tuple | list) or len(element) not in (2, 3):
        form = f"a tuple of {len(element)}" if isinstance(element, tuple | list) else type(element).__name__
        raise BadInputError(f"{what} yields {form}: fit takes batches of (x, y) or (x, y, sample_weight)")
    x, y = samples.as_arrays(element[0], f"{what} x"), samples.as_arrays(element[1], f"{what} y")
    weights = np.asarray(element[2]) if len(element) == 3 and element[2] is not None else None
    return x, y, weights


def _like(arrays: Arrays, first: Arrays) -> Arrays:
    """``arrays`` in the dtypes of the training data's ``first`` (validation arrays of another float width)."""
    if isinstance(arrays, dict) and isinstance(first, dict):
        return {k: a.astype(first[k].dtype, copy=False) if k in first else a for k, a in arrays.items()}
    if isinstance(arrays, np.ndarray) and isinstance(first, np.ndarray):
        return arrays.astype(first.dtype, copy=False)
    return arrays


def callback_options(callbacks: Sequence[Any]) -> dict[str, Any]:
    """The training options of Keras callbacks ``fit`` takes: EarlyStopping (``restore_best_weights``: the best model
    kept too); the callbacks it tells the epochs as Keras does (``observes``) take none; BadInputError naming any
    other."""
    import keras

    options: dict[str, Any] = {}
    for callback in callbacks:
        name = type(callback).__name__
        if (
            isinstance(callback, keras.callbacks.EarlyStopping)
            and callback.baseline is None
            and not callback.start_from_epoch
        ):
            if callback.mode != "auto":
                raise BadInputError(
                    f"callback {name} with mode={callback.mode!r}: slsml.fit decides whether a figure"
                    " improves as Keras's mode auto does; leave mode out"
                )
            options["early_stopping"] = f"{callback.monitor}:{callback.patience}:{abs(callback.min_delta):g}"
            if callback.restore_best_weights:
                options["keep_best"] = callback.monitor
        elif not isinstance(callback, keras.callbacks.History | keras.callbacks.ProgbarLogger) and not observes(
            callback
        ):
            raise BadInputError(
                f"callback {name} cannot run in slsml.fit: it takes EarlyStopping (without baseline or"
                " start_from_epoch), as the training option early_stopping, and ModelCheckpoint saving at each"
                " epoch's end, CSVLogger, LambdaCallback and callbacks of your own that watch the training's epochs"
                " (on_epoch_end…), told as Keras tells them"
            )
    return options


EPOCH_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end")  # what fit tells a callback


def observes(callback: Any) -> bool:
    """Whether ``callback`` only watches the training and its epochs go by, as ``fit`` tells them (``Observed``): a
    CSVLogger, a LambdaCallback or a callback of the caller's own (a ``keras.callbacks.Callback`` of no Keras class
    but that one) whose hooks are the training's and its epochs' (``EPOCH_HOOKS``); a run's steps are not this
    process's. BadInputError, naming them, for one of those with other hooks."""
    import keras

    if isinstance(callback, keras.callbacks.CSVLogger) or _saves_each_epoch(callback):
        return True
    own = _below(type(callback), keras.callbacks.Callback) if isinstance(callback, keras.callbacks.Callback) else []
    if isinstance(callback, keras.callbacks.LambdaCallback):
        hooks = [name for name, hook in vars(callback).items() if name.startswith("on_") and callable(hook)]
    elif own and not any(cls.__module__.startswith("keras") for cls in own):
        hooks = [name for cls in own for name in vars(cls) if name.startswith("on_")]
    else:
        return False
    others = sorted(set(hooks) - set(EPOCH_HOOKS))
    if others:
        raise BadInputError(
            f"callback {type(callback).__name__} defines {', '.join(others)}: slsml.fit tells a callback of the"
            f" training's start and end and of each epoch ({', '.join(EPOCH_HOOKS)}), as its steps run in the"
            " run's functions, not in this process; watch the epochs instead"
        )
    return True


def _saves_each_epoch(callback: Any) -> bool:
    """Whether ``callback`` is a ModelCheckpoint that saves at epochs' ends (``save_freq="epoch"``, Keras's default:
    each one, or the best by its monitor), which Keras's own does from the epoch's weights ``fit`` gives the model
    there and the epoch's figures."""
    import keras

    return isinstance(callback, keras.callbacks.ModelCheckpoint) and callback.save_freq == "epoch"


def _below(cls: type, base: type) -> list[type]:
    """The classes of ``cls``'s method resolution order before ``base``."""
    order = cls.__mro__
    return list(order[: order.index(base)])


def _options_spec(
    batch_size: int,
    epochs: int,
    validation_data: Any,
    validation_split: float | None,
    options: dict[str, Any],
) -> TrainingSpec:
    """The run ``fit``'s arguments ask for, of any length: the validation data (the run's test split) monitored as
    ``val_``, or the held-out ``validation_split``."""
    if validation_data is not None and validation_split is not None:
        raise BadInputError("give validation_data or validation_split, not both")
    options = {"workers": min(4, batch_size), **options}
    if validation_data is not None:  # the validation data is the run's test split: val_x monitors its test_x
        options |= {
            name: "test_" + value.removeprefix("val_")
            for name in ("early_stopping", "keep_best")
            if isinstance(value := options.get(name), str) and value.startswith("val_")
        }
    return training_spec(
        {"global_batch": batch_size, "epochs": epochs, "validation_split": validation_split, **options}
    )


def _spec(
    count: int,
    batch_size: int,
    epochs: int,
    validation_data: Any,
    validation_split: float | None,
    options: dict[str, Any],
    epoch_models: bool = False,
) -> TrainingSpec:
    """The run ``fit``'s arguments ask for on ``count`` training samples: the validation data (the run's test split)
    evaluated at each epoch's end, or the held-out ``validation_split``; ``epoch_models``: each epoch's model saved
    (for the callbacks to find in the model at its end)."""
    spec = _options_spec(batch_size, epochs, validation_data, validation_split, options)
    per_epoch = launch.with_epochs(spec, count).iterations // epochs
    saved = {"checkpoint_every": per_epoch} if epoch_models else {}
    return spec.model_copy(update={"eval_every": per_epoch if validation_data is not None else 0, **saved})


@dataclass
class _Job:
    """A ``fit`` call's run: what it trains, and what it ended with (``final``: the model's bytes)."""

    model_bytes: bytes
    run_id: str
    epochs: int
    batch: int
    validation: Iterable[Chunk] | None
    validation_split: float | None
    options: dict[str, Any]
    named: str | None  # the counters' figures of the validation samples: test, val (None: none)
    verbose: int = 1
    per_epoch: int = 0
    final: bytes = b""
    observers: Any = None  # a keras.callbacks.CallbackList of the callbacks that watch the epochs (``observes``)
    epoch_weights: bool = False  # whether they find each epoch's weights in the model at its end

    def train(self, services: Services, train: Data, figures: Callable[[RunConfig], Figures]) -> list[dict[str, float]]:
        """Upload the data, train while showing each epoch, and return each epoch's figures (``figures``: the loss and
        metrics of summed train states, of the run's configuration)."""
        count = upload(services, self.run_id, train, self.validation)
        batch = min(self.batch, count)  # as Keras: a batch past the samples is all of them, one step an epoch
        spec = _spec(
            count, batch, self.epochs, self.validation, self.validation_split, self.options, self.epoch_weights
        )
        config = launch.start_run(services, self.model_bytes, self.run_id, spec, run_id=self.run_id)
        self.per_epoch = config.training.iterations // self.epochs
        view = EpochView(self.epochs, self.per_epoch, self.named, figures(config))
        view.verbose = self.verbose
        if self.observers is not None:
            self.observers.set_params({"verbose": self.verbose, "epochs": self.epochs, "steps": self.per_epoch})
            view.observed = Observed(self.observers, services, self.run_id, self.per_epoch, self.epoch_weights)
        # silent (verbose 0) and watched by no callback, nothing is shown while it trains: its iterations' records
        # are read once, when it ended
        follow = view.follower(services.table, config) if self.verbose or self.observers else None
        if self.observers is not None:
            self.observers.on_train_begin()
        run = runs.wait_for_run(services, self.run_id, on_progress=follow, poll_s=0.2)
        stopped = view.observed.stopped_with if view.observed is not None else None
        if stopped is not None:  # by a callback, after the last epoch shown
            run = run.model_copy(update={"iteration": len(view.shown) * self.per_epoch})
        elif run.status != "COMPLETED" or run.final_key is None:
            raise BadInputError(f"run {self.run_id} ended {run.status}: {run.reason}")
        view.end(run, services.table.list_iterations(self.run_id))
        self.final = stopped or runs.final_model(services, run)
        return view.shown


def upload(services: Services, name: str, train: Data, validation: Iterable[Chunk] | None) -> int:
    """Stream the training chunks (and the validation ones, as the test split; without them, the first training
    sample: a test split holds one at least) into dataset ``name``, a chunk at a time; returns the training samples."""
    x, y, w = train.first
    test = validation if validation is not None else [(samples.take(x, slice(1)), samples.take(y, slice(1)), None)]
    with DatasetWriter.like(services.store, name, x, y, weighted=w is not None) as writer:
        for chunk in train.chunks():
            writer.write("train", *chunk)
        for vx, vy, vw in test:
            writer.write("test", _like(vx, x), _like(vy, y), vw)
        return writer.finish().train.count


@dataclass
class Observed:
    """The callbacks that watch a run's epochs (``observes``: a ``keras.callbacks.CallbackList``), told of each epoch's
    start and end as Keras tells them: at its end the model holds the epoch's weights (``weights``: those of the model
    the run saved of it, each epoch's saved where this is set), and where a callback sets ``model.stop_training`` the
    run is stopped, its result the model of that epoch (``stopped_with``). A callback that changes the optimizer's
    learning rate, which the run's reducers never see, fails the run, naming what to give instead."""

    callbacks: Any
    services: Services
    run_id: str
    per_epoch: int
    weights: bool
    stopped_with: bytes | None = None

    def begin(self, epoch: int) -> None:
        self._told(epoch, lambda: self.callbacks.on_epoch_begin(epoch))

    def end(self, epoch: int, figures: dict[str, float]) -> None:
        model = self.callbacks.model
        saved = self._model_after(epoch) if self.weights else None
        if saved is not None:
            _take_weights(model, saved)
        self._told(epoch, lambda: self.callbacks.on_epoch_end(epoch, figures))
        if getattr(model, "stop_training", False):  # as Keras: no epoch after this one
            self.services.stop_run(self.run_id, f"stopped by a callback at the end of epoch {epoch + 1}")
            self.stopped_with = saved if saved is not None else self._model_after(epoch)

    def _told(self, epoch: int, hook: Callable[[], None]) -> None:
        """Run ``hook``; BadInputError (the run failed) where it changed the optimizer's learning rate."""
        before = _learning_rate(self.callbacks.model)
        hook()
        after = _learning_rate(self.callbacks.model)
        if before != after:
            reason = (
                f"a callback changed the optimizer's learning rate ({before:g} → {after:g}) at epoch {epoch + 1}: the"
                " run's reducers step with the optimizer it started with; give the optimizer a"
                " keras.optimizers.schedules.LearningRateSchedule instead"
            )
            self.services.fail_run(self.run_id, reason)
            raise BadInputError(reason)

    def _model_after(self, epoch: int) -> bytes | None:
        """The model the run saved at ``epoch``'s end, once it is stored (it is saved once the next epoch runs; the
        last one's is the final model); None if the run ended without it."""
        iteration = (epoch + 1) * self.per_epoch
        while True:
            try:
                return runs.saved_model(self.services, self.run_id, iteration)
            except NotFoundError:
                run = self.services.table.get_run(self.run_id)
                if run.status in runs.TERMINAL:
                    ended_here = run.status == "COMPLETED" and run.iteration == iteration
                    return runs.final_model(self.services, run) if ended_here else None
            time.sleep(SAVED_POLL_S)


def _take_weights(model: Any, archive: bytes) -> Any:
    """Give ``model`` the weights of the model ``archive`` holds (of the same weights); that model."""
    from slsml.training import modelio

    source = modelio.load_model(archive)
    for variable, value in zip(model.weights, source.weights, strict=True):
        variable.assign(value)
    return source


def _learning_rate(model: Any) -> float | None:
    """The optimizer's learning rate now (None: no optimizer)."""
    optimizer = getattr(model, "optimizer", None)
    return None if optimizer is None else float(np.asarray(optimizer.learning_rate))


class EpochView:
    """Keras's progress of a run, one epoch at a time, from its iteration records: ``Epoch k/N``, a
    ``keras.utils.Progbar`` of the epoch's steps with its running loss and metrics (``figures`` of the train states
    summed so far), and its final line with the ``validation`` figures (the counters' ``test`` or ``val``) of the
    model at its end; each epoch's final figures kept in ``shown``, as History holds them."""

    def __init__(self, epochs: int, per_epoch: int, validation: str | None, figures: Figures) -> None:
        self.epochs, self.per_epoch, self.validation, self.figures = epochs, per_epoch, validation, figures
        self.verbose = 1
        self.observed: Observed | None = None  # the callbacks told each epoch's start and end
        self.counters: dict[int, Counter] = {}
        self.shown: list[dict[str, float]] = []
        self._bar: Any = None
        self._step = 0  # steps of the current epoch shown

    def follower(self, table: Any, config: RunConfig) -> Callable[[RunRecord, Counter | None], None]:
        """What ``wait_for_run`` calls at each poll: read the counters of the iterations merged since, and show."""

        def follow(run: RunRecord, latest: Counter | None) -> None:
            for iteration in range(len(self.counters), run.iteration):
                self.counters[iteration] = table.get_counter(run.run_id, iteration)
            if run.status in runs.TERMINAL:
                return  # the end is shown from the run's whole record (``end``)
            self._show(run.iteration)
            end = (len(self.shown) + 1) * self.per_epoch - 1
            if self._step == self.per_epoch and end in self.counters and self._validation(self.counters[end]) is None:
                self.counters[end] = table.get_counter(run.run_id, end)  # its validation figures come later
                self._show(run.iteration)

        return follow

    def end(self, run: RunRecord, counters: Sequence[Counter]) -> None:
        """Show the epochs left, from the ended run's records: those it ran (fewer where early stopping ended it)."""
        self.counters = {c.iteration: c for c in counters}
        ran = min(self.epochs, run.iteration // self.per_epoch)
        while len(self.shown) < ran:
            self._show(run.iteration, ended=True)

    @property
    def stopped(self) -> bool:
        """Whether a callback stopped the run after the last epoch shown."""
        return self.observed is not None and self.observed.stopped_with is not None

    def _validation(self, counter: Counter) -> dict[str, float] | None:
        value: dict[str, float] | None = getattr(counter, self.validation) if self.validation else {}
        return value

    def _show(self, merged: int, ended: bool = False) -> None:
        """Bring the current epoch's bar to the ``merged`` iterations, and end each epoch whose figures are in."""
        import keras

        while len(self.shown) < self.epochs and not self.stopped:
            epoch = len(self.shown)
            steps = min(merged - epoch * self.per_epoch, self.per_epoch)
            if steps <= 0:
                return
            if self._bar is None:
                if self.observed is not None:
                    self.observed.begin(epoch)
                if self.verbose and self.epochs > 1:
                    print(f"Epoch {epoch + 1}/{self.epochs}", flush=True)  # where Progbar writes: stdout
                self._bar = keras.utils.Progbar(self.per_epoch, verbose=self.verbose, stateless_metrics=set())
                self._step = 0
            if steps > self._step and steps < self.per_epoch and self.verbose == 1:
                self._step = steps
                self._bar.update(steps, list(self._running(epoch, steps).items()))
            if steps < self.per_epoch:
                return
            self._step = steps
            end = self.counters.get((epoch + 1) * self.per_epoch - 1)
            validation = self._validation(end) if end is not None else None
            if validation is None and not ended:
                return  # the validation figures of the epoch's model are not in yet
            figures = epoch_figures(self.counters, epoch, self.per_epoch, self.validation, self.figures)
            self._bar.update(self.per_epoch, list(figures.items()), finalize=True)
            self.shown.append(figures)
            self._bar = None
            if self.observed is not None:
                self.observed.end(epoch, dict(figures))

    def _running(self, epoch: int, steps: int) -> dict[str, float]:
        """The loss and metrics over the epoch's first ``steps`` batches."""
        first = epoch * self.per_epoch
        states = [
            np.asarray(c.train_state)
            for i in range(first, first + steps)
            if (c := self.counters.get(i)) is not None and c.train_state is not None
        ]
        return self.figures(states) if states else {}


def epoch_figures(
    counters: Mapping[int, Counter], epoch: int, per_epoch: int, validation: str | None, train: Figures
) -> dict[str, float]:
    """An epoch's History figures: the loss and metrics over the batches of its iterations (``train`` of their train
    states, which it sums: those recorded), and the ``validation`` figures (its counters' ``test`` or ``val``) of the
    model at its end, as ``val_``."""
    first = epoch * per_epoch
    span = [counters[i] for i in range(first, first + per_epoch) if i in counters]
    states = [np.asarray(c.train_state) for c in span if c.train_state is not None]
    figures = dict(train(states)) if states else {}
    end = counters.get(first + per_epoch - 1)
    held = getattr(end, validation, None) if validation is not None else None
    figures |= {f"val_{name}": value for name, value in (held or {}).items()}
    return figures


def epoch_history(
    counters: Sequence[Counter], per_epoch: int, epochs: int, validation: str | None, train: Figures
) -> dict[str, list[float]]:
    """Keras's ``History.history`` of a run's iterations: ``epoch_figures`` of each of its ``epochs``."""
    by_iteration = {c.iteration: c for c in counters}
    history: dict[str, list[float]] = {}
    for epoch in range(epochs):
        for name, value in epoch_figures(by_iteration, epoch, per_epoch, validation, train).items():
            history.setdefault(name, []).append(value)
    return history
