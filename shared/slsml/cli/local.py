"""`slsml local`: the local cloud as a service that stays up."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from slsml.cli import display, options, targets
from slsml.spec.limits import RunLimits

_console = display.console
# the limits an operator sets (the shortest deadline is the functions' timeouts, as a deployment's)
_LIMITS = {name: field for name, field in RunLimits.model_fields.items() if field.annotation is int}


def cmd_local_up(args: argparse.Namespace) -> int:
    from slsml.local import service

    running = service.status()
    if running is None:
        limits = RunLimits(**{name: value for name in _LIMITS if (value := getattr(args, f"limit_{name}")) is not None})
        with _console().status("starting the embedded cloud and warm function processes…"):
            running = service.up(
                pool=args.pool,
                limits=limits,
                memory_mb=dict(args.memory or []),
                timeouts_s=dict(args.function_timeout or []),
                accelerator_gib=dict(args.accelerator or []),
            )
    display.done(
        f"local service up at {running.endpoint} (pid {running.pid}, {running.pool} warm processes per"
        f" function); bucket {running.deployment['bucket']}. Its runs and data last as long as the service:"
        " `slsml local down` ends them. `slsml local env` prints the variables for other AWS clients.",
        args.json,
        running.shown(),
    )
    return 0


def cmd_local_down(args: argparse.Namespace) -> int:
    from slsml.local import service

    if service.status() is None:
        display.done("no local service was up", args.json, {"stopped": False, "recorded": 0})
        return 0
    recorded_now, runs = _record_runs()
    service.down()
    display.done(
        f"local service stopped; its {runs} run{'' if runs == 1 else 's'} recorded under {targets.RUNS_DIR}/"
        f" ({recorded_now} now, the others as they ended; run list, run status and run fetch read them)",
        args.json,
        {"stopped": True, "recorded": recorded_now, "runs": runs},
    )
    return 0


def _record_runs() -> tuple[int, int]:
    """Record the local service's runs under runs/, as a followed run records itself, so that ``run list`` shows
    the same runs once the service is down: those not recorded there yet or recorded as running; a run still
    running is recorded as stopped. How many were recorded now, and how many runs the service had."""
    from slsml.client import runs
    from slsml.local import service
    from slsml.pipeline import spend
    from slsml.state.records import RunStatus

    state, services = service.connect()
    ended = {summary.run_id for summary in targets.recorded() if summary.status != RunStatus.RUNNING}
    kept = 0
    listed = services.table.list_runs()
    for run in listed:
        if run.run_id in ended:
            continue
        summary = runs.summarize(
            run,
            services.table.list_iterations(run.run_id),
            run.updated_at - run.created_at,
            targets.service_usage(Path(state.log_dir), run),
            spend.spent(services, run),
        )
        if summary.status == RunStatus.RUNNING:
            summary.status, summary.reason = RunStatus.STOPPED, "the local service was stopped while it ran"
        targets.record(services, summary)
        kept += 1
    return kept, len(listed)


def cmd_local_status(args: argparse.Namespace) -> int:
    from slsml.local import service

    state_dir = service.user_state_dir()
    state = service.status(state_dir)
    if state is None:
        _console().print(f"no local service is up (its state would be in {state_dir}; `slsml local up` starts one)")
        if args.json:
            print("null")
        return 1
    display.results(args.json).print(
        f"local service up at {state.endpoint} (pid {state.pid}) for {time.time() - state.started_at:.0f} s; bucket"
        f" {state.deployment['bucket']}, table {state.deployment['table']}; state in {state_dir}, logs in"
        f" {state.log_dir}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    if args.json:
        print(json.dumps(state.shown()))
    return 0


def cmd_local_env(args: argparse.Namespace) -> int:
    import shlex

    from slsml.local import service
    from slsml.spec.errors import NotFoundError

    state = service.status()
    if state is None:
        raise NotFoundError("no local service is up (`slsml local up` starts one)")
    variables = service.environment(state)
    if args.json:
        print(json.dumps(variables))
        return 0
    for name, value in variables.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def add_commands(commands: Any) -> None:
    """`slsml local` and its actions."""
    local = commands.add_parser("local", help="the local cloud as a service that stays up")
    local = local.add_subparsers(dest="action", required=True)
    local_up = local.add_parser("up", help="start the embedded cloud and warm functions in the background")
    local_up.add_argument(
        "--pool", type=int, help="the most warm processes per function (default: from this machine's cores and memory)"
    )
    local_up.add_argument("--json", action="store_true", help="print the service's state as one JSON line")
    options.function_options(local_up)
    for name, field in _LIMITS.items():  # a deployment's CDK context run_limits, by the same names
        flag = f"--limit-{name.removesuffix('_s').replace('_', '-')}"
        local_up.add_argument(
            flag,
            type=int,
            dest=f"limit_{name}",
            metavar="N",
            help=f"{field.description}: a run asking for more fails with the reason (default {field.default})",
        )
    local_up.set_defaults(handler=cmd_local_up)
    down = local.add_parser(
        "down", help="stop the service: its data goes with it, its runs stay listed (their records under ./runs)"
    )
    down.add_argument(
        "--json", action="store_true", help="print whether it stopped one and the runs it recorded as one JSON line"
    )
    down.set_defaults(handler=cmd_local_down)
    status = local.add_parser(
        "status", help="whether the service is up, where, and where its state lives (exit code 1: none is up)"
    )
    status.add_argument(
        "--json", action="store_true", help="print the service's state as one JSON line (null: none is up)"
    )
    status.set_defaults(handler=cmd_local_status)
    env = local.add_parser(
        "env", help="export lines with which any AWS client reaches the service: its endpoint and credentials"
    )
    env.add_argument("--json", action="store_true", help="print the variables as one JSON object")
    env.set_defaults(handler=cmd_local_env)
