"""`slsml plan`: a run's time, requests, dollars and quotas on AWS, predicted."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_plan(args: argparse.Namespace) -> int:
    from slsml.cost import planreport

    return planreport.run(args)


def add_commands(commands: Any) -> None:
    """`slsml plan`."""
    from slsml.cost import planreport

    plan = commands.add_parser("plan", help="predict a run's time, requests, dollars and quotas on AWS")
    planreport.add_arguments(plan)
    plan.set_defaults(handler=cmd_plan)
