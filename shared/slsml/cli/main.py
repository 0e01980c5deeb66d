"""The ``slsml`` command: the parser of every command group's module, and running the command it reads."""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import re
import signal
import sys
import threading
import types
from typing import Any, NoReturn

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from pydantic import ValidationError

from slsml.cli import bench, data, demo, display, local, plan, runs, tune
from slsml.spec.errors import SlsmlError, described, nearest
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
    """An argument parser whose usage errors are one line on stderr, exit 2: the command they are of (``slsml run
    start --batch-count 32``: run start's, not the top level's), what is wrong, the closest option or choice where one
    is close (``--wrokers``: ``--workers``; ``--optimizer adamx``: adamax or adam), and where the options are listed.
    Its subcommands' parsers are of this class too (``add_subparsers`` makes them of the parser's own)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)  # its unknown options, for ``error``
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown and not hasattr(parsed, "_unknown_in"):  # the innermost command: it parses first
            parsed._unknown_in = self
        return parsed, unknown

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            getattr(parsed, "_unknown_in", self).unrecognized(unknown)
        return parsed

    def unrecognized(self, unknown: list[str]) -> NoReturn:
        """The error of arguments no option of this command takes: the first unknown option and the closest known
        one (else the stray arguments)."""
        if (flag := self._unknown_option(unknown)) is None:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        self.error(f"unknown option {flag}{nearest(flag, self._options(), form=str)}")

    def _options(self) -> list[str]:
        return [o for action in self._actions for o in action.option_strings if o.startswith("--")]

    def _unknown_option(self, given: list[str]) -> str | None:
        """The first of ``given`` that looks like a long option and is none of this command's (nor the start of
        one, as argparse takes it)."""
        options = self._options()
        for argument in given:
            flag = argument.partition("=")[0]
            if flag.startswith("--") and len(flag) > 2 and not any(o.startswith(flag) for o in options):
                return flag
        return None

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required") and (
            flag := self._unknown_option(getattr(self, "_given", []))
        ):  # an unknown option is likely the required one mistyped, or one that was meant: name it first
            message = f"unknown option {flag}{nearest(flag, self._options(), form=str)}"
        if choice := INVALID_CHOICE.search(message):  # argparse's own words, with its list of every choice
            given, choices = choice["given"], re.findall(r"'([^']*)'", choice["choices"])
            close = nearest(given, choices, 2, form=str)
            message = f"{message[: choice.start()]}{given!r} is not one of {', '.join(choices)}{close}"
        self.exit(2, f"{self.prog}: error: {message}; `{self.prog} --help` lists its options\n")


# argparse's message for a value not among an argument's choices
INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)$")


def build_parser() -> argparse.ArgumentParser:
    """The whole ``slsml`` parser: every command, subcommand and flag."""
    parser = Parser(prog="slsml", description="Elastic, serverless training of Keras models.", epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"slsml {importlib.metadata.version('slsml')}")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_commands(commands)
    return parser


EXIT_GRACE_S = 5.0  # after Ctrl-C or SIGTERM: how long the command may take to end before it ends at once
# set by Ctrl-C or SIGTERM: an error the command ends on afterwards is the interrupt's (a library may turn the
# KeyboardInterrupt into another error: pybind11 turns one raised in a module's import into an ImportError, which
# Keras takes for a missing package)
_interrupted = threading.Event()


def _end_on_interrupt() -> None:
    """Ctrl-C (SIGINT) and SIGTERM (a ``timeout``, a CI job ending) unwind the command, so that a local runtime
    stops its embedded cloud and warm processes; the command ends within ``EXIT_GRACE_S`` however its threads
    are blocked, and at once on a second signal. Its embedded cloud and warm processes end with it, however it
    ends (``slsml.local.host``, ``slsml.local.moto_server``)."""
    _interrupted.clear()  # a command's own interrupt, not an earlier command's in the same process

    def end_now() -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(130)

    def interrupt(signum: int, frame: types.FrameType | None) -> None:
        if _interrupted.is_set():
            end_now()
        _interrupted.set()
        deadline = threading.Timer(EXIT_GRACE_S, end_now)
        deadline.daemon = True  # a command that ends in time ends without waiting for it
        deadline.start()
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, interrupt)


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv``; None: the process's arguments, the ``slsml`` command, whose process ends with it)."""
    code = _command(argv)
    if argv is None:  # the interpreter's last collection at exit walks every object (TensorFlow's: a second or more)
        gc.freeze()
    return code


def _command(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    _end_on_interrupt()
    try:
        return args.handler(args)
    except SlsmlError as error:
        display.error(str(error))
        return 2
    except ValidationError as error:
        display.error(described(error))
        return 2
    except KeyboardInterrupt as interrupt:
        display.say(str(interrupt) or "interrupted")  # what became of the command's run, where it says
        return 130
    except Exception as error:
        from slsml.aws import clients as aws

        if _interrupted.is_set():  # an error the interrupt caused, whatever its type
            display.say("interrupted")
            return 130
        if (problem := aws.setup_problem(error)) is None:
            raise
        display.error(problem)
        return 2


if __name__ == "__main__":
    sys.exit(main())
