"""`slsml plan --stack NAME` plans for that deployment: the Worker and Reducer timeouts its CDK context set (the
stack's RunLimits output) decide the plan's continuations, its duration quotas and the deadlines it refuses, as they
decide what the deployed pipeline does. The stack lives in the embedded cloud (CloudFormation outputs alone)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from slsml.cli.main import main
from slsml.local.cloud import REGION, EmbeddedCloud
from slsml.spec import wiring
from slsml.spec.limits import RUN_LIMITS_OUTPUT, RunLimits

STACK = "slsml-plan-stack"
WORKER_TIMEOUT_S = 600
WORKER_MB = 5120
# a round of 100 local steps of 128 samples at 0.05 s each: about 400 s on a default Worker
ROUNDS = [
    "--params",
    "2560000",
    "--compute-per-sample",
    "0.05",
    "--workers",
    "8",
    "--reducers",
    "4",
    "--batch",
    "1024",
    "--iterations",
    "10",
    "--algorithm",
    "average",
    "--local-steps",
    "100",
]


@pytest.fixture(scope="module")
def stack(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[str]:
    """A stack whose Worker times out after 600 s and has 5,120 MB (``functions.worker.timeout_s`` and ``memory_mb``
    in its CDK context)."""
    cloud = EmbeddedCloud()
    cloud.start()
    for name, value in {
        "AWS_ACCESS_KEY_ID": cloud.credentials.access_key,
        "AWS_SECRET_ACCESS_KEY": cloud.credentials.secret_key,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": cloud.endpoint,
    }.items():
        monkeypatch_module.setenv(name, value)
    limits = RunLimits(function_timeouts_s={"worker": WORKER_TIMEOUT_S, "reducer": 120}, worker_memory_mb=WORKER_MB)
    outputs = {
        "BucketName": "plan-bucket",
        "TableName": "plan-table",
        "StateMachineArn": f"arn:aws:states:{REGION}:000000000000:stateMachine:plan",
        **{f"{t.name}TopicArn": f"arn:aws:sns:{REGION}:000000000000:{t.name}" for t in wiring.TOPICS},
        RUN_LIMITS_OUTPUT: limits.model_dump_json(),
    }
    template = {
        "Resources": {"Placeholder": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "plan-placeholder"}}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    cloud.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(template))
    try:
        yield STACK
    finally:
        cloud.stop()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def plan(capsys: pytest.CaptureFixture, *args: str) -> dict:
    capsys.readouterr()
    assert main(["plan", *ROUNDS, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_plan_hands_rounds_on_at_the_stacks_worker_timeout(stack: str, capsys: pytest.CaptureFixture) -> None:
    default = plan(capsys)
    deployed = plan(capsys, "--stack", stack, "--deadline", str(WORKER_TIMEOUT_S))
    worker_mb = [default["workload"]["memory_mb"]["worker"], deployed["workload"]["memory_mb"]["worker"]]
    assert worker_mb == [3008, WORKER_MB]  # the stack's worker, whose micro-batches the plan sizes
    given = plan(capsys, "--stack", stack, "--deadline", str(WORKER_TIMEOUT_S), "--memory", "worker=4096")
    assert given["workload"]["memory_mb"]["worker"] == 4096  # --memory plans another size than the stack's
    assert default["workload"]["timeout_s"]["worker"] == 120
    assert default["continuations"]["invocations"] > 1
    assert any("outlasts the Worker's 120 s timeout" in warning for warning in default["verdict"]["warnings"])
    assert deployed["workload"]["timeout_s"]["worker"] == WORKER_TIMEOUT_S
    assert deployed["continuations"]["invocations"] == 1  # the round fits one invocation of this deployment
    assert not any("timeout" in warning for warning in deployed["verdict"]["warnings"])
    duration = {q["name"]: q for q in deployed["quotas"]}["duration: worker"]
    assert duration["limit"] == WORKER_TIMEOUT_S and duration["ok"]


def test_the_plan_refuses_a_deadline_shorter_than_the_stacks_worker_timeout(
    stack: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["plan", *ROUNDS, "--stack", stack]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "a deadline of 120 s" in error and f"the worker function's {WORKER_TIMEOUT_S} s timeout" in error
