"""The ``slsml`` command: train on the embedded local cloud, inspect runs, upload data."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from pydantic import BaseModel, ValidationError

from slsml.cli import display
from slsml.spec.config import (
    HYPER_PARAMETERS,
    KERAS_OPTIMIZERS,
    OPTIMIZER_NAMES,
    OptimizerConfig,
    RegularExpression,
    TrainingSpec,
)
from slsml.spec.errors import BadInputError, SlsmlError
from slsml.training import quiet

quiet.install()  # before anything imports TensorFlow: its start-up lines stay off the terminal

RUNS_DIR = Path("runs")
DEMO_LEARNING_RATE = 3e-3  # the demo's model: Adam at this rate
IDLE_WAIT_S = 30  # after a local run ends: how long its last invocations may take to log their usage
LAUNCH_WAIT_S = 5.0  # run scale: how long to wait for the launch of the iteration the run is at
_console = display.console  # the commands' one-line messages and spinners


# ---- options ---------------------------------------------------------------------------------


# TrainingSpec fields whose flag is not named after the field (the flags' names came first): field → dest
FLAG_NAMES = {
    "global_batch": "batch", "heartbeat_s": "heartbeat", "time_budget_s": "time_budget", "deadline_s": "deadline",
}
# TrainingSpec fields with options of their own: the optimizer group (_optimizer_options) and --loss
OWN_OPTIONS = frozenset({"optimizer", "loss"})


def _dest(field: str) -> str:
    """The dest of TrainingSpec field ``field``'s flag."""
    return FLAG_NAMES.get(field, field)


def _readings(spec: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """How argparse reads each of ``spec``'s fields (but OWN_OPTIONS) from its flag: ``add_argument``'s
    keywords other than the default and help. TypeError for a field no flag can set."""
    readings = {}
    for name, field in spec.model_fields.items():
        if name in OWN_OPTIONS:
            continue
        reading = _reading(field.annotation)
        if reading is None or not field.description:
            raise TypeError(f"{spec.__name__}.{name}: no command-line option for a {field.annotation}"
                            + ("" if field.description else " without a description"))
        readings[name] = reading
    return readings


def _reading(annotation: Any) -> dict[str, Any] | None:
    """``add_argument``'s keywords for a value of ``annotation``: an int, float, str or bool, a ``Literal``'s
    values, a number or a ``Literal``'s words (``int | Literal["auto"]``), or any of those or None; None for
    another type."""
    union = get_origin(annotation) in {Union, types.UnionType}
    members = [get_args(m)[0] if get_origin(m) is Annotated else m
               for m in (get_args(annotation) if union else (annotation,)) if m is not type(None)]
    words = [value for m in members if get_origin(m) is Literal for value in get_args(m)]
    kinds = [m for m in members if get_origin(m) is not Literal]
    if not kinds and len({type(word) for word in words}) == 1:
        return {"type": type(words[0]), "choices": words}
    if kinds == [bool] and not words:
        return {"action": argparse.BooleanOptionalAction}
    if len(kinds) != 1 or kinds[0] not in {int, float, str}:
        return None
    if not words:
        return {"type": kinds[0]}
    if kinds[0] is str or not all(isinstance(word, str) for word in words):
        return None
    return {"type": partial(_number_or_word, kinds[0], tuple(words)),
            "metavar": "|".join([kinds[0].__name__.upper(), *words])}


def _number_or_word(kind: type, words: tuple[str, ...], text: str) -> Any:
    """``text`` as one of ``words``, else as a number of ``kind``."""
    if text in words:
        return text
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number ({kind.__name__}) or one of"
                                         f" {', '.join(words)}") from None


SPEC_READINGS = _readings(TrainingSpec)  # a field no flag can set fails here, at import


