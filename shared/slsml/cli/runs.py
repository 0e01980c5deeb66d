"""`slsml run`: start a run, follow it, and inspect, stop, resume, scale, list and report runs."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from slsml.cli import display, display_runs, follow, options, targets
from slsml.cli.data import upload_file
from slsml.spec.errors import BadInputError

LAUNCH_WAIT_S = 5.0  # run scale: how long to wait for the launch of the iteration the run is at
_console = display.console  # the commands' one-line messages and spinners


def cmd_run_start(args: argparse.Namespace) -> int:
    where = "say where to run: --local (the embedded cloud) or --stack NAME (a deployed stack)"
    if args.local and args.stack:
        raise BadInputError(f"{where}, not both")
    service = None if args.stack else targets.local_service()
    if not (args.local or args.stack):
        if service is None:
            raise BadInputError(
                f"{where}; or start the local service (`slsml local up`), where a run with neither goes"
            )
        _console().print(
            f"running on the local service at {service.endpoint} (neither --local nor --stack given)", soft_wrap=True
        )
        args.local = True
    spec = options.training_spec(args)
    model_path = Path(args.model)
    if not model_path.is_file():
        raise BadInputError(f"model file {model_path} does not exist")
    data_path = Path(args.data)
    one_shot = args.local and service is None  # a cloud for this run alone
    options.check_local_options_apply(args, one_shot)
    options.check_data_not_a_model(args.data)
    if one_shot and data_path.suffix != ".npz":
        raise BadInputError(
            f"--data {args.data}: a one-shot local run takes a .npz file with arrays x, y; to train on it, store it"
            f" in the local service: `slsml local up`, `slsml data put NAME {args.data}` (see `slsml data put -h`),"
            " then `slsml run start --local --data NAME …`"
        )
    runtime = follow.one_shot_runtime(args, spec) if one_shot else None
    from slsml.training import bounds, modelio

    limits = bounds.Limits.here()  # the Worker's: the function that trains it
    bounds.check_size(str(model_path), model_path.stat().st_size, limits.archive_bytes, limits.describe())
    model_bytes = model_path.read_bytes()
    model = modelio.load_model(model_bytes, where=str(model_path))  # fail fast: before anything is stored
    spec = options.with_flags(args, spec, model)
    if data_path.suffix == ".npz":
        dataset: Any = partial(
            upload_file, path=data_path, name=args.dataset, test_fraction=args.test_fraction, seed=args.seed
        )
    elif args.dataset:
        raise BadInputError(f"--dataset names the dataset a file is uploaded as; --data {args.data} is no file")
    else:
        dataset = args.data
    out = Path(args.out) if args.out else None
    if runtime is not None:
        return follow.train_locally(args, runtime, spec, model_bytes, dataset, out)
    services, usage = targets.required_target(args)
    if callable(dataset):
        dataset = dataset(services.store)
    config = follow.start(services, model_bytes, dataset, spec, args.run_id)
    if args.no_wait:
        print(config.run_id)
        return 0
    return follow.follow(
        services, config.run_id, config.training.iterations, args, out, usage=usage, so_far=follow.live_usage(args)
    )


def _run_summary(args: argparse.Namespace) -> tuple[Any, Any]:
    """A run's summary, with the services it was read from: live from a stack's or the local service's table,
    else (services None) the record a local run left under runs/."""
    from slsml.client import runs
    from slsml.pipeline import spend
    from slsml.spec.errors import NotFoundError

    target = targets.target(args)
    if target is not None:
        services, usage = target
        try:
            run = services.table.get_run(args.run_id)
        except NotFoundError:
            if args.stack:
                raise
        else:
            summary = runs.summarize(
                run,
                services.table.list_iterations(args.run_id),
                run.updated_at - run.created_at,
                usage(run),
                spend.spent(services, run),
            )
            return summary, services
    if recorded := targets.recorded(args.run_id):
        return recorded[0], None
    where = "" if target is None else ", nor in the local service"
    raise NotFoundError(
        f"no run named {args.run_id!r} (no record under {targets.RUNS_DIR}/{where}; for a deployed run give --stack)"
    )


def cmd_run_status(args: argparse.Namespace) -> int:
    display_runs.print_summary(_run_summary(args)[0], args.json)
    return 0


def cmd_run_fetch(args: argparse.Namespace) -> int:
    from slsml.spec.errors import NotFoundError

    summary, services = _run_summary(args)
    out = Path(args.out or f"{args.run_id}.keras")
    if args.iteration is not None:
        if services is None:
            raise NotFoundError(
                f"run {args.run_id}'s saved models are in the local service's bucket: start it (slsml local up)"
            )
        from slsml.client import runs

        out.write_bytes(runs.saved_model(services, args.run_id, args.iteration))
        what = f"model of {args.run_id} entering iteration {args.iteration}"
    elif services is not None and summary.final_model:
        from slsml.client import runs

        out.write_bytes(runs.final_model(services, services.table.get_run(args.run_id)))
    elif services is None and summary.final_model and Path(summary.final_model).exists():
        out.write_bytes(Path(summary.final_model).read_bytes())
    else:
        raise NotFoundError(f"run {args.run_id} has no final model (status {summary.status.value})")
    display.done(
        f"{what if args.iteration is not None else f'final model of {args.run_id}'} → {out}",
        args.json,
        {"run_id": args.run_id, "model": str(out), "bytes": out.stat().st_size},
    )
    return 0


def cmd_run_list(args: argparse.Namespace) -> int:
    """The runs of a deployed stack (--stack), else those recorded under runs/ and the local service's if it is
    up (its own figures where both have a run): the same runs whether or not it is up, as ``local down``
    records the service's runs there. Oldest first."""
    from slsml.client import runs

    listed = {} if args.stack else {summary.run_id: summary for summary in targets.recorded()}
    target = targets.target(args)
    if target is not None:
        listed |= {r.run_id: runs.summarize(r, [], r.updated_at - r.created_at) for r in target[0].table.list_runs()}
    display_runs.print_runs(sorted(listed.values(), key=lambda s: (s.started_at or 0.0, s.run_id)), args.json)
    return 0


