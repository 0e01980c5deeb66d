"""The GPU worker's fleet: its execution environments on Lambda Managed Instances, one worker each (one request per
execution environment), sized to what the running runs ask.

Lambda does not start them when invocations come, as it does a CPU function's: its scaler keeps between a version's
MinExecutionEnvironments and MaxExecutionEnvironments (``PutFunctionScalingConfig``), adding instances and
environments asynchronously. The fleet is sized to the sum of what the running runs ask (each the most workers it may
have), within the deployment's cap (``functions.worker.max_environments``): both bounds are set to that, so the fleet
neither shrinks under a run nor grows past what runs asked; with no run it is 0 and 0, which deactivates the version
(its instances end) until a run's start raises it again. Every size is computed from the runs (by
``slsml.pipeline.steps.common.size_fleet``), not added to or taken from the last one, so whoever sizes it last, from
a fresh read, sets it right.

A CPU worker has no fleet: ``from_env`` is None where the deployment names none (``deployment.FLEET_FUNCTION_ENV``),
as on the local cloud, and nothing here is called.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools import Logger

from slsml.aws import clients as aws
from slsml.spec.deployment import FLEET_CAP_ENV, FLEET_FUNCTION_ENV, FLEET_QUALIFIER

logger = Logger(child=True)

ACTIVE = "Active"  # the version's State once its execution environments run (GetFunctionConfiguration)


@dataclass(frozen=True)
class Fleet:
    """The execution environments of ``function``'s published version ($LATEST.PUBLISHED), at most ``cap``."""

    client: Any  # boto3's Lambda client
    function: str
    cap: int

    def wanted(self, asks: Iterable[int]) -> int:
        """The environments for runs asking ``asks`` workers each: their sum, within the cap."""
        return min(self.cap, sum(asks))

    def size(self, environments: int) -> bool:
        """Ask for exactly ``environments`` (Min = Max; 0 deactivates the version) unless that is asked already;
        True once Lambda applied it and, with environments wanted, the version is active."""
        target = {"MinExecutionEnvironments": environments, "MaxExecutionEnvironments": environments}
        current = self.client.get_function_scaling_config(FunctionName=self.function, Qualifier=FLEET_QUALIFIER)
        requested = current.get("RequestedFunctionScalingConfig")
        applied = current.get("AppliedFunctionScalingConfig")
        if (requested or applied) != target:
            self.client.put_function_scaling_config(
                FunctionName=self.function, Qualifier=FLEET_QUALIFIER, FunctionScalingConfig=target
            )
            logger.info("GPU fleet resized", extra={"function": self.function, "environments": environments})
            return False
        if applied != target or (requested is not None and requested != applied):
            return False  # Lambda is still applying it
        if environments == 0:
            return True
        version = self.client.get_function_configuration(FunctionName=self.function, Qualifier=FLEET_QUALIFIER)
        return bool(version.get("State") == ACTIVE)


def from_env() -> Fleet | None:
    """The GPU worker's fleet, as the deployment names it to the functions that size it; None: a CPU worker."""
    function = os.environ.get(FLEET_FUNCTION_ENV)
    if not function:
        return None
    return Fleet(client=aws.client("lambda"), function=function, cap=int(os.environ[FLEET_CAP_ENV]))