def _training_options(parser: argparse.ArgumentParser, iterations: int | None) -> None:
    """A flag per TrainingSpec field, its type, default and help from the field (the optimizer's in a group of
    their own). ``iterations``: this command's iteration budget (None: --iterations is required)."""
    group = parser.add_argument_group("training")
    for name, reading in SPEC_READINGS.items():
        field = TrainingSpec.model_fields[name]
        required = field.is_required()
        default = None if required else field.get_default(call_default_factory=True)
        if name == "iterations":  # each command's own budget
            default, required = iterations, iterations is None
        action = group.add_argument(_flag(_dest(name)), default=default, required=required, **reading)
        # set after: BooleanOptionalAction adds a default of its own to the help it is given
        shown = "" if default is None else f" (default {display.number(default)})"
        action.help = f"{field.description}{shown}".replace("%", "%%")
    group.add_argument("--loss", help="Keras loss name (default: the model's compiled loss)")
    group = parser.add_argument_group("run")
    group.add_argument("--run-id", help="run name (default: generated)")
    group.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    group.add_argument("--timeout", type=float, default=3600, help="stop waiting (and fail the run) after this long")
    group.add_argument("--pool", type=int, help="local runs: the most warm processes per function (default: from"
                       " this machine's cores and memory, or the SLSML_POOL environment variable)")
    group.add_argument("--faults", type=_faults,
                       help="local runs: inject faults, e.g. 'seed=3,duplicate=0.5,worker_crash=0.25,"
                       "s3_get_delay=0.2:1.5' (also reducer_crash, merger_crash_once, sns_delay, "
                       "worker_hang=p with hang_s=SECONDS, crash_every_receive, slow_worker=WORKER:SECONDS)")
    _optimizer_options(parser)


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _optimizer_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "optimizer", "default: the optimizer the model was compiled with; an option left out keeps Keras's default"
    )
    group.add_argument("--optimizer", choices=OPTIMIZER_NAMES, help="the optimizer the reducers apply")
    group.add_argument("--learning-rate", type=float,
                       help="a constant learning rate (a schedule comes from the model file); without --optimizer:"
                       " the model's compiled optimizer at this rate")
    for name in HYPER_PARAMETERS:
        field = OptimizerConfig.model_fields[name]
        kind = field.annotation
        if get_origin(kind) in {Union, types.UnionType}:
            kinds = set(get_args(kind)) - {type(None)}
            kind = kinds.pop() if len(kinds) == 1 else kind
        owners = OptimizerConfig.optimizers_of(name)
        about = "; ".join(filter(None, [
            field.description, None if owners == OPTIMIZER_NAMES else ", ".join(KERAS_OPTIMIZERS[n] for n in owners)
        ]))
        if kind is bool:
            group.add_argument(_flag(name), action="store_true", default=None, help=about or None)
        elif kind in {int, float}:
            group.add_argument(_flag(name), type=kind, help=about or None)
        elif get_origin(kind) is tuple and get_args(kind) == (RegularExpression, ...):
            group.add_argument(_flag(name), type=_patterns, action="extend", metavar="PATTERN[,PATTERN]",
                               help=f"{about} (comma-separated or repeated)")
        else:
            raise TypeError(f"OptimizerConfig.{name}: no command-line option for a {field.annotation}")


def _patterns(text: str) -> list[str]:
    return [pattern for pattern in text.split(",") if pattern]


def _faults(text: str) -> Any:
    from slsml.local.faults import Faults

    try:
        return Faults.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,4,16") from None
    if min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: counts start at 1")
    return counts


def _workers(text: str) -> int:
    try:
        workers = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of workers") from None
    if workers < 1:
        raise argparse.ArgumentTypeError(f"{workers}: a run trains with at least 1 worker")
    return workers


def _spec(args: argparse.Namespace, default_learning_rate: float | None = None) -> TrainingSpec:
    """The run the flags ask for. Without --optimizer its optimizer is None (the model's compiled one): the
    optimizer flags apply on top of it once the model is read (``_with_flags``). BadInputError on one line
    naming the flags for values that do not make a spec."""
    optimizer = _optimizer(args, default_learning_rate)
    try:
        return TrainingSpec(**{name: getattr(args, _dest(name)) for name in SPEC_READINGS}, optimizer=optimizer,
                            loss=args.loss)
    except ValidationError as error:
        flags = {name: _flag(_dest(name)) for name in SPEC_READINGS}
        raise BadInputError("; ".join(_flagged(e, flags) for e in error.errors())) from None


def _optimizer_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The optimizer flags given (other than --optimizer), by OptimizerConfig field."""
    given = {name: getattr(args, name) for name in HYPER_PARAMETERS if getattr(args, name) is not None}
    return given if args.learning_rate is None else {"learning_rate": args.learning_rate, **given}


def _optimizer(args: argparse.Namespace, default_learning_rate: float | None) -> OptimizerConfig | None:
    """The optimizer --optimizer names, with the other optimizer flags; None without --optimizer."""
    if not args.optimizer:
        return None
    fields: dict[str, Any] = {"name": args.optimizer, **_optimizer_flags(args)}
    if default_learning_rate and "learning_rate" not in fields:
        fields["learning_rate"] = default_learning_rate
    return _optimizer_config(fields)


def _with_flags(args: argparse.Namespace, spec: TrainingSpec, model: Any) -> TrainingSpec:
    """``spec`` with the optimizer in effect: without --optimizer, the model's compiled optimizer with the
    optimizer flags given applied on top of it (a flag that is not one of its options is an error)."""
    flags = _optimizer_flags(args)
    if spec.optimizer is not None or not flags:
        return spec
    from slsml.training import modelio

    compiled = modelio.optimizer_config(model)
    return spec.model_copy(update={"optimizer": _optimizer_config({**dict(compiled), **flags}, compiled.name)})


def _optimizer_config(fields: dict[str, Any], compiled: str | None = None) -> OptimizerConfig:
    """OptimizerConfig(**fields); BadInputError on one line naming flags. ``compiled``: the fields are the
    model's compiled optimizer of this name with flags on top."""
    try:
        return OptimizerConfig(**fields)
    except ValidationError as error:
        message = "; ".join(_flagged(e) for e in error.errors())
        if compiled:
            message += (f" (the optimizer the model is compiled with is {KERAS_OPTIMIZERS[compiled]}; --optimizer"
                        " NAME replaces it)")
        raise BadInputError(message) from None


def _flagged(error: Any, flags: dict[str, str] | None = None) -> str:
    """A pydantic error, on one line, naming flags rather than fields: ``flags``, field → flag (default:
    OptimizerConfig's)."""
    flags = flags or {name: _flag(name) for name in (*HYPER_PARAMETERS, "learning_rate")}
    message = error["msg"].removeprefix("Value error, ")
    fields = "|".join(sorted(flags, key=len, reverse=True))
    message = re.sub(rf"(?<![\w-])({fields})(?![\w-])", lambda match: flags[match[1]], message)
    return f"{flags.get(str(error['loc'][0]), error['loc'][0])}: {message}" if error["loc"] else message


