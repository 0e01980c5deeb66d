"""Every run is an execution of the run state machine, locally as in AWS."""

from __future__ import annotations

import json
import time

import boto3
import pytest

from slsml.local.faults import Faults
from slsml.pipeline import launch
from slsml.pipeline.steps.common import outcome
from slsml.spec import wiring
from slsml.spec.config import OptimizerConfig, TrainingSpec

from .conftest import finish, prepared_with_source, train
from .test_faults import injecting

HEARTBEAT_S = 5  # more than a paced first iteration (~2 s here; its processes warm: no first step's load and trace)
SPEC = TrainingSpec(
    workers=2,
    reducers=2,
    global_batch=64,
    iterations=11,
    eval_every=0,
    heartbeat_s=HEARTBEAT_S,
    optimizer=OptimizerConfig(name="adam"),
)
PACE = Faults.parse("slow_worker=0:1")  # every iteration takes over 1 s: the run outlives two heartbeat windows


@pytest.fixture
def run_events(local):
    """An SQS queue subscribed to RunEvents, as a user's tool would."""
    sqs = boto3.client("sqs", **local.deployment.client_arguments())
    sns = boto3.client("sns", **local.deployment.client_arguments())
    queue = sqs.create_queue(QueueName=f"run-events-{time.time_ns()}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=local.deployment.topic_arns[wiring.RUN_EVENTS.name], Protocol="sqs", Endpoint=arn)

    def events() -> list[dict]:
        messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=2).get("Messages", [])
        return [json.loads(json.loads(m["Body"])["Message"]) for m in messages]

    return events


def _execution(local, run_id: str, arn: str | None = None) -> tuple[dict, list[str]]:
    """The run's execution (or the one at ``arn``) once it ended, and the states it entered."""
    sfn = local.services.orchestrator.sfn
    arn = arn or local.services.table.get_run(run_id).execution_arn
    for _ in range(100):  # the execution's last states run just after the table says the run ended
        execution = sfn.describe_execution(executionArn=arn)
        if execution["status"] != "RUNNING":
            break
        time.sleep(0.1)
    history = sfn.get_execution_history(executionArn=arn)["events"]
    entered = [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]
    return execution, entered


@pytest.mark.usefixtures("warm")  # the Worker processes have loaded and traced the model: no cold first iteration
def test_a_run_is_an_execution_kept_alive_by_heartbeats(local, services, digits, run_events):
    started = time.monotonic()
    with injecting(local, PACE):
        train(services, SPEC, "sfn-ok")
        run = finish(services, "sfn-ok")
    took = time.monotonic() - started
    assert run.status == "COMPLETED", run.reason
    execution, entered = _execution(local, "sfn-ok")
    assert execution["status"] == "SUCCEEDED"
    assert entered == [
        "NewOrResumed",
        "RegisterRun",
        "PlaceInitialModel",
        "WaitForPipeline",
        "MarkCompleted",
        "PublishCompleted",
        "Completed",
    ]
    # the run outlived its heartbeat window several times over: only the Merger's heartbeats kept it waiting
    assert took > 2 * HEARTBEAT_S, f"run took {took:.1f} s: too short to prove heartbeats"
    assert json.loads(execution["output"])["outcome"]["final_key"] == "runs/sfn-ok/final.keras"
    assert {"run_id": "sfn-ok", "status": "COMPLETED"}.items() <= next(
        e for e in run_events() if e["run_id"] == "sfn-ok"
    ).items()


