"""`slsml local`: the local cloud as a service that stays up."""

from __future__ import annotations

import argparse
import time
from typing import Any

from slsml.cli import display

_console = display.console


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


def add_commands(commands: Any) -> None:
    """`slsml local` and its actions."""
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