# ---- running locally -------------------------------------------------------------------------


def _start(services: Any, model_bytes: bytes, dataset: str, spec: TrainingSpec, run_id: str | None) -> Any:
    """Prepare a run, say which optimizer it applies (the model's compiled one unless the flags name one),
    then start it."""
    from slsml.client import runs

    config = runs.prepare_run(services, model_bytes, dataset, spec, run_id=run_id)
    display.say(display.describe_update(config))
    runs.launch_run(services, config)
    return config


def _one_shot_runtime(args: argparse.Namespace, spec: TrainingSpec) -> Any:
    """The local runtime of a run on a cloud of its own, begun: its cloud and function processes get ready
    while this process loads TensorFlow and the model. Its logs go to .slsml/logs/<run id>."""
    from slsml.client import runs
    from slsml.local.runtime import LocalRuntime

    return LocalRuntime(
        workers=spec.max_workers or spec.initial_workers,  # warm processes for the most it may scale to
        reducers=spec.reducers,
        pool=args.pool,
        log_dir=Path(".slsml/logs") / (args.run_id or runs.new_run_id()),
    ).begin()


def _train_locally(
    args: argparse.Namespace, runtime: Any, spec: TrainingSpec, model_bytes: bytes, dataset: str, arrays: Any,
    out: Path | None,
) -> int:
    from slsml.data import datasets as data

    run_id = runtime.log_dir.name
    with ExitStack() as stack:
        with _console().status("starting the embedded cloud and warm function processes…"):
            services = stack.enter_context(runtime).services
        runtime.host.faults = args.faults
        if arrays is not None:
            data.put_dataset(services.store, dataset, *arrays)
        _start(services, model_bytes, dataset, spec, run_id)

        def usage(run: Any) -> list[Any]:
            from slsml.accounting import usage

            runtime.host.wait_idle(run.run_id, IDLE_WAIT_S)
            return usage.read_local(runtime.log_dir, run.run_id)

        return _follow(services, run_id, spec.iterations, args, out, faults=runtime.host.fault_report, usage=usage,
                       so_far=partial(_service_usage, runtime.log_dir))


def _follow(
    services: Any,
    run_id: str,
    iterations: int,
    args: argparse.Namespace,
    out: Path | None,
    faults: Callable[[], dict[str, Any]] | None = None,
    usage: Callable[[Any], list[Any]] | None = None,
    started: float | None = None,
    so_far: Callable[[Any], list[Any]] | None = None,
) -> int:
    """Show a run's progress until it ends; record its summary (and final model) under runs/<run>/.
    ``usage`` gives the functions' usage records of the ended run, ``so_far`` (if cheap to read) those of a
    running one; ``started``: when it started (default now)."""
    from slsml.client import runs

    started = started or time.time()
    spent = None if so_far is None else partial(_spent, so_far)
    with display.run_progress(run_id, iterations, started, spent) as show:
        run = runs.wait_for_run(services, run_id, on_progress=show, timeout_s=args.timeout)
    wall_s = time.time() - started
    records = usage(run) if usage else None
    summary = runs.summarize(run, services.table.list_iterations(run_id), wall_s, records)
    if faults is not None and args.faults:
        summary.faults = faults()
    record_dir = RUNS_DIR / run_id
    record_dir.mkdir(parents=True, exist_ok=True)
    if run.final_key:
        out = out or record_dir / "final.keras"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(services.store.get(run.final_key))
        summary.final_model = str(out)
    (record_dir / "summary.json").write_text(summary.model_dump_json(indent=1))
    if getattr(args, "report", None):
        _write_report(services, records or [], run_id, Path(args.report), summary=summary)
    display.print_summary(summary, args.json)
    return 0 if summary.status == "COMPLETED" else 1


def _live_usage(args: argparse.Namespace) -> Callable[[Any], list[Any]] | None:
    """How to read a running run's usage lines while it is followed: from the local service's logs (a stack's
    are in CloudWatch: read once, at the end)."""
    state = None if getattr(args, "stack", None) else _local_service()
    return None if state is None else partial(_service_usage, Path(state.log_dir))


def _spent(usage: Callable[[Any], list[Any]], run: Any) -> float:
    """The dollars a run's functions used so far, by their usage lines."""
    from slsml.accounting import prices
    from slsml.accounting import usage as accounting

    return sum(accounting.cost(usage(run), prices.load()).values())


def _write_report(services: Any, records: list[Any], run_id: str, out_dir: Path, chosen: tuple[int, ...] = (),
                  summary: Any = None) -> None:
    from slsml.cli import report

    with _console().status(f"writing the report of {run_id}…"):
        page = report.write_report(services, records, run_id, out_dir, chosen, summary)
    _console().print(f"report: {page}", markup=False, highlight=False, soft_wrap=True)


def cmd_run_report(args: argparse.Namespace) -> int:
    if _target(args) is None:
        raise BadInputError("no local service is up and no --stack given: a one-shot local run's records last only"
                            " while its `slsml run start --local` or `slsml demo` runs (give it --report DIR)")
    services, usage = _required_target(args)
    run = services.table.get_run(args.run_id)
    _write_report(services, usage(run), args.run_id, Path(args.out), tuple(args.iteration or ()))
    return 0