def test_a_pipeline_that_stops_reporting_fails_by_heartbeat_timeout(local, services, digits, run_events):
    sns = boto3.client("sns", **local.deployment.client_arguments())
    merger_queue = local.host.sqs.get_queue_attributes(
        QueueUrl=local.deployment.queues["merger"], AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    topic = local.deployment.topic_arns[wiring.REDUCE_DONE.name]
    subscription = next(
        s["SubscriptionArn"]
        for s in sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
        if s["Endpoint"] == merger_queue
    )
    raw = sns.get_subscription_attributes(SubscriptionArn=subscription)["Attributes"].get("RawMessageDelivery")
    sns.unsubscribe(SubscriptionArn=subscription)  # ReduceDone no longer reaches the Merger
    try:
        train(services, SPEC, "sfn-stalled")
        run = finish(services, "sfn-stalled", timeout_s=60)
    finally:  # as it was subscribed, for the session's later runs
        sns.subscribe(
            TopicArn=topic, Protocol="sqs", Endpoint=merger_queue, Attributes={"RawMessageDelivery": raw} if raw else {}
        )
    assert run.status == "FAILED"
    assert run.reason.startswith(f"the pipeline stopped reporting: no progress within {HEARTBEAT_S} s"), run.reason
    assert run.iteration == 0
    execution, entered = _execution(local, "sfn-stalled")
    assert execution["status"] == "FAILED"
    assert entered[-6:] == ["ExplainFailure", "NoHeartbeat", "MarkFailed", "ReadReason", "PublishFailed", "Failed"]
    assert next(e for e in run_events() if e["run_id"] == "sfn-stalled")["status"] == "FAILED"


def test_a_run_stopped_before_its_execution_waits_ends_the_execution_stopped(local, services, digits):
    """Stopped as soon as it is registered, while the execution's run-control message is held back: the stop finds no
    task token to answer; the run's start, as it keeps the token, ends the execution, which leaves the run STOPPED."""
    with injecting(local, Faults.parse("sns_delay=1:3")):
        train(services, SPEC, "sfn-stopped-early")
        assert services.stop_run("sfn-stopped-early", "stopped at once")
        assert services.table.get_run("sfn-stopped-early").task_token is None
        execution, entered = _execution(local, "sfn-stopped-early")
    assert execution["status"] == "FAILED" and entered[-1] == "Stopped", (execution, entered)
    run = services.table.get_run("sfn-stopped-early")
    assert (run.status, run.reason) == ("STOPPED", "stopped at once")


@pytest.mark.parametrize(
    ("end", "status", "last_states"),
    [
        ("stop", "STOPPED", ["MarkCompleted", "ReadEnd", "StoppedOrFailed", "Stopped"]),
        ("fail", "FAILED", ["MarkCompleted", "ReadEnd", "StoppedOrFailed", "PublishFailed", "Failed"]),
    ],
)
def test_a_run_ended_as_its_completion_is_answered_ends_as_its_record_says(
    local, services, digits, run_events, end, status, last_states
):
    """A stop or failure that lands between the completion's answer and its mark (a search's Ctrl-C as a trial ends):
    the first end recorded stands, and the execution ends as it says, not as a failure of its own."""
    run_id = f"sfn-{end}-late"
    with injecting(local, PACE):  # the run is still going when the test ends it
        train(services, SPEC, run_id)
        while not (run := services.table.get_run(run_id)).task_token:
            time.sleep(0.05)
        assert getattr(services.table, end)(run_id, f"{end} as it completed")
        services.orchestrator.succeed(run.task_token, outcome(run))
        execution, entered = _execution(local, run_id)
    assert (execution["status"], entered[-len(last_states) :]) == ("FAILED", last_states)
    assert "MarkFailed" not in entered
    run = services.table.get_run(run_id)
    assert (run.status, run.reason) == (status, f"{end} as it completed")
    published = [e for e in run_events() if e["run_id"] == run_id]
    assert [e.get("reason") for e in published] == ([f"{end} as it completed"] if end == "fail" else [])


def test_a_run_stopped_as_its_failure_is_answered_stays_stopped(local, services, digits, run_events):
    """A stop that lands as a step's failure reaches the execution (or its heartbeat runs out): the stop, recorded
    first, stands; the run is not marked FAILED and no FAILED event is published."""
    run_id = "sfn-stopped-failing"
    with injecting(local, PACE):  # the run is still going when the test ends it
        train(services, SPEC, run_id)
        while not (run := services.table.get_run(run_id)).task_token:
            time.sleep(0.05)
        assert services.table.stop(run_id, "stop as it failed")
        services.orchestrator.fail(run.task_token, "a failure for the test")
        execution, entered = _execution(local, run_id)
    assert (execution["status"], execution["error"]) == ("FAILED", "RunStopped")
    assert entered[-3:] == ["MarkFailed", "StoppedHere", "Stopped"], entered
    run = services.table.get_run(run_id)
    assert (run.status, run.reason) == ("STOPPED", "stop as it failed")
    assert not [e for e in run_events() if e["run_id"] == run_id]


def test_a_failed_step_ends_the_execution_with_its_reason(local, services, digits):
    config = prepared_with_source(services, SPEC, "sfn-bad", b"not a model")
    launch.launch_run(services, config)
    run = finish(services, "sfn-bad", timeout_s=60)
    execution, entered = _execution(local, "sfn-bad")
    assert run.status == "FAILED" and "not a Keras model" in run.reason
    assert execution["status"] == "FAILED"
    assert entered[-5:] == ["ReportedFailure", "MarkFailed", "ReadReason", "PublishFailed", "Failed"], entered
    assert execution["cause"] == run.reason  # the pipeline's own reason, as the table keeps it


def test_an_execution_superseded_by_a_resume_leaves_the_resumed_run_alone(local, services, digits):
    # a failed run's execution ends on its own time: here only after the run was resumed
    with injecting(local, PACE):  # the run is still going when the test resumes it
        train(services, SPEC, "sfn-superseded")
        while not (old := services.table.get_run("sfn-superseded")).task_token:
            time.sleep(0.05)
        services.table.fail("sfn-superseded", "a failure for the test")
        resumed = services.table.resume("sfn-superseded", old.iteration)
        services.orchestrator.fail(old.task_token, "a failure for the test")
        execution, entered = _execution(local, "sfn-superseded", old.execution_arn)
        run = services.table.get_run("sfn-superseded")
        services.fail_run("sfn-superseded", "the test is done")  # it has no execution: nothing launches on
    assert (execution["status"], entered[-3:]) == ("FAILED", ["MarkFailed", "StoppedHere", "Superseded"])
    assert (run.status, run.generation, run.reason) == ("RUNNING", resumed.generation, None)


def test_an_execution_for_a_registered_run_id_fails_as_taken_and_changes_nothing(local, services, digits):
    from slsml.state.orchestration import ExecutionInput

    train(services, SPEC, "sfn-taken")
    run = finish(services, "sfn-taken")
    again = ExecutionInput(
        run_id="sfn-taken", dataset="digits", training=SPEC, workers=2, created_at=time.time(), config_sha256="0" * 64
    )
    arn = services.orchestrator.start(again, name="sfn-taken-again")
    execution, entered = _execution(local, "sfn-taken", arn)
    assert (execution["status"], execution["cause"]) == ("FAILED", "the run id is taken")
    assert entered == ["NewOrResumed", "RegisterRun", "RunIdTaken"]  # refused at once: a taken id is not retried
    assert services.table.get_run("sfn-taken") == run
