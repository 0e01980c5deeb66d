"""The run state machine: one Step Functions execution per training run (and per resumption), its
lifecycle.

Register the run (DynamoDB: its item, with the training spec stored once, as JSON) → place the
initial model (S3 copy of ``source.keras`` to ``models/000000.keras``, which starts the pipeline) →
wait for the pipeline (SNS RunControl carries a task token to the WorkLauncher; the Merger heartbeats
each iteration; the WorkLauncher reports success when the budget is spent, any step reports failure)
within a run time budget → mark COMPLETED or FAILED with the reason → publish to RunEvents. A resumed
run skips registration and placement: its execution records itself on the run and waits for the
pipeline. Service integrations only, so the same definition runs in AWS and in the embedded cloud.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from slsml.aws.clients import error_code
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.deployment import SERVICE_NAME
from slsml.spec.wiring import STATE_MACHINE_ENV
from slsml.state.records import META, RUN_KIND, RUNS_INDEX

# named by the service explicitly: the local host's fork server imports this module before a function's environment
# is set, and a child logger of an unset service would reach no handler
logger = Logger(service=SERVICE_NAME, child=True)
STOPPED_ERROR = "RunStopped"
_ENDED = {"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"}  # the execution has moved on already
_CONDITION_FAILED = "DynamoDB.ConditionalCheckFailedException"  # a conditional write found the item otherwise


class ExecutionInput(BaseModel):
    """What an execution starts with: the run, its training spec (its time limits among them) and when."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    dataset: str
    training: TrainingSpec
    workers: int = Field(ge=1, description="the workers it trains with at first (the spec's, or auto's fewest)")
    created_at: float
    resume: bool = Field(default=False, description="the run is registered and its model in place: go on with it")
    config_sha256: str = Field(description="the SHA-256 of the run's run.json, registered with it")


def _run_key() -> dict[str, Any]:
    return {"pk": {"S.$": "States.Format('RUN#{}', $.run_id)"}, "sk": {"S": META}}


def _status_write(table: str, update: str, condition: str, values: dict[str, Any]) -> dict[str, Any]:
    """The parameters of an updateItem of the run's item (its ``status`` named ``#status``): ``update`` where
    ``condition`` holds."""
    return {
        "TableName": table,
        "Key": _run_key(),
        "UpdateExpression": update,
        "ConditionExpression": condition,
        "ExpressionAttributeNames": {"#status": "status"},
        "ExpressionAttributeValues": values,
    }


def _number(path: str) -> dict[str, str]:
    return {"N.$": f"States.Format('{{}}', {path})"}