# ---- commands --------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    spec = _spec(args, default_learning_rate=DEMO_LEARNING_RATE)  # bad flags fail before TensorFlow loads
    runtime = _one_shot_runtime(args, spec)
    from slsml.client import demo
    from slsml.training import modelio

    model = demo.digits_cnn(learning_rate=DEMO_LEARNING_RATE, seed=args.seed)  # compiled: Adam
    spec = _with_flags(args, spec, model)
    out = Path(args.out) if args.out else None
    return _train_locally(args, runtime, spec, modelio.save_model(model), "digits", demo.digits(args.seed), out)


def _read_arrays(path: Path, test_fraction: float, seed: int) -> tuple[Any, ...]:
    import numpy as np

    from slsml.data.datasets import split_train_test

    if not path.exists():
        raise BadInputError(f"{path} does not exist")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as error:
        raise BadInputError(f"{path} is not a .npz file of arrays: {error}") from None
    names = set(archive.files)
    if not {"x", "y"} <= names:
        raise BadInputError(f"{path} must hold arrays named x and y (it has {sorted(names)})")
    if {"x_test", "y_test"} <= names:
        return archive["x"], archive["y"], archive["x_test"], archive["y_test"]
    return split_train_test(archive["x"], archive["y"], test_fraction, seed)


def cmd_run_start(args: argparse.Namespace) -> int:
    if args.local == bool(args.stack):
        raise BadInputError("say where to run: --local (the embedded cloud) or --stack NAME (a deployed stack)")
    spec = _spec(args)
    model_path = Path(args.model)
    if not model_path.is_file():
        raise BadInputError(f"model file {model_path} does not exist")
    data_path = Path(args.data)
    one_shot = args.local and _local_service() is None  # a cloud for this run alone
    if one_shot and data_path.suffix != ".npz":
        raise BadInputError(f"--data {args.data}: a local run takes a .npz file with arrays x, y")
    runtime = _one_shot_runtime(args, spec) if one_shot else None
    from slsml.data import datasets as data
    from slsml.training import modelio

    model_bytes = model_path.read_bytes()
    model = modelio.load_model(model_bytes, where=str(model_path))  # fail fast: before anything is stored
    spec = _with_flags(args, spec, model)
    arrays = _read_arrays(data_path, args.test_fraction, args.seed) if data_path.suffix == ".npz" else None
    dataset = data_path.stem.lower().replace("_", "-")[:63] if arrays is not None else args.data
    out = Path(args.out) if args.out else None
    if runtime is not None:
        return _train_locally(args, runtime, spec, model_bytes, dataset, arrays, out)
    services, usage = _required_target(args)
    if arrays is not None:
        data.put_dataset(services.store, dataset, *arrays)
    config = _start(services, model_bytes, dataset, spec, args.run_id)
    if args.no_wait:
        print(config.run_id)
        return 0
    return _follow(services, config.run_id, spec.iterations, args, out, usage=usage, so_far=_live_usage(args))


def _local_service() -> Any:
    from slsml.local import service

    return service.status()


def _stack_services(name: str) -> Any:
    from slsml.client.stack import services_for_stack

    return services_for_stack(name)


def _stack_usage(stack: str, run: Any) -> list[Any]:
    from slsml.client.stack import usage_records

    return usage_records(stack, run.run_id, run.created_at - 60)


def _target(args: argparse.Namespace) -> tuple[Any, Callable[[Any], list[Any]]] | None:
    """Where a run command acts, with how to read a run's usage records: the deployed stack ``--stack``
    names, else the local service if one is up, else None (the one-shot local runs recorded under runs/)."""
    if getattr(args, "stack", None):
        return _stack_services(args.stack), partial(_stack_usage, args.stack)
    from slsml.local import service

    if service.status() is None:
        return None
    state, services = service.connect()
    return services, partial(_service_usage, Path(state.log_dir))


def _service_usage(log_dir: Path, run: Any) -> list[Any]:
    from slsml.accounting import usage

    return usage.read_local(log_dir, run.run_id)


def _required_target(args: argparse.Namespace) -> tuple[Any, Callable[[Any], list[Any]]]:
    from slsml.spec.errors import NotFoundError

    target = _target(args)
    if target is None:
        raise NotFoundError("no local service is up (start one with `slsml local up`) and no --stack given")
    return target


def _run_summary(args: argparse.Namespace) -> Any:
    """A run's summary: live from a stack's or the local service's table, or the record a one-shot local
    run left under runs/."""
    from slsml.client import runs
    from slsml.spec.errors import NotFoundError

    target = _target(args)
    if target is not None:
        services, usage = target
        run = services.table.get_run(args.run_id)
        return runs.summarize(run, services.table.list_iterations(args.run_id), run.updated_at - run.created_at,
                              usage(run))
    path = RUNS_DIR / args.run_id / "summary.json"
    if not path.exists():
        raise NotFoundError(f"no run named {args.run_id!r} (no {path}; for a deployed run give --stack)")
    return runs.RunSummary.model_validate_json(path.read_text())


def cmd_run_status(args: argparse.Namespace) -> int:
    display.print_summary(_run_summary(args), args.json)
    return 0


