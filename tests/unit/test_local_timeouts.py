"""A local runtime's function timeouts, set as a deployment's ``functions.<name>.timeout_s`` set them: the host ends
each function's invocations at its own, and the Worker's and Reducer's are the run limits' ``function_timeouts_s``."""

from __future__ import annotations

from pathlib import Path

import pytest

from slsml.local.cloud import REGION, LocalDeployment
from slsml.local.host import FunctionHost
from slsml.local.runtime import LocalRuntime
from slsml.spec import wiring
from slsml.spec.deployment import DEFAULT_FUNCTIONS
from slsml.spec.errors import BadInputError
from slsml.spec.limits import RunLimits

TIMEOUTS = {"worker": 300, "merger": 600}


def test_the_stage_functions_timeouts_are_the_runtimes_run_limits(tmp_path: Path) -> None:
    runtime = LocalRuntime(pool=1, log_dir=tmp_path, limits=RunLimits(workers=8), timeouts_s=TIMEOUTS)
    assert runtime.limits.function_timeouts_s == {"worker": 300, "reducer": DEFAULT_FUNCTIONS["reducer"].timeout_s}
    assert runtime.limits.workers == 8  # the other limits as given
    assert "the worker function's 300 s timeout" in (runtime.limits.deadline_refusal(200) or "")


def test_the_host_ends_each_function_at_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)  # the host's clients, made (none is called here)
    limits = RunLimits().with_timeouts({"reducer": 200})
    deployment = LocalDeployment(
        endpoint="http://127.0.0.1:9",
        bucket="b",
        table="t",
        topic_arns={topic.name: f"arn:aws:sns:{REGION}:000000000000:{topic.name}" for topic in wiring.TOPICS},
        run_limits=limits.model_dump_json(),
    )
    host = FunctionHost(deployment, dict.fromkeys(DEFAULT_FUNCTIONS, 1), tmp_path, timeouts_s=TIMEOUTS)
    # the merger's its own; the stage functions' the run limits' (as LocalRuntime sets them from its timeouts)
    expected = {name: settings.timeout_s for name, settings in DEFAULT_FUNCTIONS.items()} | {
        "merger": 600,
        "reducer": 200,
    }
    assert host.timeouts == expected


@pytest.mark.parametrize(
    ("timeouts", "named"),
    [
        ({"worker": 901}, "functions.worker.timeout_s=901: Input should be less than or equal to 900"),
        ({"merger": 0}, "functions.merger.timeout_s=0: Input should be greater than or equal to 1"),
        ({"wroker": 60}, "no function named 'wroker' to set"),
    ],
)
def test_a_timeout_lambda_refuses_is_named(tmp_path: Path, timeouts: dict[str, int], named: str) -> None:
    with pytest.raises(BadInputError, match=named):
        LocalRuntime(pool=1, log_dir=tmp_path, timeouts_s=timeouts)