def definition(bucket: str, table: str, run_control_topic: str, run_events_topic: str) -> dict[str, Any]:
    """The Amazon States Language definition (names and ARNs may be CDK tokens)."""
    mark = "arn:aws:states:::dynamodb:updateItem"
    return {
        "Comment": "slsml: one training run",
        "StartAt": "NewOrResumed",
        "States": {
            "NewOrResumed": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.resume", "BooleanEquals": True, "Next": "RecordExecution"}],
                "Default": "RegisterRun",
            },
            "RecordExecution": {  # a resumed run: this execution now answers for it
                "Type": "Task",
                "Resource": mark,
                "Parameters": {
                    "TableName": table,
                    "Key": _run_key(),
                    "UpdateExpression": "SET execution_arn = :execution",
                    "ExpressionAttributeValues": {":execution": {"S.$": "$$.Execution.Id"}},
                },
                "ResultPath": None,
                "Next": "WaitForPipeline",
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "ExplainFailure"}],
            },
            "RegisterRun": {
                "Type": "Task",
                "Resource": "arn:aws:states:::dynamodb:putItem",
                "Parameters": {
                    "TableName": table,
                    "Item": {
                        **_run_key(),
                        RUNS_INDEX.partition.name: {"S": RUN_KIND},  # in the runs index
                        "run_id": {"S.$": "$.run_id"},
                        "status": {"S": "RUNNING"},
                        "dataset": {"S.$": "$.dataset"},
                        "training": {"S.$": "States.JsonToString($.training)"},  # the whole spec, once
                        "config_sha256": {"S.$": "$.config_sha256"},  # what every reader of run.json checks
                        "workers": _number("$.workers"),  # the workers it trains with now
                        "iteration": {"N": "0"},
                        "generation": {"N": "0"},  # resumes count on from here
                        "created_at": _number("$.created_at"),
                        "iteration_at": _number("$.created_at"),
                        "updated_at": _number("$.created_at"),
                        "execution_arn": {"S.$": "$$.Execution.Id"},
                    },
                    # a retried put of this execution's own registration is no other run's id
                    "ConditionExpression": "attribute_not_exists(pk) OR execution_arn = :execution",
                    "ExpressionAttributeValues": {":execution": {"S.$": "$$.Execution.Id"}},
                },
                "ResultPath": None,
                "Next": "PlaceInitialModel",
                "Retry": [
                    {"ErrorEquals": [_CONDITION_FAILED], "MaxAttempts": 0},
                    {"ErrorEquals": ["States.ALL"], "IntervalSeconds": 1, "MaxAttempts": 3, "BackoffRate": 2},
                ],
                "Catch": [
                    {"ErrorEquals": [_CONDITION_FAILED], "Next": "RunIdTaken"},
                    {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "RunNotRegistered"},
                ],
            },
            "RunIdTaken": {"Type": "Fail", "Error": "RunNotRegistered", "Cause": "the run id is taken"},
            "RunNotRegistered": {"Type": "Fail", "ErrorPath": "$.error.Error", "CausePath": "$.error.Cause"},
            "PlaceInitialModel": {
                "Type": "Task",
                "Resource": "arn:aws:states:::aws-sdk:s3:copyObject",
                "Parameters": {
                    "Bucket": bucket,
                    "CopySource.$": f"States.Format('{bucket}/runs/{{}}/{keys.SOURCE_MODEL}', $.run_id)",
                    "Key.$": f"States.Format('runs/{{}}/models/{keys.model_name(0)}', $.run_id)",
                },
                "ResultPath": None,
                "Next": "WaitForPipeline",
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "ExplainFailure"}],
            },
            "WaitForPipeline": {
                "Type": "Task",
                "Resource": "arn:aws:states:::sns:publish.waitForTaskToken",
                "Parameters": {
                    "TopicArn": run_control_topic,
                    "Message": {"schema_version": 1, "run_id.$": "$.run_id", "task_token.$": "$$.Task.Token"},
                },
                "HeartbeatSecondsPath": "$.training.heartbeat_s",
                "TimeoutSecondsPath": "$.training.time_budget_s",
                "ResultPath": "$.outcome",
                "Next": "MarkCompleted",
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "ExplainFailure"}],
            },
            "MarkCompleted": {
                "Type": "Task",
                "Resource": mark,
                "Parameters": _status_write(
                    table,
                    "SET #status = :completed",
                    "#status = :running",
                    {":completed": {"S": "COMPLETED"}, ":running": {"S": "RUNNING"}},
                ),
                "ResultPath": None,
                "Next": "PublishCompleted",
                "Catch": [
                    # stopped or failed as its completion was answered: the run ends as its record says
                    {"ErrorEquals": [_CONDITION_FAILED], "ResultPath": "$.error", "Next": "ReadEnd"},
                    {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "ExplainFailure"},
                ],
            },
            "ReadEnd": {  # how the run ended, whoever ended it first
                "Type": "Task",
                "Resource": "arn:aws:states:::dynamodb:getItem",
                "Parameters": {"TableName": table, "Key": _run_key(), "ConsistentRead": True},
                "ResultSelector": {"status.$": "$.Item.status.S", "reason.$": "$.Item.reason.S"},
                "ResultPath": "$.failure",
                "Next": "StoppedOrFailed",
            },
            "StoppedOrFailed": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.failure.status", "StringEquals": "STOPPED", "Next": "Stopped"}],
                "Default": "PublishFailed",
            },
            "PublishCompleted": {
                "Type": "Task",
                "Resource": "arn:aws:states:::sns:publish",
                "Parameters": {
                    "TopicArn": run_events_topic,
                    "Message": {"run_id.$": "$.run_id", "status": "COMPLETED", "outcome.$": "$.outcome"},
                },
                "ResultPath": None,
                "Next": "Completed",
            },
            "Completed": {"Type": "Succeed"},
            "ExplainFailure": {
                "Type": "Choice",
                "Choices": [
                    {"Variable": "$.error.Error", "StringEquals": STOPPED_ERROR, "Next": "Stopped"},
                    {"Variable": "$.error.Error", "StringEquals": "States.HeartbeatTimeout", "Next": "NoHeartbeat"},
                    {"Variable": "$.error.Error", "StringEquals": "States.Timeout", "Next": "NoHeartbeat"},
                    {
                        "And": [
                            {"Variable": "$.error.Cause", "IsPresent": True},
                            {"Not": {"Variable": "$.error.Cause", "IsNull": True}},
                        ],
                        "Next": "ReportedFailure",
                    },
                ],
                "Default": "UnexplainedFailure",
            },
            "Stopped": {"Type": "Fail", "Error": STOPPED_ERROR, "Cause": "the run was stopped"},
            "NoHeartbeat": {
                "Type": "Pass",
                "Parameters": {
                    "reason.$": "States.Format('the pipeline stopped reporting: no progress within {} s (heartbeat) "
                    "or the run exceeded its {} s budget', $.training.heartbeat_s, $.training.time_budget_s)"
                },
                "ResultPath": "$.failure",
                "Next": "MarkFailed",
            },
            "ReportedFailure": {
                "Type": "Pass",
                "Parameters": {"reason.$": "$.error.Cause"},
                "ResultPath": "$.failure",
                "Next": "MarkFailed",
            },
            "UnexplainedFailure": {
                "Type": "Pass",
                "Parameters": {"reason.$": "States.Format('the run failed ({})', $.error.Error)"},
                "ResultPath": "$.failure",
                "Next": "MarkFailed",
            },
            "MarkFailed": {
                "Type": "Task",
                "Resource": mark,
                # a reason the pipeline recorded first is kept; a run resumed since is another execution's, and a
                # stop recorded first stands
                "Parameters": _status_write(
                    table,
                    "SET #status = :failed, reason = if_not_exists(reason, :reason)",
                    "execution_arn = :execution AND #status <> :stopped",
                    {
                        ":failed": {"S": "FAILED"},
                        ":stopped": {"S": "STOPPED"},
                        ":reason": {"S.$": "$.failure.reason"},
                        ":execution": {"S.$": "$$.Execution.Id"},
                    },
                ),
                "ResultPath": None,
                "Next": "ReadReason",
                "Catch": [{"ErrorEquals": [_CONDITION_FAILED], "ResultPath": "$.error", "Next": "StoppedHere"}],
            },
            "StoppedHere": {  # whether the run is this execution's, stopped (it changes nothing: it only checks)
                "Type": "Task",
                "Resource": mark,
                "Parameters": _status_write(
                    table,
                    "SET execution_arn = :execution",
                    "execution_arn = :execution AND #status = :stopped",
                    {":stopped": {"S": "STOPPED"}, ":execution": {"S.$": "$$.Execution.Id"}},
                ),
                "ResultPath": None,
                "Next": "Stopped",
                "Catch": [{"ErrorEquals": [_CONDITION_FAILED], "ResultPath": "$.error", "Next": "Superseded"}],
            },
            "Superseded": {
                "Type": "Fail",
                "Error": "RunSuperseded",
                "Cause": "the run was resumed by a newer execution",
            },
            "ReadReason": {  # the reason the table kept: the pipeline's own, if it recorded one first
                "Type": "Task",
                "Resource": "arn:aws:states:::dynamodb:getItem",
                "Parameters": {"TableName": table, "Key": _run_key(), "ConsistentRead": True},
                "ResultSelector": {"reason.$": "$.Item.reason.S"},
                "ResultPath": "$.failure",
                "Next": "PublishFailed",
            },
            "PublishFailed": {
                "Type": "Task",
                "Resource": "arn:aws:states:::sns:publish",
                "Parameters": {
                    "TopicArn": run_events_topic,
                    "Message": {"run_id.$": "$.run_id", "status": "FAILED", "reason.$": "$.failure.reason"},
                },
                "ResultPath": None,
                "Next": "Failed",
            },
            "Failed": {"Type": "Fail", "Error": "RunFailed", "CausePath": "$.failure.reason"},
        },
    }


