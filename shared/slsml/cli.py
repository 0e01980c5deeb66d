"""The ``slsml`` command: train on the embedded local cloud, inspect runs, upload data."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import types
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, Union, get_args, get_origin

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from pydantic import ValidationError

from slsml import quiet
from slsml.config import KERAS_OPTIMIZERS, OPTIMIZER_NAMES, OptimizerConfig, TrainingSpec
from slsml.errors import BadInputError, SlsmlError

quiet.install()  # before anything imports TensorFlow: its start-up lines stay off the terminal

RUNS_DIR = Path("runs")
DEMO_LEARNING_RATE = 3e-3  # the demo's model: Adam at this rate
IDLE_WAIT_S = 30  # after a local run ends: how long its last invocations may take to log their usage


def _console():
    from rich.console import Console

    return Console(stderr=True)


# ---- options ---------------------------------------------------------------------------------


# TrainingSpec fields set by a flag of the same default and help: the flag's dest → the field
SPEC_FLAGS = {
    "workers": "workers", "reducers": "reducers", "batch": "global_batch", "quorum": "quorum", "seed": "seed",
    "eval_every": "eval_every", "heartbeat": "heartbeat_s", "time_budget": "time_budget_s", "deadline": "deadline_s",
    "deadline_floor": "deadline_floor", "deadline_retries": "deadline_retries",
}


def _spec_option(group: argparse._ArgumentGroup, dest: str) -> None:
    """The flag of TrainingSpec field ``SPEC_FLAGS[dest]``: its type, default and description come from the field."""
    field = TrainingSpec.model_fields[SPEC_FLAGS[dest]]
    if field.annotation not in {int, float} or field.description is None:
        raise TypeError(f"TrainingSpec.{SPEC_FLAGS[dest]}: a flag needs a number with a description")
    group.add_argument(_flag(dest), type=field.annotation, default=field.default,
                       help=f"{field.description} (default {_number(field.default)})")


def _training_options(parser: argparse.ArgumentParser, iterations: int | None) -> None:
    group = parser.add_argument_group("training")
    for dest in ("workers", "reducers", "batch"):
        _spec_option(group, dest)
    group.add_argument("--iterations", type=int, default=iterations, required=iterations is None,
                       help=TrainingSpec.model_fields["iterations"].description
                       + (f" (default {iterations})" if iterations else ""))
    _spec_option(group, "quorum")
    group.add_argument("--loss", help="Keras loss name (default: the model's compiled loss)")
    for dest in ("seed", "eval_every"):
        _spec_option(group, dest)
    group.add_argument("--run-id", help="run name (default: generated)")
    group.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    for dest in ("heartbeat", "time_budget", "deadline", "deadline_floor", "deadline_retries"):
        _spec_option(group, dest)
    group.add_argument("--timeout", type=float, default=3600, help="stop waiting (and fail the run) after this long")
    group.add_argument("--pool", type=int, help="local runs: the most warm processes per function (default: from"
                       " this machine's cores and memory, or the SLSML_POOL environment variable)")
    group.add_argument("--faults", type=_faults,
                       help="local runs: inject faults, e.g. 'seed=3,duplicate=0.5,worker_crash=0.25,"
                       "s3_get_delay=0.2:1.5' (also reducer_crash, merger_crash_once, sns_delay, "
                       "worker_hang=p with hang_s=SECONDS, crash_every_receive, slow_worker=WORKER:SECONDS)")
    _optimizer_options(parser)


# OptimizerConfig's fields other than name and learning_rate: one flag each (--beta-1 sets beta_1)
HYPER_PARAMETERS = tuple(name for name in OptimizerConfig.model_fields if name not in {"name", "learning_rate"})


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
        elif get_origin(kind) is tuple and get_args(kind) == (str, ...):
            group.add_argument(_flag(name), type=_patterns, action="extend", metavar="PATTERN[,PATTERN]",
                               help=f"{about} (comma-separated or repeated)")
        else:
            raise TypeError(f"OptimizerConfig.{name}: no command-line option for a {field.annotation}")


def _patterns(text: str) -> list[str]:
    return [pattern for pattern in text.split(",") if pattern]


def _faults(text: str) -> Any:
    from slsml.faults import Faults

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


def _spec(args: argparse.Namespace, default_learning_rate: float | None = None) -> TrainingSpec:
    """The run the flags ask for. Without --optimizer its optimizer is None (the model's compiled one): the
    optimizer flags apply on top of it once the model is read (``_with_flags``)."""
    return TrainingSpec(
        **{field: getattr(args, dest) for dest, field in SPEC_FLAGS.items()},
        iterations=args.iterations,
        optimizer=_optimizer(args, default_learning_rate),
        loss=args.loss,
    )


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
    from slsml import modelio

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


def _flagged(error: Any) -> str:
    """A pydantic error of OptimizerConfig, on one line, naming flags rather than fields."""
    message = error["msg"].removeprefix("Value error, ")
    fields = "|".join((*HYPER_PARAMETERS, "learning_rate"))
    message = re.sub(rf"(?<![\w-])({fields})(?![\w-])", lambda match: _flag(match[1]), message)
    return f"{_flag(str(error['loc'][0]))}: {message}" if error["loc"] else message


def describe_optimizer(config: OptimizerConfig) -> str:
    """One line: the optimizer, its learning rate or schedule, other hyper-parameters that differ from the
    defaults, weight decay and clipping."""
    rate = config.learning_rate
    if isinstance(rate, float):
        rate_text = f"{rate:g}"
    else:  # a schedule: its class and the numbers that differ from Keras's defaults
        numbers = rate.model_dump(exclude_defaults=True)
        rate_text = f"{rate.class_name}({', '.join(f'{k}={_number(v)}' for k, v in numbers.items())})"
    parts = [KERAS_OPTIMIZERS[config.name], f"learning rate {rate_text}"]
    said = {"weight_decay", "exclude_from_weight_decay", "clipnorm", "global_clipnorm", "clipvalue"}
    defaults = OptimizerConfig(name=config.name)
    parts += [name if value is True else f"{name} {_number(value)}" for name in HYPER_PARAMETERS
              if name not in said and (value := getattr(config, name)) != getattr(defaults, name)]
    decay = f"weight decay {config.weight_decay:g}" if config.weight_decay else "no weight decay"
    if config.exclude_from_weight_decay:
        decay += f" (not on {', '.join(config.exclude_from_weight_decay)})"
    clipping = [f"{name} {value:g}" for name in ("clipnorm", "global_clipnorm", "clipvalue")
                if (value := getattr(config, name))]
    return "optimizer: " + ", ".join([*parts, decay, *(clipping or ["no clipping"])])


def _number(value: Any) -> str:
    if isinstance(value, tuple | list):
        return "(" + ", ".join(_number(v) for v in value) + ")"
    return f"{value:g}" if isinstance(value, float) else str(value)


# ---- running locally -------------------------------------------------------------------------


def _start(services: Any, model_bytes: bytes, dataset: str, spec: TrainingSpec, run_id: str | None) -> Any:
    """Prepare a run, say which optimizer it applies (the model's compiled one unless the flags name one),
    then start it."""
    from slsml import runs

    config = runs.prepare_run(services, model_bytes, dataset, spec, run_id=run_id)
    _console().print(describe_optimizer(config.optimizer), markup=False, highlight=False, soft_wrap=True)
    runs.launch_run(services, config)
    return config


def _train_locally(
    args: argparse.Namespace, spec: TrainingSpec, model_bytes: bytes, dataset: str, arrays: Any, out: Path | None
) -> int:
    from slsml import data, runs
    from slsml.local.runtime import LocalRuntime

    run_id = args.run_id or runs.new_run_id()
    runtime = LocalRuntime(
        workers=spec.workers,
        reducers=spec.reducers,
        pool=args.pool,
        log_dir=Path(".slsml/logs") / run_id,
    )
    with ExitStack() as stack:
        with _console().status("starting the embedded cloud and warm function processes…"):
            services = stack.enter_context(runtime).services
        runtime.host.faults = args.faults
        if arrays is not None:
            data.put_dataset(services.store, dataset, *arrays)
        _start(services, model_bytes, dataset, spec, run_id)

        def usage(run: Any) -> list[Any]:
            from slsml import usage

            runtime.host.wait_idle(run.run_id, IDLE_WAIT_S)
            return usage.read_local(runtime.log_dir, run.run_id)

        return _follow(services, run_id, spec.iterations, args, out, faults=runtime.host.fault_report, usage=usage)


def _follow(
    services: Any,
    run_id: str,
    iterations: int,
    args: argparse.Namespace,
    out: Path | None,
    faults: Callable[[], dict[str, Any]] | None = None,
    usage: Callable[[Any], list[Any]] | None = None,
    started: float | None = None,
) -> int:
    """Show a run's progress until it ends; record its summary (and final model) under runs/<run>/.
    ``usage`` gives the functions' usage records of the ended run; ``started``: when it started (default now)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from slsml import runs

    started = started or time.time()
    columns = (SpinnerColumn(), TextColumn("[bold]{task.fields[run]}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[stats]}"), TimeElapsedColumn())
    with Progress(*columns, console=_console(), transient=False) as progress:
        task = progress.add_task("train", total=iterations, run=run_id, stats="")
        shown = _ProgressText(started)

        def show(run: Any, latest: Any) -> None:
            progress.update(task, completed=run.iteration, stats=shown.update(run, latest))

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
    _print_summary(summary, args.json)
    return 0 if summary.status == "COMPLETED" else 1


class _ProgressText:
    """The figures on the progress line; remembers the last test accuracy seen."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.test_accuracy: float | None = None

    def update(self, run: Any, latest: Any) -> str:
        if latest is None:
            return ""
        if latest.test_accuracy is not None:
            self.test_accuracy = latest.test_accuracy
        parts = [f"loss {latest.train_loss:.4f}"] if latest.train_loss is not None else []
        if latest.train_accuracy is not None:
            parts.append(f"acc {latest.train_accuracy:.3f}")
        if self.test_accuracy is not None:
            parts.append(f"test acc {self.test_accuracy:.3f}")
        parts.append(f"{(time.time() - self.started) / max(1, run.iteration):.2f} s/iter")
        return "  ".join(parts)


def _print_summary(summary: Any, as_json: bool) -> None:
    from rich.table import Table

    table = Table(title=f"run {summary.run_id}", show_header=False)

    def row(name: str, value: Any) -> None:
        table.add_row(name, "–" if value is None else str(value))

    row("status", summary.status.value + (f": {summary.reason}" if summary.reason else ""))
    row("iterations", summary.iterations)
    row("workers × reducers (quorum)", f"{summary.workers} × {summary.reducers} ({summary.quorum})")
    row("test accuracy", None if summary.test_accuracy is None else f"{summary.test_accuracy:.4f}")
    row("wall time", f"{summary.wall_s:.1f} s")
    if summary.median_iteration_s:
        compute = summary.median_worker_compute_s or 0.0
        row("median iteration", f"{summary.median_iteration_s * 1000:.0f} ms")
        row("  worker compute", f"{compute * 1000:.1f} ms ({compute / summary.median_iteration_s:.1%})")
        row("  control/data plane", f"{(summary.median_iteration_s - compute) * 1000:.0f} ms")
    if summary.bytes_read_per_iteration is not None:
        row("S3 bytes per iteration", f"read {summary.bytes_read_per_iteration / 1e6:.2f} MB, "
                                       f"written {summary.bytes_written_per_iteration / 1e6:.2f} MB")
    if summary.requests_per_iteration is not None:
        by_service: dict[str, list[str]] = {}
        for operation, count in summary.requests_per_iteration.items():
            if count:
                service, _, name = operation.partition(":")
                by_service.setdefault(service, []).append(f"{name} {count:g}")
        for i, (service, counts) in enumerate(by_service.items()):
            row("requests per iteration" if i == 0 else "", f"{service}: {', '.join(counts)}")
    if summary.cost_usd is not None:
        per_iteration = summary.cost_per_iteration_usd
        row("cost", f"{_dollars(summary.cost_usd)} in all"
                    + ("" if per_iteration is None else f", {_dollars(per_iteration)} per iteration"))
        by_cost = sorted(summary.cost_by_service_usd.items(), key=lambda item: -item[1])
        row("  by service", ", ".join(f"{service} {_dollars(dollars)}" for service, dollars in by_cost))
        row("  Lambda GB-seconds", f"{summary.gb_seconds:g}")
    row("late workers", summary.late_workers)
    if summary.dropped_parts or summary.nonfinite_updates or summary.stale_attempts:
        row("left out", f"{summary.dropped_parts} parts past their read timeout, {summary.nonfinite_updates}"
                        f" non-finite updates, {summary.stale_attempts} reports of superseded attempts")
    if summary.deadlines_fired or summary.relaunched_workers or summary.relaunched_reducers or summary.stale_shards:
        row("deadlines", f"{summary.deadlines_fired} fired, {summary.relaunched_workers} workers and"
                         f" {summary.relaunched_reducers} reducers re-launched, {summary.stale_shards} stale shards")
    if summary.faults is not None:
        injected = ", ".join(f"{kind} {n}" for kind, n in summary.faults["injected"].items() if n) or "none"
        row("faults injected", injected)
        row("  what it took", f"{summary.faults['failed_invocations']} failed invocations,"
                              f" {summary.faults['retries']} retried, {summary.faults['dead_letters']} dead letters")
    row("final model", summary.final_model)
    _console().print(table)
    if as_json:
        print(summary.model_dump_json())


def _write_report(services: Any, records: list[Any], run_id: str, out_dir: Path, chosen: tuple[int, ...] = (),
                  summary: Any = None) -> None:
    from slsml import report

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


def _dollars(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.3g}"


# ---- commands --------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    spec = _spec(args, default_learning_rate=DEMO_LEARNING_RATE)  # bad flags fail before TensorFlow loads
    from slsml import demo, modelio

    model = demo.digits_cnn(learning_rate=DEMO_LEARNING_RATE, seed=args.seed)  # compiled: Adam
    spec = _with_flags(args, spec, model)
    out = Path(args.out) if args.out else None
    return _train_locally(args, spec, modelio.save_model(model), "digits", demo.digits(args.seed), out)


def _read_arrays(path: Path, test_fraction: float, seed: int) -> tuple[Any, ...]:
    import numpy as np

    from slsml.data import split_train_test

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
    from slsml import data, modelio

    if args.local == bool(args.stack):
        raise BadInputError("say where to run: --local (the embedded cloud) or --stack NAME (a deployed stack)")
    spec = _spec(args)
    model_path = Path(args.model)
    if not model_path.is_file():
        raise BadInputError(f"model file {model_path} does not exist")
    model_bytes = model_path.read_bytes()
    model = modelio.load_model(model_bytes, where=str(model_path))  # fail fast, before any cloud is touched
    spec = _with_flags(args, spec, model)
    data_path = Path(args.data)
    arrays = _read_arrays(data_path, args.test_fraction, args.seed) if data_path.suffix == ".npz" else None
    dataset = data_path.stem.lower().replace("_", "-")[:63] if arrays is not None else args.data
    out = Path(args.out) if args.out else None
    if args.local and _local_service() is None:  # one-shot: a cloud for this run alone
        if arrays is None:
            raise BadInputError(f"--data {args.data}: a local run takes a .npz file with arrays x, y")
        return _train_locally(args, spec, model_bytes, dataset, arrays, out)
    services, usage = _required_target(args)
    if arrays is not None:
        data.put_dataset(services.store, dataset, *arrays)
    config = _start(services, model_bytes, dataset, spec, args.run_id)
    if args.no_wait:
        print(config.run_id)
        return 0
    return _follow(services, config.run_id, spec.iterations, args, out, usage=usage)


def _local_service() -> Any:
    from slsml.local import service

    return service.status()


def _stack_services(name: str) -> Any:
    from slsml.stack import services_for_stack

    return services_for_stack(name)


def _stack_usage(stack: str, run: Any) -> list[Any]:
    from slsml.stack import usage_records

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
    from slsml import usage

    return usage.read_local(log_dir, run.run_id)


def _required_target(args: argparse.Namespace) -> tuple[Any, Callable[[Any], list[Any]]]:
    from slsml.errors import NotFoundError

    target = _target(args)
    if target is None:
        raise NotFoundError("no local service is up (start one with `slsml local up`) and no --stack given")
    return target


def _run_summary(args: argparse.Namespace) -> Any:
    """A run's summary: live from a stack's or the local service's table, or the record a one-shot local
    run left under runs/."""
    from slsml import runs
    from slsml.errors import NotFoundError

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
    _print_summary(_run_summary(args), args.json)
    return 0


def cmd_run_fetch(args: argparse.Namespace) -> int:
    from slsml.errors import NotFoundError

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
    from rich.table import Table

    from slsml import runs

    table = Table("run", "status", "iterations", "test accuracy", "reason")
    target = _target(args)
    if target is not None:
        summaries = [runs.summarize(r, [], r.updated_at - r.created_at) for r in target[0].table.list_runs()]
    else:
        records = sorted(RUNS_DIR.glob("*/summary.json"))
        summaries = [runs.RunSummary.model_validate_json(p.read_text()) for p in records]
    for s in summaries:
        table.add_row(s.run_id, s.status.value, str(s.iterations),
                      "–" if s.test_accuracy is None else f"{s.test_accuracy:.4f}", s.reason or "")
    _console().print(table)
    return 0


def cmd_run_stop(args: argparse.Namespace) -> int:
    services, _ = _required_target(args)
    if not services.stop_run(args.run_id):
        status = services.table.get_run(args.run_id).status.value
        raise BadInputError(f"run {args.run_id} is not running (status {status})")
    _console().print(f"run {args.run_id} stopped: no new iteration starts; work in flight drains")
    return 0


def cmd_run_resume(args: argparse.Namespace) -> int:
    from slsml import runs

    run = runs.resume_run(_required_target(args)[0], args.run_id)
    _console().print(f"run {args.run_id} resumed from its model entering iteration {run.iteration}"
                     f" ({run.iterations - run.iteration} iterations to go)")
    return 0


def cmd_run_watch(args: argparse.Namespace) -> int:
    services, usage = _required_target(args)
    run = services.table.get_run(args.run_id)
    try:
        return _follow(services, args.run_id, run.iterations, args, None, usage=usage, started=run.created_at)
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

    from slsml.errors import NotFoundError
    from slsml.local import service

    state = service.status()
    if state is None:
        raise NotFoundError("no local service is up (`slsml local up` starts one)")
    for name, value in service.environment(state).items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def cmd_data_put(args: argparse.Namespace) -> int:
    from slsml import aws, data
    from slsml.storage import ObjectStore

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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from slsml import bench, runs
    from slsml.local.runtime import LocalRuntime

    pool = bench.worker_pool(args.workers, args.factor)
    runtime = LocalRuntime(workers=pool, reducers=2, pool=pool, log_dir=Path(".slsml/logs") / runs.new_run_id("bench"))
    with ExitStack() as stack:
        with _console().status(f"starting the embedded cloud and warm function processes ({pool} for workers)…"):
            stack.enter_context(runtime)
        columns = (TextColumn("[bold]({task.description})"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=_console()) as progress:
            tasks: dict[str, Any] = {}

            def show(case: str, done: int, total: int) -> None:
                if case not in tasks:
                    tasks[case] = progress.add_task(case, total=total)
                progress.update(tasks[case], completed=done)

            report = bench.stragglers(runtime, args.workers, args.iterations, args.slow_iterations, args.factor, show)
    _print_stragglers(report)
    if args.json:
        print(report.model_dump_json())
    return 0 if all(case.summary.status == "COMPLETED" for case in report.cases) else 1


def _print_stragglers(report: Any) -> None:
    from fractions import Fraction

    from rich.table import Table

    from slsml import bench

    table = Table("", "straggler", "quorum", "iters", "median iter", "× (a)", "test acc", "late",
                  title=f"stragglers: {report.workers} workers, factor {report.factor:g}")
    for case in report.cases:
        s = case.summary
        table.add_row(case.name, f"worker {report.straggler}" if case.straggler else "–",
                      str(Fraction(case.quorum).limit_denominator(report.workers)), str(s.iterations),
                      "–" if s.median_iteration_s is None else f"{s.median_iteration_s:.3f} s",
                      "–" if case.ratio is None else f"{case.ratio:.2f}",
                      "–" if s.test_accuracy is None else f"{s.test_accuracy:.4f}", str(s.late_workers))
    console = _console()
    console.print(table)
    for case in report.cases:
        if case.summary.status != "COMPLETED":
            console.print(f"[red]({case.name}) {case.summary.status.value}[/red]: {case.summary.reason}")
    c, yes = report.case("c"), {True: "yes", False: "no"}
    console.print(f"delay: worker {report.straggler} sleeps {report.delay_s:.2f} s at the start of every invocation "
                  f"= ({report.factor:g} − 1) × {report.baseline_s:.3f} s, the {report.baseline}")
    ratio = "–" if c.ratio is None else f"{c.ratio:.2f}×"
    console.print(f"(c) median iteration {ratio} (a)'s: within {bench.WITHIN}× of (a): {yes[report.c_within]}")
    console.print(f"(d) median iteration grew by {report.d_growth_s:.2f} s over (a)'s, "
                  f"{report.d_growth_s / report.delay_s:.2f} × the delay: grew with the delay "
                  f"(at least {bench.GREW:g} × it): {yes[report.d_grew]}")
    accuracy = "–" if c.summary.test_accuracy is None else f"{c.summary.test_accuracy:.4f}"
    console.print(f"(c) test accuracy {accuracy}: reaches the demo's {bench.ACCURACY_TARGET}: "
                  f"{yes[report.c_reaches_target]}")


def cmd_bench_barrier(args: argparse.Namespace) -> int:
    from rich.table import Table

    from slsml import bench_barrier

    with _console().status(f"driving {args.small} and {args.workers} reports through the barriers…"):
        report = bench_barrier.barrier(args.workers, args.reducers, args.small)
    table = Table("workers", "reducers", "max item bytes", "WU / report", "max WU / report", "WU / shard report",
                  "participants item", "RU at fire", "s / report", title="barrier cost per report")
    for f in (report.small, report.large):
        table.add_row(str(f.workers), str(f.reducers), str(f.max_item_bytes), f"{f.write_units_per_report:.2f}",
                      str(f.max_write_units_per_report), f"{f.write_units_per_shard_report:.2f}",
                      f"{f.participants_item_bytes} B", f"{f.fire_read_units:g}",
                      f"{f.seconds_per_report * 1000:.1f} ms")
    console, yes = _console(), {True: "yes", False: "no"}
    console.print(table)
    console.print(f"at {args.workers} workers, within {bench_barrier.WITHIN:.0%} of {args.small}: max item bytes "
                  f"{yes[report.item_bytes_within]}, write units per report {yes[report.write_units_within]}")
    if args.json:
        print(report.model_dump_json())
    fired = all(f.fired and f.merged for f in (report.small, report.large))
    return 0 if fired and report.item_bytes_within and report.write_units_within else 1


def cmd_bench_scale(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from slsml import bench_scale, runs

    local = bench_scale.runtime(Path(".slsml/logs") / runs.new_run_id("scale"))
    with ExitStack() as stack:
        with _console().status("starting the embedded cloud and one warm process per function…"):
            stack.enter_context(local)
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=_console()) as progress:
            tasks: dict[str, Any] = {}

            def show(point: str, done: int, total: int) -> None:
                if point not in tasks:
                    tasks[point] = progress.add_task(point, total=total)
                progress.update(tasks[point], completed=done)

            grid = (args.workers or bench_scale.WORKERS, args.reducers or bench_scale.REDUCERS)
            report = bench_scale.scale(local, *grid, args.iterations, show)
    bench_scale.write_calibration(report, Path(args.calibration))
    _print_scale(report, args.calibration)
    if args.json:
        print(report.model_dump_json())
    return 0 if all(point.status == "COMPLETED" for point in report.points) else 1


def _print_scale(report: Any, calibration: str) -> None:
    from rich import box
    from rich.table import Table

    from slsml import bench_scale
    from slsml.costmodel import Parameters

    console = _console()
    console.print(f"[bold]{report.model}[/bold]: {report.params:,} weights, batch {report.batch}, quorum 1, "
                  f"{report.iterations} iterations per configuration; warm processes per function: "
                  + ", ".join(f"{name} {n}" for name, n in report.pools.items()))
    requests = Table("W", "R", "plan", "run", "minimum", "run ÷ minimum", "differences (plan → run)",
                     title="requests per iteration: the plan against the run summary (median iteration), and the "
                           "minimum chain")
    for p in report.points:
        differences = ", ".join(f"{op} {a:g} → {b:g}" for op, (a, b) in p.mismatches.items())
        requests.add_row(str(p.workers), str(p.reducers), f"{sum(p.predicted_requests.values()):g}",
                         f"{sum(p.measured_requests.values()):g}", f"{sum(p.minimum_requests.values()):g}",
                         f"{p.over_minimum:.2f}×", f"[red]{differences}" if differences else "[green]none")
    console.print(requests)
    columns = {"event": ("model → WorkLauncher",), "launch": ("WorkLauncher",), "hops": bench_scale.HOPS,
               "work": ("Worker",), "fire": ("ReduceLauncher (fires)",), "reduce": ("Reducer",),
               "merge": ("Merger (merges)",)}
    stages = Table("W×R", "", *columns, "iter", "error", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False,
                   title="stage times (ms), median steady iteration: the run and the fitted model")
    for p in report.points:
        label = f"{p.workers}×{p.reducers}"
        if p.predicted_iteration_s is None:
            stages.add_row(label, p.status.lower())
            continue
        for i, (source, figures, total) in enumerate((("run", p.measured_stages, p.measured_iteration_s),
                                                      ("model", p.predicted_stages, p.predicted_iteration_s))):
            cells = [f"{sum(figures[s] for s in names) * 1000:.0f}" for names in columns.values()]
            stages.add_row(label if i == 0 else "", source, *cells, f"{total * 1000:.0f}",
                           f"{p.error:+.0%}" if i else "", end_section=i == 1)
    console.print(stages)
    defaults = Parameters()
    fitted = Table("parameter", "fitted (embedded cloud)", "the model's default (AWS)", "unit",
                   title="parameters fitted by least squares on the stage times")
    for name, value in report.fitted.items():
        unit = Parameters.model_fields[name].json_schema_extra["unit"]
        fitted.add_row(name, f"{value:.4g}", f"{getattr(defaults, name):.4g}", unit)
    fitted.add_row("(local runtime) dispatch", f"{report.dispatch_s:.4g}", "", "s")
    console.print(fitted)
    unresolved = [name for name, value in report.fitted.items() if value >= bench_scale.UNBOUNDED_MB_S]
    if unresolved:
        console.print(f"{', '.join(unresolved)}: the grid's bytes took no time the fit could see (its inverse is 0)")
    worst = max((p for p in report.points if p.error is not None), key=lambda p: abs(p.error))
    console.print(f"iteration time, fitted model against measured: median error {report.median_error:.1%}, "
                  f"max {report.max_error:.1%} (W {worst.workers}, R {worst.reducers})")
    console.print(f"calibration written to {calibration}: slsml plan --calibration {calibration} …")


def cmd_plan(args: argparse.Namespace) -> int:
    from slsml import planreport

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

    plan = commands.add_parser("plan", help="predict a run's time, requests, dollars and quotas on AWS")
    from slsml.planreport import add_arguments

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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (SlsmlError, ValidationError) as error:
        from rich.markup import escape

        _console().print(f"[red]error:[/red] {escape(str(error))}", soft_wrap=True)  # not cut at the terminal width
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
