"""`slsml` against a deployed stack found by name: the same commands a user runs after `cdk deploy`,
here with a stack in the embedded cloud whose outputs name the embedded resources."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import boto3
import numpy as np
import pytest

from slsml.client import demo, runs
from slsml.spec import wiring
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.deployment import log_group_output
from slsml.training import modelio

from .conftest import final_weights, finish, train

STACK = "slsml-test"


def _log_group(function: str) -> str:
    return f"/aws/lambda/{STACK}-{function}"


@pytest.fixture(scope="module")
def stack_env(local):
    deployment = local.deployment
    logs = boto3.client("logs", **deployment.client_arguments())
    for fn in wiring.FUNCTIONS:
        logs.create_log_group(logGroupName=_log_group(fn.name))
        logs.create_log_stream(logGroupName=_log_group(fn.name), logStreamName="local")
    outputs = {
        "BucketName": deployment.bucket,
        "TableName": deployment.table,
        "StateMachineArn": deployment.state_machine_arn,
        **{f"{t.name}TopicArn": deployment.topic_arns[t.name] for t in wiring.TOPICS},
        **{log_group_output(fn.name): _log_group(fn.name) for fn in wiring.FUNCTIONS},
    }
    template = {
        "Resources": {"Placeholder": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": "stack-placeholder"}}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    boto3.client("cloudformation", **deployment.client_arguments()).create_stack(
        StackName=STACK, TemplateBody=json.dumps(template)
    )
    return {**os.environ, **deployment.environment()}


def ship_logs(local, run_id: str) -> int:
    """Put the run's lines of the local functions' logs into the stack's log groups, as Lambda does."""
    logs = boto3.client("logs", **local.deployment.client_arguments())
    shipped = 0
    for fn in wiring.FUNCTIONS:
        lines = [line for line in (local.log_dir / f"{fn.name}.log").read_text().splitlines() if run_id in line]
        if lines:
            now = int(time.time() * 1000)
            logs.put_log_events(
                logGroupName=_log_group(fn.name),
                logStreamName="local",
                logEvents=[{"timestamp": now, "message": line} for line in lines],
            )
            shipped += len(lines)
    return shipped


def slsml(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slsml.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_data_put_run_start_status_list_fetch_on_a_stack(local, stack_env, tmp_path: Path, digits) -> None:
    x, y, x_test, y_test = digits
    np.savez(tmp_path / "few.npz", x=x[:300], y=y[:300], x_test=x_test[:50], y_test=y_test[:50])
    (tmp_path / "m.keras").write_bytes(modelio.save_model(demo.digits_cnn()))

    put = slsml(stack_env, tmp_path, "data", "put", "few-digits", "few.npz", "--stack", STACK)
    assert put.returncode == 0, put.stderr
    started = slsml(
        stack_env,
        tmp_path,
        "run",
        "start",
        "--stack",
        STACK,
        "--model",
        "m.keras",
        "--data",
        "few-digits",
        "--workers",
        "2",
        "--reducers",
        "2",
        "--batch",
        "64",
        "--iterations",
        "3",
        "--run-id",
        "on-stack",
        "--json",
    )
    assert started.returncode == 0, started.stderr[-2000:]
    assert json.loads(started.stdout.strip().splitlines()[-1])["status"] == "COMPLETED"

    assert ship_logs(local, "on-stack") > 0
    status = slsml(stack_env, tmp_path, "run", "status", "on-stack", "--stack", STACK, "--json")
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout.strip().splitlines()[-1])
    assert (summary["status"], summary["iterations"], summary["workers"]) == ("COMPLETED", 3, 2)
    assert summary["requests_per_iteration"]["s3:PutObject"] > 0 and summary["cost_usd"] > 0  # from CloudWatch
    reported = slsml(
        stack_env, tmp_path, "run", "report", "on-stack", "--stack", STACK, "--out", "report", "--iteration", "1"
    )
    assert reported.returncode == 0, reported.stderr
    page = (tmp_path / "report" / "index.html").read_text()  # the figures of run status
    assert json.loads(re.search(r'id="summary-json">(.*?)</script>', page).group(1)) == summary
    assert (tmp_path / "report" / "timeline-1.png").stat().st_size > 0
    listed = slsml(stack_env, tmp_path, "run", "list", "--stack", STACK)
    assert "on-stack" in listed.stdout and "COMPLETED" in listed.stdout
    fetched = slsml(stack_env, tmp_path, "run", "fetch", "on-stack", "--stack", STACK, "--out", "got.keras")
    assert fetched.returncode == 0, fetched.stderr
    assert modelio.load_model((tmp_path / "got.keras").read_bytes()).count_params() > 0


def test_a_stack_that_is_not_there_is_named(stack_env, tmp_path: Path) -> None:
    missing = slsml(stack_env, tmp_path, "run", "list", "--stack", "nope")
    assert missing.returncode == 2 and "no stack named 'nope'" in missing.stderr