def cmd_run_fetch(args: argparse.Namespace) -> int:
    from slsml.spec.errors import NotFoundError

    summary = _run_summary(args)
    out = Path(args.out or f"{args.run_id}.keras")
    target = _target(args)
    if target is not None and summary.final_model:
        out.write_bytes(target[0].store.get(summary.final_model))
    elif target is None and summary.final_model and Path(summary.final_model).exists():
        out.write_bytes(Path(summary.final_model).read_bytes())
    else:
        raise NotFoundError(f"run {args.run_id} has no final model (status {summary.status.value})")
    _console().print(f"final model of {args.run_id} → {out}")
    return 0


def cmd_run_list(args: argparse.Namespace) -> int:
    from slsml.client import runs

    target = _target(args)
    if target is not None:
        summaries = [runs.summarize(r, [], r.updated_at - r.created_at) for r in target[0].table.list_runs()]
    else:
        records = sorted(RUNS_DIR.glob("*/summary.json"))
        summaries = [runs.RunSummary.model_validate_json(p.read_text()) for p in records]
    display.print_runs(summaries)
    return 0


def cmd_run_stop(args: argparse.Namespace) -> int:
    services, _ = _required_target(args)
    if not services.stop_run(args.run_id):
        status = services.table.get_run(args.run_id).status.value
        raise BadInputError(f"run {args.run_id} is not running (status {status})")
    _console().print(f"run {args.run_id} stopped: no new iteration starts; work in flight drains")
    return 0


def cmd_run_resume(args: argparse.Namespace) -> int:
    from slsml.client import runs

    run = runs.resume_run(_required_target(args)[0], args.run_id)
    _console().print(f"run {args.run_id} resumed from its model entering iteration {run.iteration}"
                     f" ({run.iterations - run.iteration} iterations to go)")
    return 0


def cmd_run_scale(args: argparse.Namespace) -> int:
    from slsml.client import runs

    services, _ = _required_target(args)
    was = services.table.get_run(args.run_id).workers
    run = runs.scale_run(services, args.run_id, args.workers)
    tuned = "; workers auto: the tuner goes on from there" if run.training.workers == "auto" else ""
    display.say(f"run {args.run_id}: {run.workers} workers {_scaled_from(services, run)} (was {was}){tuned}")
    return 0


def _scaled_from(services: Any, run: Any) -> str:
    """From which iteration on the run just scaled (``run``: its record as the scale left it) trains with its
    new workers: the iteration it is at, if that one is launched after the scale, else the next one; a stopped
    or failed run's first once resumed."""
    from slsml.state.records import RunStatus

    if run.status != RunStatus.RUNNING:
        return f"from the first iteration it runs once resumed (it is {run.status})"
    if run.iteration >= run.iterations:
        return f"for no iteration: its budget of {run.iterations} is spent"
    deadline = time.monotonic() + LAUNCH_WAIT_S
    while (counter := services.table.get_counter(run.run_id, run.iteration)).workers is None:
        if time.monotonic() > deadline:
            return f"from the next iteration launched on ({run.iteration} at the earliest)"
        time.sleep(0.1)
    return f"from iteration {run.iteration if counter.workers == run.workers else run.iteration + 1} on"


def cmd_run_watch(args: argparse.Namespace) -> int:
    services, usage = _required_target(args)
    run = services.table.get_run(args.run_id)
    try:
        return _follow(services, args.run_id, run.iterations, args, None, usage=usage, started=run.created_at,
                       so_far=_live_usage(args))
    except KeyboardInterrupt:
        _console().print(f"stopped watching: run {args.run_id} goes on")
        return 130


def cmd_local_up(args: argparse.Namespace) -> int:
    from slsml.local import service

    running = service.status()
    if running is None:
        with _console().status("starting the embedded cloud and warm function processes…"):
            running = service.up(pool=args.pool)
    _console().print(f"local service up at {running.endpoint} (pid {running.pid}, {running.pool} warm processes"
                     f" per function); bucket {running.deployment['bucket']}. Its runs and data last as long as"
                     " the service: `slsml local down` ends them. `slsml local env` prints the variables for"
                     " other AWS clients.", soft_wrap=True)
    return 0


def cmd_local_down(args: argparse.Namespace) -> int:
    from slsml.local import service

    _console().print("local service stopped" if service.down() else "no local service was up")
    return 0


def cmd_local_status(args: argparse.Namespace) -> int:
    from slsml.local import service

    state = service.status()
    if state is None:
        _console().print("no local service is up (`slsml local up` starts one)")
        return 1
    _console().print(f"local service up at {state.endpoint} (pid {state.pid}) for"
                     f" {time.time() - state.started_at:.0f} s; bucket {state.deployment['bucket']}, table"
                     f" {state.deployment['table']}; logs in {state.log_dir}", soft_wrap=True)
    return 0


