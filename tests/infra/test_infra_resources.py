"""The synthesized stack has the resources the pipeline needs, configured as the design says."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aws_cdk.assertions import Match

from infra.layers import RUNTIME
from slsml import deployment, wiring

if TYPE_CHECKING:
    from conftest import Synthesized

PIPELINE_SIZE = len(wiring.FUNCTIONS)


def _of_type(resources: dict[str, dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in resources.items() if r["Type"] == kind}


def _function(synthesized: Synthesized, name: str) -> dict[str, Any]:
    return synthesized.resources[synthesized.logical_id(synthesized.stack.compute.functions[name])]["Properties"]


def test_one_traced_function_per_pipeline_step(synthesized: Synthesized) -> None:
    functions = _of_type(synthesized.resources, "AWS::Lambda::Function")
    traced = {name for name, f in functions.items() if f["Properties"].get("TracingConfig") == {"Mode": "Active"}}
    pipeline = {synthesized.logical_id(fn) for fn in synthesized.stack.compute.functions.values()}
    assert len(pipeline) == PIPELINE_SIZE == 7  # the five of the loop, the watchdog and the run starter
    assert traced == pipeline  # the one other function is CDK's bucket-notification handler


def test_tensorflow_steps_are_images_and_the_others_zips_on_the_layer(synthesized: Synthesized) -> None:
    layer = {"Ref": synthesized.logical_id(synthesized.stack.compute.layer)}
    for fn in wiring.FUNCTIONS:
        props = _function(synthesized, fn.name)
        if fn.needs_tensorflow:
            assert props["PackageType"] == "Image"
            assert props["ImageConfig"]["Command"] == [f"{fn.name}.handler.lambda_handler"]
        else:
            assert props["Runtime"] == RUNTIME.name
            assert props["Handler"] == "handler.lambda_handler"
            assert props["Layers"] == [layer]


def test_function_environment_names_bucket_table_and_published_topics(synthesized: Synthesized) -> None:
    stack = synthesized.stack
    for fn in wiring.FUNCTIONS:
        env = _function(synthesized, fn.name)["Environment"]["Variables"]
        published = {t.env_var: {"Ref": synthesized.logical_id(stack.messaging.topics[t.name])} for t in fn.publishes}
        published |= {q.env_var: {"Ref": synthesized.logical_id(stack.messaging.queues[q.name])} for q in fn.sends}
        if fn.starts_runs:
            published[wiring.STATE_MACHINE_ENV] = {"Ref": synthesized.logical_id(stack.orchestration.state_machine)}
            published[wiring.RUN_DEFAULTS_ENV] = stack.settings.run_defaults.model_dump_json()
        assert env == {
            wiring.BUCKET_ENV: {"Ref": synthesized.logical_id(stack.storage.bucket)},
            wiring.TABLE_ENV: {"Ref": synthesized.logical_id(stack.storage.table)},
            "POWERTOOLS_SERVICE_NAME": deployment.SERVICE_NAME,
            "POWERTOOLS_METRICS_NAMESPACE": deployment.METRICS_NAMESPACE,
            **published,
        }


def test_functions_are_sized_by_settings_and_log_to_retained_groups(synthesized: Synthesized) -> None:
    settings = synthesized.stack.settings
    for fn in wiring.FUNCTIONS:
        props, sizing = _function(synthesized, fn.name), settings.functions[fn.name]
        assert (props["MemorySize"], props["Timeout"]) == (sizing.memory_mb, sizing.timeout_s)
        assert props["EphemeralStorage"] == {"Size": sizing.ephemeral_storage_mb}
        assert props["DeadLetterConfig"]["TargetArn"]["Fn::GetAtt"][0] == synthesized.logical_id(
            synthesized.stack.messaging.function_failures
        )
        log_group = synthesized.resources[props["LoggingConfig"]["LogGroup"]["Ref"]]
        assert log_group["Properties"]["RetentionInDays"] == 30


def test_topics_enforce_tls(synthesized: Synthesized) -> None:
    topics = _of_type(synthesized.resources, "AWS::SNS::Topic")
    assert len(topics) == len(wiring.TOPICS) + 1  # + Alarms
    synthesized.template.resource_count_is("AWS::SNS::TopicPolicy", len(topics))
    synthesized.template.all_resources_properties(
        "AWS::SNS::TopicPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]
                )
            }
        },
    )


def test_queues_are_encrypted_and_enforce_tls_and_dead_letters_are_kept_two_weeks(synthesized: Synthesized) -> None:
    messaging = synthesized.stack.messaging
    # a DLQ per topic subscriber, the failure queue, and each trigger queue with its DLQ
    subscribers = sum(1 for fn in wiring.FUNCTIONS if fn.triggers)
    queue_count = subscribers + 1 + 2 * len(wiring.QUEUES)
    assert len(messaging.dead_letter_queues) == queue_count - len(wiring.QUEUES)
    synthesized.template.resource_count_is("AWS::SQS::Queue", queue_count)
    synthesized.template.all_resources_properties("AWS::SQS::Queue", {"SqsManagedSseEnabled": True})
    for queue in messaging.dead_letter_queues.values():
        props = synthesized.resources[synthesized.logical_id(queue)]["Properties"]
        assert props["MessageRetentionPeriod"] == 14 * 24 * 3600
    synthesized.template.resource_count_is("AWS::SQS::QueuePolicy", queue_count)


def test_table(synthesized: Synthesized) -> None:
    synthesized.template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            "BillingMode": "PAY_PER_REQUEST",
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
            "SSESpecification": {"SSEEnabled": True},
        },
    )
    synthesized.template.has_resource("AWS::DynamoDB::Table", {"DeletionPolicy": "Retain"})


def test_bucket_is_private_encrypted_logged_and_expires_tagged_scratch(synthesized: Synthesized) -> None:
    bucket = synthesized.resources[synthesized.logical_id(synthesized.stack.storage.bucket)]
    props = bucket["Properties"]
    assert bucket["DeletionPolicy"] == "Retain"
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "AES256"
    }
    assert set(props["PublicAccessBlockConfiguration"].values()) == {True}
    assert props["LoggingConfiguration"]["DestinationBucketName"] == {
        "Ref": synthesized.logical_id(synthesized.stack.storage.access_logs)
    }
    scratch = next(r for r in props["LifecycleConfiguration"]["Rules"] if r["Id"] == "ExpireIterationScratch")
    assert scratch["Prefix"] == deployment.RUNS_PREFIX
    assert scratch["TagFilters"] == [{"Key": deployment.SCRATCH_TAG_KEY, "Value": deployment.SCRATCH_TAG_VALUE}]
    assert scratch["ExpirationInDays"] == synthesized.stack.settings.scratch_expiry_days


def test_alarms_cover_errors_dead_letters_and_failed_runs(synthesized: Synthesized) -> None:
    alarms = _of_type(synthesized.resources, "AWS::CloudWatch::Alarm").values()
    by_metric: dict[str, int] = {}
    for alarm in alarms:
        name = alarm["Properties"]["MetricName"]
        by_metric[name] = by_metric.get(name, 0) + 1
        assert alarm["Properties"]["AlarmActions"] == [
            {"Ref": synthesized.logical_id(synthesized.stack.observability.alarm_topic)}
        ]
    assert by_metric == {
        "Errors": PIPELINE_SIZE,
        "ApproximateNumberOfMessagesVisible": PIPELINE_SIZE + 1,
        "ExecutionsFailed": 1,
    }
    state_machine = synthesized.logical_id(synthesized.stack.orchestration.state_machine)
    synthesized.template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "ExecutionsFailed",
            "Namespace": "AWS/States",
            "Threshold": 0,
            "Dimensions": [{"Name": "StateMachineArn", "Value": {"Ref": state_machine}}],
        },
    )


def test_dashboard_shows_the_custom_metrics(synthesized: Synthesized) -> None:
    dashboards = list(_of_type(synthesized.resources, "AWS::CloudWatch::Dashboard").values())
    assert len(dashboards) == 1
    body = str(dashboards[0]["Properties"]["DashboardBody"])
    shown = {m for m in deployment.Metric if f'"{m.value}"' in body}
    assert shown == set(deployment.Metric)


def test_outputs(synthesized: Synthesized) -> None:
    outputs = set(synthesized.template.to_json()["Outputs"])
    topics = {f"{t.name}TopicArn" for t in wiring.TOPICS}
    assert {"BucketName", "TableName", "StateMachineArn", "DashboardUrl", *topics} <= outputs


def test_the_run_state_machine_is_traced_logged_and_uses_service_integrations_only(synthesized: Synthesized) -> None:
    machines = _of_type(synthesized.resources, "AWS::StepFunctions::StateMachine")
    assert len(machines) == 1
    props = next(iter(machines.values()))["Properties"]
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] == "ALL"
    definition = json.loads(_render_join(props["DefinitionString"]))
    start = definition["States"][definition["StartAt"]]  # a new run is registered, a resumed one re-attached
    assert start["Type"] == "Choice" and start["Default"] == "RegisterRun"
    assert [c["Next"] for c in start["Choices"]] == ["RecordExecution"]
    resources = [state["Resource"] for state in definition["States"].values() if state["Type"] == "Task"]
    assert resources and all(r.startswith("arn:aws:states:::") for r in resources)
    assert not [r for r in resources if "lambda" in r]
    wait = definition["States"]["WaitForPipeline"]
    assert wait["Resource"].endswith(".waitForTaskToken")
    assert {"HeartbeatSecondsPath", "TimeoutSecondsPath"} <= wait.keys()


def _render_join(value: object) -> str:
    """A DefinitionString (plain or Fn::Join of literals and references) as text, references as "REF"."""
    if isinstance(value, str):
        return value
    parts = value["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else "REF" for p in parts)


def test_each_functions_log_group_is_an_output(synthesized: Synthesized) -> None:
    """The CLI reads a deployed run's usage lines from the log groups these outputs name."""
    outputs = synthesized.template.to_json()["Outputs"]
    for fn in wiring.FUNCTIONS:
        logged_to = _function(synthesized, fn.name)["LoggingConfig"]["LogGroup"]
        assert outputs[deployment.log_group_output(fn.name)]["Value"] == logged_to
        assert synthesized.resources[logged_to["Ref"]]["Type"] == "AWS::Logs::LogGroup"
