"""``slsml.fit``: Keras's ``model.fit`` through the pipeline, from Python (a script, a notebook).

The arrays become a dataset in a local runtime of the call's own (or in a deployed stack's bucket), the run trains
``epochs`` epochs of ``batch_size`` global batches, the model takes the final weights and its optimizer's state in
place, and the result is a ``keras.callbacks.History`` as ``fit`` returns it: per epoch, the loss and compiled metrics
over the batches of its iterations (their states summed over the epoch, as Keras sums them over an epoch's batches) and
the figures of the validation samples at its end (``val_`` forms). The local runtime ends with the call, however the
call ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from slsml.client import runs
from slsml.data import datasets as data
from slsml.pipeline.services import Services
from slsml.spec import samples
from slsml.spec.config import RunConfig, TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.spec.samples import Arrays
from slsml.state.records import Counter, IterationRecord, RunRecord


def fit(
    model: Any,
    x: Arrays,
    y: Arrays,
    batch_size: int = 32,
    epochs: int = 1,
    validation_data: tuple[Arrays, Arrays] | None = None,
    validation_split: float | None = None,
    sample_weight: np.ndarray | None = None,
    callbacks: Sequence[Any] = (),
    verbose: int = 1,
    stack: str | None = None,
    **options: Any,
) -> Any:
    """Train ``model`` (compiled, or given ``loss=``/``optimizer=``) on ``x``, ``y`` (each an array, or for a model of
    several inputs or outputs a dict of arrays by input and output name) as ``model.fit`` would, on
    ``batch_size`` samples per iteration spread over the workers, each sample's loss weighted by ``sample_weight``
    (or ``class_weight=``) as ``fit`` weights it; ``options``: any other TrainingSpec field (``workers=8``,
    ``reducers=2``, ``quorum=0.75``…; ``early_stopping="val_loss:3"`` and ``keep_best="val_auc"``, Keras's
    EarlyStopping and ModelCheckpoint, which ``callbacks`` may also give as Keras callbacks). Returns a
    ``keras.callbacks.History``; the model holds the trained weights. ``stack``: train on the deployed stack of this
    name instead of a local runtime."""
    import keras

    from slsml.training import evaluation, modelio

    checkpoints = [c.filepath for c in callbacks if isinstance(c, keras.callbacks.ModelCheckpoint)]
    x, y = samples.as_arrays(x, "x"), samples.as_arrays(y, "y")
    count = samples.count(x)
    spec = _spec(count, batch_size, epochs, validation_data, validation_split, options | callback_options(callbacks))
    first = slice(1)
    # the data against the model before anything is stored (prepare_run checks it again, with the whole data's range)
    modelio.check_compiled(model, loss=spec.loss is not None, optimizer=spec.optimizer is not None)
    modelio.check_fits(model, modelio.loss_config(model, spec.loss), x, y, None)
    test = validation_data if validation_data is not None else (samples.take(x, first), samples.take(y, first))
    model_bytes = modelio.save_model(model)
    run_id = runs.new_run_id("fit")
    if stack is not None:
        from slsml.client.stack import services_for_stack

        record = _train(services_for_stack(stack), model_bytes, run_id, spec, (x, y, sample_weight), test, verbose)
    else:
        from slsml.local.runtime import LocalRuntime

        with LocalRuntime(
            workers=spec.max_workers or spec.initial_workers,
            reducers=spec.reducers,
            log_dir=Path(".slsml/logs") / run_id,
        ) as local:
            record = _train(local.services, model_bytes, run_id, spec, (x, y, sample_weight), test, verbose)
    run, counters, final, config = record
    trained = modelio.load_model(final)
    for variable, value in zip(model.weights, trained.weights, strict=True):
        variable.assign(value)
    modelio.take_training(model, trained)  # the optimizer's state as fit leaves it
    for path in checkpoints:  # the best model, where ModelCheckpoint(save_best_only) would have left it
        model.save(path)
    per_epoch = run.iterations // epochs
    ran = min(epochs, run.iteration // per_epoch)  # fewer where early stopping ended the run
    history = keras.callbacks.History()
    history.set_model(model)
    history.params = {"verbose": verbose, "epochs": epochs, "steps": per_epoch}
    history.epoch = list(range(ran))
    sample = samples.take(x, slice(2)), samples.take(y, slice(2))
    train = evaluation.Evaluator(model, config.loss, config.metrics, sample).result
    validation = "test" if validation_data is not None else "val"
    history.history = epoch_history(counters, per_epoch, ran, validation, train)
    return history


def callback_options(callbacks: Sequence[Any]) -> dict[str, Any]:
    """The training options of Keras callbacks ``fit`` takes: EarlyStopping (``restore_best_weights``: the best model
    kept too) and ModelCheckpoint(save_best_only=True) of one ``.keras`` file; BadInputError naming any other."""
    import keras

    options: dict[str, Any] = {}
    for callback in callbacks:
        name = type(callback).__name__
        if (
            isinstance(callback, keras.callbacks.EarlyStopping)
            and callback.baseline is None
            and not callback.start_from_epoch
        ):
            options["early_stopping"] = f"{callback.monitor}:{callback.patience}:{abs(callback.min_delta):g}"
            if callback.restore_best_weights:
                options["keep_best"] = callback.monitor
        elif (
            isinstance(callback, keras.callbacks.ModelCheckpoint)
            and callback.save_best_only
            and not callback.save_weights_only
            and "{" not in str(callback.filepath)
        ):
            options["keep_best"] = callback.monitor
        elif not isinstance(callback, keras.callbacks.History | keras.callbacks.ProgbarLogger):
            raise BadInputError(
                f"callback {name} cannot run in slsml.fit: it takes EarlyStopping (without baseline"
                " or start_from_epoch) and ModelCheckpoint(save_best_only=True) of one .keras file,"
                " as the training options early_stopping and keep_best"
            )
        if getattr(callback, "mode", "auto") != "auto":
            raise BadInputError(
                f"callback {name} with mode={callback.mode!r}: slsml.fit decides whether a figure"
                " improves as Keras's mode auto does; leave mode out"
            )
    return options


def _spec(
    count: int,
    batch_size: int,
    epochs: int,
    validation_data: Any,
    validation_split: float | None,
    options: dict[str, Any],
) -> TrainingSpec:
    """The run ``fit``'s arguments ask for: the validation data (the run's test split) evaluated at each epoch's
    end, or the held-out ``validation_split``."""
    if validation_data is not None and validation_split is not None:
        raise BadInputError("give validation_data or validation_split, not both")
    if "iterations" in options or "global_batch" in options or "epochs" in options:
        raise BadInputError("fit takes the run's length as epochs= and its global batch as batch_size=")
    options = {"workers": min(4, batch_size), **options}
    if validation_data is not None:  # the validation data is the run's test split: val_x monitors its test_x
        options |= {
            name: "test_" + value.removeprefix("val_")
            for name in ("early_stopping", "keep_best")
            if isinstance(value := options.get(name), str) and value.startswith("val_")
        }
    spec = TrainingSpec(global_batch=batch_size, epochs=epochs, validation_split=validation_split, **options)
    per_epoch = runs.with_epochs(spec, count).iterations // epochs
    return spec.model_copy(update={"eval_every": per_epoch if validation_data is not None else 0})


def _train(
    services: Services,
    model_bytes: bytes,
    run_id: str,
    spec: TrainingSpec,
    train: tuple[Arrays, Arrays, np.ndarray | None],
    test: tuple[Arrays, Arrays],
    verbose: int,
) -> tuple[RunRecord, list[IterationRecord], bytes, RunConfig]:
    """Upload the data (``train``: x, y and the samples' weights), train, and return the ended run, its iterations,
    its final model and its configuration."""
    import keras

    data.put_dataset(services.store, run_id, train[0], train[1], *test, w=train[2])
    config = runs.start_run(services, model_bytes, run_id, spec, run_id=run_id)
    bar = keras.utils.Progbar(config.training.iterations, verbose=verbose, unit_name="iteration")
    shown = [0]  # the last iteration shown: each merged iteration's loss enters the bar's mean once

    def show(run: RunRecord, latest: Counter | None) -> None:
        if run.iteration > shown[0] and latest is not None:
            shown[0] = run.iteration
            bar.update(run.iteration, values=[("loss", latest.train_loss)] if latest.train_loss is not None else [])

    run = runs.wait_for_run(services, run_id, on_progress=show if verbose else None, poll_s=0.2)
    if run.status != "COMPLETED" or run.final_key is None:
        raise BadInputError(f"run {run_id} ended {run.status}: {run.reason}")
    bar.update(run.iteration, finalize=True)
    return run, services.table.list_iterations(run_id), runs.final_model(services, run), config


def epoch_history(
    counters: Sequence[Counter],
    per_epoch: int,
    epochs: int,
    validation: str,
    train: Callable[[list[np.ndarray]], dict[str, float]],
) -> dict[str, list[float]]:
    """Keras's ``History.history`` of a run's iterations: per epoch the loss and metrics over the batches of its
    iterations (``train`` of their train states, which it sums: those recorded), and the ``validation`` figures
    (its counters' ``test`` or ``val``) of the model at its end."""
    by_iteration = {c.iteration: c for c in counters}
    history: dict[str, list[float]] = {}
    for epoch in range(epochs):
        span = [by_iteration[i] for i in range(epoch * per_epoch, (epoch + 1) * per_epoch) if i in by_iteration]
        if states := [np.asarray(c.train_state) for c in span if c.train_state is not None]:
            for name, value in train(states).items():
                history.setdefault(name, []).append(value)
        end = by_iteration.get((epoch + 1) * per_epoch - 1)
        for name, value in (getattr(end, validation, None) or {}).items():
            history.setdefault(f"val_{name}", []).append(value)
    return history