@pytest.mark.parametrize(
    ("unset", "names"),
    [
        (("AWS_DEFAULT_REGION", "AWS_REGION"), "no AWS region is set: set AWS_DEFAULT_REGION"),
        (
            ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
            "Unable to locate credentials: configure them as for the AWS CLI",
        ),
    ],
)
def test_a_stack_command_without_a_region_or_credentials_says_what_to_set(stack_env, tmp_path, unset, names) -> None:
    nowhere = str(tmp_path / "no-such-file")  # no AWS profile either, and no instance to ask
    env = {k: v for k, v in stack_env.items() if k not in unset}
    env |= {"AWS_CONFIG_FILE": nowhere, "AWS_SHARED_CREDENTIALS_FILE": nowhere, "AWS_EC2_METADATA_DISABLED": "true"}
    done = slsml(env, tmp_path, "run", "list", "--stack", STACK)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert names in " ".join(done.stderr.split()), done.stderr


def test_run_stop_ends_the_run_and_its_execution(stack_env, tmp_path: Path, services, digits) -> None:
    train(services, TrainingSpec(workers=2, reducers=1, global_batch=64, iterations=500, eval_every=0), "to-stop")
    while services.table.get_run("to-stop").iteration < 2:
        time.sleep(0.1)
    stopped = slsml(stack_env, tmp_path, "run", "stop", "to-stop", "--stack", STACK)
    assert stopped.returncode == 0, stopped.stderr
    run = services.table.get_run("to-stop")
    assert run.status == "STOPPED" and run.reason == "stopped by the user"
    sfn = services.orchestrator.sfn
    for _ in range(100):
        status = sfn.describe_execution(executionArn=run.execution_arn)["status"]
        if status != "RUNNING":
            break
        time.sleep(0.1)
    execution = sfn.describe_execution(executionArn=run.execution_arn)
    assert (status, execution.get("error")) == ("FAILED", "RunStopped")
    time.sleep(3)  # in-flight work drains; nothing new is launched
    at_stop = run.iteration
    assert services.table.get_run("to-stop").iteration <= at_stop + 1
    assert len(services.table.list_iterations("to-stop")) <= at_stop + 2
    again = slsml(stack_env, tmp_path, "run", "stop", "to-stop", "--stack", STACK)
    assert again.returncode == 2 and "is not running (status STOPPED)" in again.stderr


def test_stopped_and_failed_runs_resume_to_the_weights_of_an_uninterrupted_run(
    local, stack_env, tmp_path: Path, services, digits
) -> None:
    # iterations enough that the run is still going when each command returns (a few seconds; an iteration
    # takes a fraction of one)
    spec = TrainingSpec(
        workers=2,
        reducers=2,
        global_batch=64,
        iterations=30,
        eval_every=0,
        optimizer=OptimizerConfig(name="adam", learning_rate=3e-3),
    )
    train(services, spec, "uninterrupted")  # alongside the interrupted run: runs do not disturb each other
    train(services, spec, "interrupted")
    while services.table.get_run("interrupted").iteration < 2:
        time.sleep(0.05)
    assert slsml(stack_env, tmp_path, "run", "stop", "interrupted", "--stack", STACK).returncode == 0
    assert local.host.wait_idle("interrupted", timeout_s=60)  # its in-flight work drains
    resumed = slsml(stack_env, tmp_path, "run", "resume", "interrupted", "--stack", STACK)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from its model entering iteration" in resumed.stderr

    while services.table.get_run("interrupted").iteration < 5:  # then it fails, and is resumed again
        time.sleep(0.05)
    services.fail_run("interrupted", "a failure for the test")
    assert runs.resume_run(services, "interrupted").generation == 2

    run = finish(services, "interrupted")
    assert (run.status, run.iteration, run.generation) == ("COMPLETED", spec.iterations, 2), run.reason
    assert finish(services, "uninterrupted").status == "COMPLETED"
    assert np.array_equal(final_weights(services, "interrupted")[0], final_weights(services, "uninterrupted")[0])
    again = slsml(stack_env, tmp_path, "run", "resume", "interrupted", "--stack", STACK)
    message = " ".join(again.stderr.split())  # the console wraps long lines
    assert again.returncode == 2 and "is COMPLETED: only a STOPPED or FAILED run can be resumed" in message
    fetched = slsml(stack_env, tmp_path, "run", "fetch", "interrupted", "-o", "further.keras", "--stack", STACK)
    assert fetched.returncode == 0 and "`slsml run fetch interrupted`, then `slsml run start --model" in message
    assert modelio.load_model((tmp_path / "further.keras").read_bytes()).weights  # the model to train further


def test_fit_trains_the_model_on_a_stack(local, stack_env, services, digits, monkeypatch) -> None:
    import slsml

    for name, value in local.deployment.environment().items():  # as a notebook with the stack's account would
        monkeypatch.setenv(name, value)
    x, y = digits[0][:256], digits[1][:256]
    model = demo.digits_cnn(seed=3)
    untrained = [w.copy() for w in model.get_weights()]
    before = {r.run_id for r in services.table.list_runs()}
    history = slsml.fit(model, x, y, batch_size=64, epochs=2, workers=2, reducers=2, verbose=0, stack=STACK)

    (run,) = [r for r in services.table.list_runs() if r.run_id not in before]  # the run went to the stack's table
    assert (run.status, run.iterations) == ("COMPLETED", 8), run.reason  # 256 samples / 64 per iteration × 2 epochs
    assert len(history.history["loss"]) == 2
    stored, _ = final_weights(services, run.run_id)
    trained = np.concatenate([w.ravel() for w in model.get_weights()])
    assert np.array_equal(trained, stored)  # the model holds the stack's final weights
    assert not np.array_equal(trained, np.concatenate([w.ravel() for w in untrained]))