def cmd_local_env(args: argparse.Namespace) -> int:
    import shlex

    from slsml.local import service
    from slsml.spec.errors import NotFoundError

    state = service.status()
    if state is None:
        raise NotFoundError("no local service is up (`slsml local up` starts one)")
    for name, value in service.environment(state).items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def cmd_data_put(args: argparse.Namespace) -> int:
    from slsml.aws import clients as aws
    from slsml.aws.storage import ObjectStore
    from slsml.data import datasets as data

    if args.bucket and args.stack:
        raise BadInputError("say where to upload: --stack NAME (a deployed stack) or --bucket BUCKET, not both")
    arrays = _read_arrays(Path(args.file), args.test_fraction, args.seed)
    store = ObjectStore(aws.client("s3"), args.bucket) if args.bucket else _required_target(args)[0].store
    with _console().status(f"uploading {args.name} to s3://{store.bucket}/datasets/{args.name}/…"):
        manifest = data.put_dataset(store, args.name, *arrays, shard_size=args.shard_size)
    _console().print(
        f"dataset {manifest.name}: {manifest.train.count} train / {manifest.test.count} test samples "
        f"of shape {manifest.x_shape}, {manifest.train.shards + manifest.test.shards} shards"
    )
    return 0


def cmd_bench_stragglers(args: argparse.Namespace) -> int:
    from slsml.bench import pipeline as bench
    from slsml.client import runs
    from slsml.local.runtime import LocalRuntime

    pool = bench.worker_pool(args.workers, args.factor)
    runtime = LocalRuntime(workers=pool, reducers=2, pool=pool, log_dir=Path(".slsml/logs") / runs.new_run_id("bench"))
    with ExitStack() as stack:
        with _console().status(f"starting the embedded cloud and warm function processes ({pool} for workers)…"):
            stack.enter_context(runtime)
        with display.named_progress("[bold]({task.description})") as show:
            report = bench.stragglers(runtime, args.workers, args.iterations, args.slow_iterations, args.factor, show,
                                      args.ssp_factor)
    display.print_stragglers(report)
    if args.json:
        print(report.model_dump_json())
    return 0 if all(case.summary.status == "COMPLETED" for case in report.cases) else 1


def cmd_bench_barrier(args: argparse.Namespace) -> int:
    from slsml.bench import barrier as bench_barrier

    with _console().status(f"driving {args.small} and {args.workers} reports through the barriers…"):
        report = bench_barrier.barrier(args.workers, args.reducers, args.small)
    display.print_barrier(report, args.workers, args.small)
    if args.json:
        print(report.model_dump_json())
    fired = all(f.fired and f.merged for f in (report.small, report.large))
    return 0 if fired and report.item_bytes_within and report.write_units_within else 1


def cmd_bench_scale(args: argparse.Namespace) -> int:
    from slsml.bench import scale as bench_scale
    from slsml.client import runs

    local = bench_scale.runtime(Path(".slsml/logs") / runs.new_run_id("scale"))
    with ExitStack() as stack:
        with _console().status("starting the embedded cloud and one warm process per function…"):
            stack.enter_context(local)
        with display.named_progress("[bold]{task.description}") as show:
            grid = (args.workers or bench_scale.WORKERS, args.reducers or bench_scale.REDUCERS)
            report = bench_scale.scale(local, *grid, args.iterations, show)
    bench_scale.write_calibration(report, Path(args.calibration))
    display.print_scale(report, args.calibration)
    if args.json:
        print(report.model_dump_json())
    return 0 if all(point.status == "COMPLETED" for point in report.points) else 1


def _bench(args: argparse.Namespace, stem: str, workers: int, reducers: int,
           run: Callable[[Any, Any], Any], draw: Callable[[Any], None]) -> None:
    """Start a local runtime with ``workers`` warm worker processes, run ``run(runtime, progress)`` under a
    progress bar, draw its report, and with --json print it as one JSON line."""
    from slsml.client import runs
    from slsml.local.runtime import LocalRuntime

    log_dir = Path(".slsml/logs") / runs.new_run_id(stem)
    runtime = LocalRuntime(workers=workers, reducers=reducers, pool=workers, log_dir=log_dir)
    with ExitStack() as stack:
        with _console().status(f"starting the embedded cloud and warm function processes ({workers} for workers)…"):
            stack.enter_context(runtime)
        with display.named_progress("[bold]{task.description}") as show:
            report = run(runtime, show)
    draw(report)
    if args.json:
        print(report.model_dump_json())


def cmd_bench_algorithms(args: argparse.Namespace) -> int:
    from slsml.bench import algorithms as bench_algorithms

    pool = max(max(bench_algorithms.FIXED_WORKERS), args.pool or 0)
    _bench(args, "algorithms", pool, 2, bench_algorithms.algorithms, display.print_algorithms)
    return 0


def cmd_bench_communication(args: argparse.Namespace) -> int:
    from slsml.bench import communication as bench

    if args.iterations < 1:
        raise BadInputError(f"--iterations must be at least 1, not {args.iterations}")
    significance = bench.SIGNIFICANCE if args.significance is None else args.significance
    if not significance > 0:
        raise BadInputError(f"--significance must be above 0, not {significance:g}")
    _bench(args, "communication", bench.WORKERS, bench.REDUCERS,
           lambda runtime, show: bench.communication(runtime, args.iterations, show, significance=significance),
           display.print_communication)
    return 0