class Orchestrator:
    """Starting executions and answering their task tokens."""

    def __init__(self, sfn: Any, state_machine_arn: str | None) -> None:
        self.sfn = sfn
        self.state_machine_arn = state_machine_arn

    def start(self, execution: ExecutionInput, name: str | None = None) -> str:
        """Start an execution named ``name`` (default: the run id)."""
        if not self.state_machine_arn:
            raise RuntimeError(f"no run state machine configured (set {STATE_MACHINE_ENV})")
        return self.sfn.start_execution(
            stateMachineArn=self.state_machine_arn, name=name or execution.run_id, input=execution.model_dump_json()
        )["executionArn"]

    def describe(self, execution_arn: str) -> tuple[str, str | None]:
        """(status, cause) of an execution."""
        execution = self.sfn.describe_execution(executionArn=execution_arn)
        return execution["status"], execution.get("cause") or execution.get("error")

    def stop(self, token: str | None, reason: str) -> None:
        """End the execution as stopped (the run table already says STOPPED)."""
        self._answer("send_task_failure", token, error=STOPPED_ERROR, cause=reason[:32000])

    def succeed(self, token: str | None, outcome: dict[str, Any]) -> None:
        self._answer("send_task_success", token, output=json.dumps(outcome))

    def fail(self, token: str | None, reason: str) -> None:
        self._answer("send_task_failure", token, error="RunFailed", cause=reason[:32000])

    def heartbeat(self, token: str | None) -> None:
        self._answer("send_task_heartbeat", token)

    def waiting(self, token: str) -> bool:
        """Whether an execution waits on ``token`` now (a heartbeat it accepts: harmless to send)."""
        try:
            self.sfn.send_task_heartbeat(taskToken=token)
        except ClientError as error:
            if error_code(error) not in _ENDED:
                raise
            return False
        return True

    def _answer(self, call: str, token: str | None, **fields: str) -> None:
        if not token:
            return  # the token is not recorded yet: WorkLauncher answers when it records it
        try:
            getattr(self.sfn, call)(taskToken=token, **fields)
        except ClientError as error:
            if error_code(error) not in _ENDED:
                raise
            logger.info("run execution no longer waits", extra={"call": call, "error": error_code(error)})