def cmd_run_stop(args: argparse.Namespace) -> int:
    services, _ = targets.required_target(args)
    if not services.stop_run(args.run_id):
        status = services.table.get_run(args.run_id).status.value
        raise BadInputError(f"run {args.run_id} is not running (status {status})")
    display.done(
        f"run {args.run_id} stopped: no new iteration starts; work in flight drains",
        args.json,
        {"run_id": args.run_id, "status": services.table.get_run(args.run_id).status.value},
    )
    return 0


def cmd_run_resume(args: argparse.Namespace) -> int:
    from slsml.client import runs
    from slsml.pipeline import spend

    services = targets.required_target(args)[0]
    run = runs.resume_run(services, args.run_id, args.budget_usd)
    budget, spent = run.training.budget_usd, spend.spent(services, run)
    said = "" if budget is None else f"; {display.spend(spent or 0.0, budget)}"
    display.done(
        f"run {args.run_id} resumed from its model entering iteration {run.iteration}"
        f" ({run.iterations - run.iteration} iterations to go){said}",
        args.json,
        {
            "run_id": args.run_id,
            "status": run.status.value,
            "iteration": run.iteration,
            "iterations": run.iterations,
            "generation": run.generation,
            **({} if budget is None else {"budget_usd": budget, "spent_usd": spent}),
        },
    )
    return 0


def cmd_run_scale(args: argparse.Namespace) -> int:
    from slsml.client import runs

    services, _ = targets.required_target(args)
    was = services.table.get_run(args.run_id).workers
    run = runs.scale_run(services, args.run_id, args.workers)
    tuned = "; workers auto: the tuner goes on from there" if run.training.workers == "auto" else ""
    applies = _scaled_from(services, run)
    display.done(
        f"run {args.run_id}: {run.workers} workers {applies} (was {was}){tuned}",
        args.json,
        {"run_id": args.run_id, "workers": run.workers, "was": was, "applies": applies},
    )
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
    services, usage = targets.required_target(args)
    run = services.table.get_run(args.run_id)
    try:
        return follow.follow(
            services,
            args.run_id,
            run.iterations,
            args,
            None,
            usage=usage,
            started=run.created_at,
            so_far=follow.live_usage(args),
        )
    except KeyboardInterrupt:
        _console().print(f"stopped watching: run {args.run_id} goes on")
        return 130


def cmd_run_report(args: argparse.Namespace) -> int:
    if targets.target(args) is None:
        raise BadInputError(
            "no local service is up and no --stack given: a one-shot local run's records last only"
            " while its `slsml run start --local` or `slsml demo` runs (give it --report DIR)"
        )
    services, usage = targets.required_target(args)
    run = services.table.get_run(args.run_id)
    out = Path(args.out) if args.out else Path("runs") / args.run_id / "report"
    page = follow.write_report(services, usage(run), args.run_id, out, tuple(args.iteration or ()))
    if args.json:
        print(json.dumps({"run_id": args.run_id, "report": str(page)}))
    return 0