def cmd_bench_admm(args: argparse.Namespace) -> int:
    from slsml.bench import admm as bench

    _bench(args, "admm", bench.WORKERS, bench.REDUCERS, bench.admm_against_gradient, display.print_admm)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from slsml.cost import planreport

    return planreport.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slsml", description="Elastic, serverless training of Keras models.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="train a small CNN on digits through the whole local pipeline")
    _training_options(demo, iterations=150)
    demo.add_argument("--out", help="where to save the final model (default runs/<run>/final.keras)")
    demo.add_argument("--report", metavar="DIR",
                      help="when the run ends, write its report: DIR/index.html and its PNGs")
    demo.set_defaults(handler=cmd_demo)

    run = commands.add_parser("run", help="start and inspect training runs")
    run = run.add_subparsers(dest="action", required=True)
    start = run.add_parser("start", help="train your .keras model on your data")
    start.add_argument("--local", action="store_true", help="run on the embedded local cloud")
    start.add_argument("--stack", help="run on the deployed stack of this name (CloudFormation outputs)")
    start.add_argument("--model", required=True, help="a .keras model file")
    start.add_argument("--data", required=True,
                       help="a .npz file with x, y (optional x_test, y_test), or a dataset already in the stack")
    start.add_argument("--no-wait", action="store_true", help="print the run id and return (--stack, or --local"
                       " with the local service up)")
    start.add_argument("--test-fraction", type=float, default=0.2, help="held out when the data has no x_test")
    start.add_argument("--out", help="where to save the final model (default runs/<run>/final.keras)")
    start.add_argument("--report", metavar="DIR",
                       help="when the run ends, write its report: DIR/index.html and its PNGs")
    _training_options(start, iterations=None)
    start.set_defaults(handler=cmd_run_start)
    stack_help = ("the deployed stack of this name (default: the local service if one is up, else the local runs"
                  " recorded under ./runs)")
    act_help = "the deployed stack of this name (default: the local service)"
    status = run.add_parser("status", help="a run's state and figures")
    status.add_argument("run_id")
    status.add_argument("--stack", help=stack_help)
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_run_status)
    report = run.add_parser("report", help="a run's report: one HTML page with its curves, iteration timelines,"
                            " costs and faults, and its PNGs")
    report.add_argument("run_id")
    report.add_argument("--out", required=True, metavar="DIR", help="where index.html and its PNGs go")
    report.add_argument("--iteration", type=int, nargs="+", action="extend", metavar="I",
                        help="also draw these iterations' timelines (besides the slowest and a median one)")
    report.add_argument("--stack", help="the deployed stack of this name (default: the local service; a one-shot"
                        " local run: --report DIR of run start --local or demo)")
    report.set_defaults(handler=cmd_run_report)
    fetch = run.add_parser("fetch", help="copy a run's final model")
    fetch.add_argument("run_id")
    fetch.add_argument("--stack", help=stack_help)
    fetch.add_argument("--out", help="destination (default <run>.keras)")
    fetch.set_defaults(handler=cmd_run_fetch)
    stop = run.add_parser("stop", help="stop a run: no new iteration starts")
    stop.add_argument("run_id")
    stop.add_argument("--stack", help=act_help)
    stop.set_defaults(handler=cmd_run_stop)
    resume = run.add_parser("resume", help="run a stopped or failed run on from its last complete model")
    resume.add_argument("run_id")
    resume.add_argument("--stack", help=act_help)
    resume.set_defaults(handler=cmd_run_resume)
    scale = run.add_parser("scale", help="change a run's workers, from the next iteration launched on (a stopped or"
                           " failed run's: from its resume on)")
    scale.add_argument("run_id")
    scale.add_argument("--workers", type=_workers, required=True,
                       help="the workers (within the run's --min-workers and --max-workers)")
    scale.add_argument("--stack", help=act_help)
    scale.set_defaults(handler=cmd_run_scale)
    listing = run.add_parser("list", help="runs and their status")
    listing.add_argument("--stack", help=stack_help)
    listing.set_defaults(handler=cmd_run_list)
    watch = run.add_parser("watch", help="follow a run until it ends (Ctrl-C leaves the run alone)")
    watch.add_argument("run_id")
    watch.add_argument("--stack", help=act_help)
    watch.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    watch.add_argument("--timeout", type=float, default=7 * 24 * 3600, help="stop watching after this long")
    watch.set_defaults(handler=cmd_run_watch)

    local = commands.add_parser("local", help="the local cloud as a service that stays up")
    local = local.add_subparsers(dest="action", required=True)
    local_up = local.add_parser("up", help="start the embedded cloud and warm functions in the background")
    local_up.add_argument("--pool", type=int, help="the most warm processes per function (default: from this"
                          " machine's cores and memory)")
    local_up.set_defaults(handler=cmd_local_up)
    local.add_parser("down", help="stop the service: its runs and data go with it").set_defaults(
        handler=cmd_local_down)
    local.add_parser("status", help="whether the service is up, and where").set_defaults(handler=cmd_local_status)
    local.add_parser("env", help="export lines with which any AWS client reaches the service").set_defaults(
        handler=cmd_local_env)

    benchmarks = commands.add_parser("bench", help="benchmarks on the local runtime")
    benchmarks = benchmarks.add_subparsers(dest="benchmark", required=True)
    stragglers = benchmarks.add_parser(
        "stragglers", help="the demo with and without a worker that is slow every iteration, quorum 1 and (W−1)/W"
    )
    stragglers.add_argument("--workers", type=int, default=8, help="workers; the last one straggles (default 8)")
    stragglers.add_argument("--iterations", type=int, default=150,
                            help="iterations of the runs (a), (b), (c) (default 150, the demo's)")
    stragglers.add_argument("--slow-iterations", type=int, default=15,
                            help="iterations of (d), the straggler under quorum 1: slow by design (default 15)")
    stragglers.add_argument("--factor", type=float, default=20.0,
                            help="the straggler's invocation lasts this many (a) work phases (default 20)")
    stragglers.add_argument("--ssp-factor", type=float, default=1.5,
                            help="(e) and (f): the straggler's invocation lasts this many (a) work phases (default"
                            " 1.5)")
    stragglers.add_argument("--json", action="store_true", help="print the report as one JSON line")
    stragglers.set_defaults(handler=cmd_bench_stragglers)
    barrier = benchmarks.add_parser(
        "barrier", help="what one report costs the barriers (item bytes, write units), small and large fleet"
    )
    barrier.add_argument("--workers", type=int, default=1000, help="the large fleet (default 1000)")
    barrier.add_argument("--small", type=int, default=10, help="the small fleet (default 10)")
    barrier.add_argument("--reducers", type=int, default=10, help="reducers of both (default 10)")
    barrier.add_argument("--json", action="store_true", help="print the report as one JSON line")
    barrier.set_defaults(handler=cmd_bench_barrier)

    scale = benchmarks.add_parser(
        "scale", help="the plan's requests and stage times against the local pipeline over a grid of W and R;"
        " fits the plan's latencies to the embedded cloud"
    )
    scale.add_argument("--workers", type=_counts, help="workers of the grid, comma-separated (default 1,4,16,64)")
    scale.add_argument("--reducers", type=_counts, help="reducers of the grid, comma-separated (default 1,2,4)")
    scale.add_argument("--iterations", type=int, default=6, help="iterations per configuration (default 6, at least 3)")
    scale.add_argument("--calibration", default="scale-calibration.json",
                       help="where the fitted parameters go, for slsml plan --calibration (default"
                       " scale-calibration.json)")
    scale.add_argument("--json", action="store_true", help="print the report as one JSON line")
    scale.set_defaults(handler=cmd_bench_scale)

    algorithms = benchmarks.add_parser(
        "algorithms", help="gradient averaging at 2, 4, 8 and auto workers against model averaging with 4 and 16"
        " local steps: rounds, time, requests and dollars to the demo's accuracy, on one sample budget"
    )
    algorithms.add_argument("--pool", type=int, help="warm processes per function (default and at least 8)")
    algorithms.add_argument("--json", action="store_true", help="print the report as one JSON line")
    algorithms.set_defaults(handler=cmd_bench_algorithms)

    communication = benchmarks.add_parser(
        "communication", help="dense, fp16, top-k 1%% and significance-filtered updates (error feedback) at 8 workers:"
        " update, residual and reducer bytes, requests and dollars to the demo's accuracy and over a fixed budget"
    )
    communication.add_argument("--iterations", type=int, default=150,
                               help="iterations of every run (default 150, the demo's)")
    communication.add_argument("--significance", type=float, metavar="V",
                               help="the significance variant's threshold, significance:V (default 0.2)")
    communication.add_argument("--json", action="store_true", help="print the report as one JSON line")
    communication.set_defaults(handler=cmd_bench_communication)

    admm = benchmarks.add_parser(
        "admm", help="ADMM against gradient averaging on logistic regression (breast cancer data, 4 workers):"
        " rounds to the same test accuracy"
    )
    admm.add_argument("--json", action="store_true", help="print the report as one JSON line")
    admm.set_defaults(handler=cmd_bench_admm)

    plan = commands.add_parser("plan", help="predict a run's time, requests, dollars and quotas on AWS")
    from slsml.cost.planreport import add_arguments

    add_arguments(plan)
    plan.set_defaults(handler=cmd_plan)

    datasets = commands.add_parser("data", help="datasets in S3").add_subparsers(dest="action", required=True)
    put = datasets.add_parser("put", help="upload x/y arrays (.npz) as shards plus a manifest")
    put.add_argument("name", help="dataset name (lowercase letters, digits, '-')")
    put.add_argument("file", help="a .npz file with x, y (optional x_test, y_test)")
    put.add_argument("--stack", help="upload to the bucket of the deployed stack of this name (default: the local"
                     " service's bucket)")
    put.add_argument("--bucket", help="or to this bucket (AWS credentials and AWS_ENDPOINT_URL apply)")
    put.add_argument("--test-fraction", type=float, default=0.2, help="held out when the file has no x_test")
    put.add_argument("--shard-size", type=int, default=4096, help="samples per shard object")
    put.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    put.set_defaults(handler=cmd_data_put)
    return parser


def _stop_on_sigterm() -> None:
    """SIGTERM (a ``timeout``, a CI job ending) unwinds like Ctrl-C, so that a local runtime stops its embedded
    cloud and warm processes instead of leaving them behind."""
    def interrupt(signum: int, frame: types.FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _stop_on_sigterm()
    try:
        return args.handler(args)
    except (SlsmlError, ValidationError) as error:
        display.error(str(error))
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        from slsml.aws import clients as aws

        if (problem := aws.setup_problem(error)) is None:
            raise
        display.error(problem)
        return 2


if __name__ == "__main__":
    sys.exit(main())
