"""`slsml plan`: a run's time, requests, dollars and quotas on AWS, predicted."""

from __future__ import annotations

import argparse
from typing import Any

from slsml.cli import display, options


def cmd_plan(args: argparse.Namespace) -> int:
    from slsml.cost import planreport

    spec = options.training_spec(argparse.Namespace(**{
        **vars(args), "iterations": planreport.iterations(args), "reducers": args.reducers or 1}))
    return planreport.run(args, spec, display.results(args.json))


def add_commands(commands: Any) -> None:
    """`slsml plan`."""
    from slsml.cost import planreport

    plan = commands.add_parser("plan", help="predict a run's time, requests, dollars and quotas on AWS")
    options.training_flags(plan, iterations=None, required=False, defaults={"reducers": None})
    planreport.add_arguments(plan)
    plan.set_defaults(handler=cmd_plan)
