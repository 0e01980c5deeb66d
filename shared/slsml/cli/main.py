"""The ``slsml`` command: the parser of every command group's module, and running the command it reads."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import sys
import threading
import types
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from pydantic import ValidationError

from slsml.cli import bench, data, demo, display, local, plan, runs, tune
from slsml.spec.errors import SlsmlError, problems
from slsml.training import quiet

quiet.install()  # before anything imports TensorFlow: its start-up lines stay off the terminal

GROUPS = (demo, runs, tune, local, bench, plan, data)  # the command groups, in the order the help lists them
EXIT_CODES = (
    "exit codes: 0 done; 1 the run failed or was stopped (a benchmark: one of its checks failed; local"
    " status: no service is up); 2 bad usage or input; 130 interrupted (Ctrl-C, SIGTERM). A command's"
    " result (a table, a listing, a status, a plan) goes to stdout, with --json as one JSON line;"
    " progress and diagnostics go to stderr."
)


class Parser(argparse.ArgumentParser):
    """An argument parser that names the usage of the command an unknown argument was given to (``slsml run
    start --batch-size 32``: run start's), not the top level's."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown and not hasattr(parsed, "_unknown_in"):  # the innermost command: it parses first
            parsed._unknown_in = self
        return parsed, unknown

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            getattr(parsed, "_unknown_in", self).error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    """The whole ``slsml`` parser: every command, subcommand and flag."""
    parser = Parser(prog="slsml", description="Elastic, serverless training of Keras models.", epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"slsml {importlib.metadata.version('slsml')}")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_commands(commands)
    return parser


EXIT_GRACE_S = 5.0  # after Ctrl-C or SIGTERM: how long the command may take to end before it ends at once


def _end_on_interrupt() -> None:
    """Ctrl-C (SIGINT) and SIGTERM (a ``timeout``, a CI job ending) unwind the command, so that a local runtime
    stops its embedded cloud and warm processes; the command ends within ``EXIT_GRACE_S`` however its threads
    are blocked, and at once on a second signal. Its embedded cloud and warm processes end with it, however it
    ends (``slsml.local.host``, ``slsml.local.moto_server``)."""
    interrupted = threading.Event()

    def end_now() -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(130)

    def interrupt(signum: int, frame: types.FrameType | None) -> None:
        if interrupted.is_set():
            end_now()
        interrupted.set()
        deadline = threading.Timer(EXIT_GRACE_S, end_now)
        deadline.daemon = True  # a command that ends in time ends without waiting for it
        deadline.start()
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, interrupt)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _end_on_interrupt()
    try:
        return args.handler(args)
    except SlsmlError as error:
        display.error(str(error))
        return 2
    except ValidationError as error:
        for line in problems(error):
            display.error(line)
        return 2
    except KeyboardInterrupt as interrupt:
        display.say(str(interrupt) or "interrupted")  # what became of the command's run, where it says
        return 130
    except Exception as error:
        from slsml.aws import clients as aws

        if (problem := aws.setup_problem(error)) is None:
            raise
        display.error(problem)
        return 2


if __name__ == "__main__":
    sys.exit(main())
