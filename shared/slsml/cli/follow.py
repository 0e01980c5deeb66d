"""Starting a run and following it to its end: progress on the terminal, its summary and final model recorded
under runs/<run>/, its report on request; a run on an embedded cloud of its own."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from slsml.cli import display, display_runs, targets
from slsml.pipeline import launch
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError

IDLE_WAIT_S = 30  # after a local run ends: how long its last invocations may take to log their usage
LOGS_DIR = Path(".slsml/logs")  # a one-shot local run's function logs: .slsml/logs/<run>
_console = display.console  # the commands' one-line messages and spinners


def start(services: Any, model_bytes: bytes, dataset: str, spec: TrainingSpec, run_id: str | None) -> Any:
    """Prepare a run, say which optimizer it applies (the model's compiled one unless the flags name one),
    then start it."""

    config = launch.prepare_run(services, model_bytes, dataset, spec, run_id=run_id)
    display.say(display_runs.describe_update(config))
    launch.launch_run(services, config)
    return config


def one_shot_runtime(args: argparse.Namespace, spec: TrainingSpec) -> Any:
    """The local runtime of a run on a cloud of its own, begun: its cloud and function processes get ready
    while this process loads TensorFlow and the model. Its logs go to .slsml/logs/<run id>. A name an earlier
    one-shot run left a record or logs under is refused: nothing of that run is overwritten."""
    from slsml.local.runtime import LocalRuntime, sized_for

    log_dir = LOGS_DIR / (args.run_id or launch.new_run_id())
    used = [str(path) for path in (targets.RUNS_DIR / log_dir.name, log_dir) if path.exists()]
    if used:
        raise BadInputError(
            f"--run-id {log_dir.name}: an earlier local run has this name ({' and '.join(used)}); give another"
        )
    return LocalRuntime(
        **sized_for(spec),
        pool=args.pool,
        log_dir=log_dir,
        memory_mb=dict(args.memory or []),
        timeouts_s=dict(args.function_timeout or []),
        accelerator_gib=dict(args.accelerator or []),
    ).begin()


def train_locally(
    args: argparse.Namespace,
    runtime: Any,
    spec: TrainingSpec,
    model_bytes: bytes,
    dataset: str | Callable[[Any], str],
    out: Path | None,
) -> int:
    """Train on ``dataset``: a dataset's name, or what uploads one to a store and names it."""
    run_id = runtime.log_dir.name
    started = False
    try:
        with ExitStack() as stack:
            with _console().status("starting the embedded cloud and warm function processes…"):
                services = stack.enter_context(runtime).services
            runtime.host.faults = args.faults
            if callable(dataset):
                dataset = dataset(services.store)
            config = start(services, model_bytes, dataset, spec, run_id)
            started = True

            def usage(run: Any) -> list[Any]:
                from slsml.accounting import usage

                runtime.host.wait_idle(run.run_id, IDLE_WAIT_S)
                return usage.read_local(runtime.log_dir, run.run_id)

            return follow(
                services,
                run_id,
                config.training.iterations,
                args,
                out,
                faults=runtime.host.fault_report,
                usage=usage,
                so_far=partial(targets.service_usage, runtime.log_dir),
            )
    except KeyboardInterrupt:
        what = "ended with the embedded cloud it ran on" if started else "was not started"
        raise KeyboardInterrupt(f"interrupted: run {run_id} {what}; its logs are in {runtime.log_dir}") from None


def follow(
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
    running one (a run with a budget shows the spend its functions count instead); ``started``: when it started
    (default now)."""
    from slsml.client import runs
    from slsml.pipeline import spend

    started = started or time.time()
    spent: Callable[[Any], float] | None = None if so_far is None else partial(_spent, so_far)
    if services.table.get_run(run_id).training.budget_usd is not None:  # its functions count what they spend
        spent = partial(_counted, services)
    with display_runs.run_progress(run_id, iterations, started, spent) as show:
        run = runs.wait_for_run(services, run_id, on_progress=show, timeout_s=args.timeout)
    wall_s = time.time() - started
    records = usage(run) if usage else None
    summary = runs.summarize(run, services.table.list_iterations(run_id), wall_s, records, spend.spent(services, run))
    if faults is not None and args.faults:
        summary.faults = faults()
    targets.record(services, summary, out)
    if getattr(args, "report", None):
        write_report(services, records or [], run_id, Path(args.report), summary=summary)
    display_runs.print_summary(summary, args.json)
    return 0 if summary.status == "COMPLETED" else 1


def live_usage(args: argparse.Namespace) -> Callable[[Any], list[Any]] | None:
    """How to read a running run's usage lines while it is followed: from the local service's logs (a stack's
    are in CloudWatch: read once, at the end)."""
    state = None if getattr(args, "stack", None) else targets.local_service()
    return None if state is None else partial(targets.service_usage, Path(state.log_dir))


def _counted(services: Any, run: Any) -> float:
    """The dollars a run with a budget spent so far, as its functions counted them."""
    return services.table.spent(run.run_id)


def _spent(usage: Callable[[Any], list[Any]], run: Any) -> float:
    """The dollars a run's functions used so far, by their usage lines."""
    from slsml.accounting import prices
    from slsml.accounting import usage as accounting

    return sum(accounting.cost(usage(run), prices.load()).values())


def write_report(
    services: Any, records: list[Any], run_id: str, out_dir: Path, chosen: tuple[int, ...] = (), summary: Any = None
) -> Path:
    """Write a run's report under ``out_dir`` (saying where on stderr); its page."""
    from slsml.cli import report

    with _console().status(f"writing the report of {run_id}…"):
        page = report.write_report(services, records, run_id, out_dir, chosen, summary)
    _console().print(f"report: {page}", markup=False, highlight=False, soft_wrap=True)
    return page