def add_commands(commands: Any) -> None:
    """`slsml run` and its actions."""
    run = commands.add_parser("run", help="start and inspect training runs")
    run = run.add_subparsers(dest="action", required=True)
    start = run.add_parser("start", help="train your .keras model on your data")
    start.add_argument(
        "--local",
        action="store_true",
        help="run on the embedded local cloud: the local service if one is up, else a cloud for this run alone"
        " (with neither --local nor --stack: the local service, which must be up)",
    )
    start.add_argument("--stack", help="run on the deployed stack of this name (CloudFormation outputs)")
    start.add_argument("--model", required=True, help="a .keras model file")
    start.add_argument(
        "--data",
        required=True,
        help="a .npz file with x, y (optional x_test, y_test), or a dataset already in the stack",
    )
    start.add_argument(
        "--no-wait",
        action="store_true",
        help="print the run id and return (--stack, or the local service up)",
    )
    start.add_argument(
        "--dataset",
        metavar="NAME",
        help="the name --data FILE is uploaded as (default: the file's"
        " name); a file whose content is uploaded already is trained on as it is",
    )
    start.add_argument("--test-fraction", type=float, default=0.2, help="held out when the data has no x_test")
    start.add_argument("--out", help="where to save the final model (default runs/<run>/final.keras)")
    start.add_argument(
        "--report", metavar="DIR", help="when the run ends, write its report: DIR/index.html and its PNGs"
    )
    options.training_options(start, iterations=None)
    start.set_defaults(handler=cmd_run_start)
    stack_help = (
        "the deployed stack of this name (default: the local runs: the local service's, if one is up, and"
        " those recorded under ./runs)"
    )
    act_help = "the deployed stack of this name (default: the local service)"
    _command(run, "status", "a run's state and figures", cmd_run_status, stack_help, "the summary")
    report = _command(
        run,
        "report",
        "a run's report: one HTML page with its curves, iteration timelines, costs and faults, and its PNGs",
        cmd_run_report,
        "the deployed stack of this name (default: the local"
        " service; a one-shot local run: --report DIR of run start --local or demo)",
        "the report's page",
    )
    report.add_argument(
        "-o", "--out", metavar="DIR", help="where index.html and its PNGs go (default runs/<run>/report)"
    )
    report.add_argument(
        "--iteration",
        type=int,
        nargs="+",
        action="extend",
        metavar="I",
        help="also draw these iterations' timelines (besides the slowest and a median one)",
    )
    fetch = _command(run, "fetch", "copy a run's final model", cmd_run_fetch, stack_help, "the model's path and bytes")
    fetch.add_argument("-o", "--out", help="destination (default <run>.keras)")
    fetch.add_argument(
        "--iteration",
        type=int,
        metavar="I",
        help="the model entering iteration I instead, where the run saved it (--checkpoint-every, evaluations)",
    )
    _command(run, "stop", "stop a run: no new iteration starts", cmd_run_stop, act_help, "the run's status")
    resume = _command(
        run,
        "resume",
        "run a stopped or failed run on from its last complete model",
        cmd_run_resume,
        act_help,
        "the run's status, iteration and spend against its budget",
    )
    resume.add_argument(
        options.flag("budget_usd"),
        type=float,
        metavar="DOLLARS",
        help="a new dollar budget for the run, of which what it spent so far counts (a run stopped"
        " by its budget resumes with a higher one)",
    )
    scale = _command(
        run,
        "scale",
        "change a run's workers, from the next iteration launched on (a stopped or failed run's: from its resume on)",
        cmd_run_scale,
        act_help,
        "the run's workers",
    )
    scale.add_argument(
        "--workers",
        type=options.workers,
        required=True,
        help="the workers (within the run's --min-workers and --max-workers)",
    )
    _command(
        run,
        "list",
        "runs and their status, oldest first",
        cmd_run_list,
        stack_help,
        "the runs: a list of summaries",
        run_id=False,
    )
    watch = _command(
        run, "watch", "follow a run until it ends (Ctrl-C leaves the run alone)", cmd_run_watch, act_help, "the summary"
    )
    watch.add_argument("--timeout", type=float, default=7 * 24 * 3600, help="stop watching after this long")


def _command(
    run: Any,
    name: str,
    about: str,
    handler: Callable[[argparse.Namespace], int],
    stack: str,
    result: str,
    run_id: bool = True,
) -> argparse.ArgumentParser:
    """The parser of ``slsml run NAME``, run by ``handler``: the run's id (unless not ``run_id``), ``--stack`` and
    ``--json`` (printing ``result`` as one JSON line); its own flags are the caller's."""
    parser = run.add_parser(name, help=about)
    if run_id:
        parser.add_argument("run_id")
    parser.add_argument("--stack", help=stack)
    parser.add_argument("--json", action="store_true", help=f"print {result} as one JSON line")
    parser.set_defaults(handler=handler)
    return parser
