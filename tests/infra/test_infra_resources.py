"""The synthesized stack has the resources the pipeline needs, configured as the design says."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aws_cdk.assertions import Match

from infra.layers import RUNTIME
from infra.observability import CUSTOM_STATISTICS, custom_metric
from slsml.spec import deployment, limits, wiring

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
    assert len(pipeline) == PIPELINE_SIZE == 8  # the five of the loop, the watchdog, run starter, dead-letter reader
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
        if fn.reads_dead_letters:  # checked by test_infra_wiring
            published[wiring.DEAD_LETTER_SOURCES_ENV] = env.get(wiring.DEAD_LETTER_SOURCES_ENV)
        assert env == {
            wiring.BUCKET_ENV: {"Ref": synthesized.logical_id(stack.storage.bucket)},
            wiring.TABLE_ENV: {"Ref": synthesized.logical_id(stack.storage.table)},
            wiring.STORAGE_ENV: str(stack.settings.functions[fn.name].ephemeral_storage_mb),
            "POWERTOOLS_SERVICE_NAME": deployment.SERVICE_NAME,
            "POWERTOOLS_METRICS_NAMESPACE": deployment.METRICS_NAMESPACE,
            wiring.RUN_LIMITS_ENV: stack.settings.limits.model_dump_json(),
            wiring.SIGNING_KEY_ENV: {"Fn::GetAtt": [synthesized.logical_id(stack.signing.key), "Arn"]},
            **published,
        }


def test_functions_are_sized_by_settings_and_log_to_retained_groups(synthesized: Synthesized) -> None:
    settings = synthesized.stack.settings
    for fn in wiring.FUNCTIONS:
        props, sizing = _function(synthesized, fn.name), settings.functions[fn.name]
        assert (props["MemorySize"], props["Timeout"]) == (sizing.memory_mb, sizing.timeout_s)
        assert props["EphemeralStorage"] == {"Size": sizing.ephemeral_storage_mb}
        if fn.reads_dead_letters:  # invoked by its queues only, never asynchronously
            assert "DeadLetterConfig" not in props
        else:
            assert props["DeadLetterConfig"]["TargetArn"]["Fn::GetAtt"][0] == synthesized.logical_id(
                synthesized.stack.messaging.function_failures
            )
        log_group = synthesized.resources[props["LoggingConfig"]["LogGroup"]["Ref"]]
        assert log_group["Properties"]["RetentionInDays"] == 30


def test_the_fleet_has_reserved_concurrency_that_leaves_the_watchdog_and_the_dead_letter_reader_room(
    synthesized: Synthesized,
) -> None:
    reserved = {fn.name: _function(synthesized, fn.name).get("ReservedConcurrentExecutions") for fn in wiring.FUNCTIONS}
    fleet = {"worker", "reduce_launcher", "reducer", "merger"}  # the functions a run's width multiplies
    assert {name for name, n in reserved.items() if n is not None} == fleet, reserved
    assert reserved["worker"] >= limits.RunLimits().workers  # a run at the workers limit runs at once
    unreserved = synthesized.stack.settings.account_concurrency - sum(n for n in reserved.values() if n is not None)
    assert unreserved >= deployment.UNRESERVED_MINIMUM  # where the watchdog and the dead-letter reader run
    assert reserved["watchdog"] is None and reserved["dead_letters"] is None  # never throttled by the fleet's cap


def test_the_run_limits_are_an_output_the_cli_reads(synthesized: Synthesized) -> None:
    output = synthesized.template.to_json()["Outputs"][limits.RUN_LIMITS_OUTPUT]["Value"]
    assert limits.RunLimits.model_validate_json(output) == synthesized.stack.settings.limits


def test_the_shortest_deadline_runs_are_checked_against_is_the_stage_functions_deployed_timeout(
    synthesized: Synthesized,
) -> None:
    output = synthesized.template.to_json()["Outputs"][limits.RUN_LIMITS_OUTPUT]["Value"]
    checked = limits.RunLimits.model_validate_json(output).function_timeouts_s
    assert checked == {name: _function(synthesized, name)["Timeout"] for name in deployment.STAGE_FUNCTIONS}


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


def test_topics_are_encrypted_with_a_rotated_customer_managed_key_their_publishers_may_use(
    synthesized: Synthesized,
) -> None:
    """Every topic, the alarms' too, under the topic key; its policy lets S3 (for the topics bucket notifications
    publish to) and CloudWatch (for the alarms) use it; each function and the run state machine publish with their
    roles' grants of it."""
    stack = synthesized.stack
    key = synthesized.logical_id(stack.messaging.topic_key)
    assert synthesized.resources[key]["Properties"]["EnableKeyRotation"] is True
    for name, topic in _of_type(synthesized.resources, "AWS::SNS::Topic").items():
        assert topic["Properties"].get("KmsMasterKeyId") == {"Fn::GetAtt": [key, "Arn"]}, name
    services = {}
    for statement in synthesized.resources[key]["Properties"]["KeyPolicy"]["Statement"]:
        service = statement["Principal"].get("Service")
        if service is not None:
            services[service] = set(_listed(statement["Action"]))
    assert wiring.BUCKET_NOTIFICATIONS  # S3 publishes ModelUpdated and ModelDropped
    assert {"kms:GenerateDataKey", "kms:Decrypt"} <= services.pop("s3.amazonaws.com")
    assert {"kms:GenerateDataKey*", "kms:Decrypt"} <= services.pop("cloudwatch.amazonaws.com")
    assert services == {}
    publishers = [
        (f"<{fn.name}>", synthesized.logical_id(stack.compute.functions[fn.name]))
        for fn in wiring.FUNCTIONS
        if fn.publishes
    ]
    state_machine = stack.get_logical_id(stack.orchestration.state_machine.role.node.default_child)
    for name, role in [(n, _role_of(synthesized, f)) for n, f in publishers] + [("state machine", state_machine)]:
        granted = _granted_on(synthesized, role, {"Fn::GetAtt": [key, "Arn"]})
        assert granted == {"kms:GenerateDataKey", "kms:Decrypt"}, (name, granted)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _role_of(synthesized: Synthesized, function_id: str) -> str:
    return synthesized.resources[function_id]["Properties"]["Role"]["Fn::GetAtt"][0]


def _granted_on(synthesized: Synthesized, role: str, resource: Any) -> set[str]:
    """The actions the policies attached to ``role`` allow on ``resource``."""
    granted: set[str] = set()
    for policy in _of_type(synthesized.resources, "AWS::IAM::Policy").values():
        if {"Ref": role} in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                if resource in _listed(statement["Resource"]):
                    granted |= set(_listed(statement["Action"]))
    return granted


def test_the_bucket_notification_handler_logs_to_a_group_with_the_functions_retention(
    synthesized: Synthesized,
) -> None:
    """CDK's own function that writes the bucket's notification configuration: its logs are not kept forever."""
    (handler,) = [
        f["Properties"]
        for name, f in _of_type(synthesized.resources, "AWS::Lambda::Function").items()
        if name.startswith("BucketNotificationsHandler")
    ]
    log_group = synthesized.resources[handler["LoggingConfig"]["LogGroup"]["Ref"]]
    assert log_group["Type"] == "AWS::Logs::LogGroup"
    assert log_group["Properties"]["RetentionInDays"] == 30  # as the functions' own


def test_queues_are_encrypted_and_enforce_tls_and_dead_letters_are_kept_two_weeks(synthesized: Synthesized) -> None:
    messaging = synthesized.stack.messaging
    # a DLQ per topic subscriber, the failure queue, and each trigger queue with its DLQ
    subscribers = sum(1 for fn in wiring.FUNCTIONS if fn.triggers)
    queue_count = subscribers + 1 + 2 * len(wiring.QUEUES)
    assert len(messaging.dead_letter_queues) == queue_count - len(wiring.QUEUES)
    synthesized.template.resource_count_is("AWS::SQS::Queue", queue_count)
    synthesized.template.all_resources_properties("AWS::SQS::Queue", {"SqsManagedSseEnabled": True})
    reader_timeout = synthesized.stack.settings.functions[wiring.dead_letter_reader().name].timeout_s
    for queue in messaging.dead_letter_queues.values():
        props = synthesized.resources[synthesized.logical_id(queue)]["Properties"]
        assert props["MessageRetentionPeriod"] == 14 * 24 * 3600
        assert props["VisibilityTimeout"] >= reader_timeout  # each feeds the dead-letter reader
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
    rules = {rule["Id"]: rule for rule in props["LifecycleConfiguration"]["Rules"]}
    # the rules declared once for the deployed bucket and the local cloud's
    assert set(rules) == {rule.id for rule in deployment.lifecycle_rules()}
    scratch = rules["ExpireIterationScratch"]
    assert scratch["Prefix"] == deployment.RUNS_PREFIX
    assert scratch["TagFilters"] == [{"Key": deployment.SCRATCH_TAG_KEY, "Value": deployment.SCRATCH_TAG_VALUE}]
    assert scratch["ExpirationInDays"] == synthesized.stack.settings.scratch_expiry_days
    assert rules["AbortIncompleteUploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    # no rule expires an untagged object: models, run configs and the carried state a stopped run resumes from
    expiring = [rule for rule in rules.values() if "ExpirationInDays" in rule or "NoncurrentVersionExpiration" in rule]
    assert expiring == [scratch]


def test_alarms_cover_errors_dead_letters_failed_runs_rejected_messages_and_deadline_actions(
    synthesized: Synthesized,
) -> None:
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
        "NumberOfMessagesReceived": len(synthesized.stack.messaging.dead_letter_queues),
        "ExecutionsFailed": 1,
        deployment.Metric.REJECTED_MESSAGES: 1,
        deployment.Metric.DEADLINE_ACTIONS: 1,
    }
    for metric in (deployment.Metric.REJECTED_MESSAGES, deployment.Metric.DEADLINE_ACTIONS):
        # any one in a period: a forged or malformed message, a step late past its deadline
        synthesized.template.has_resource_properties(
            "AWS::CloudWatch::Alarm",
            {
                "MetricName": metric.value,
                "Namespace": deployment.METRICS_NAMESPACE,
                "Dimensions": [{"Name": "service", "Value": deployment.SERVICE_NAME}],
                "Statistic": "Sum",
                "Threshold": 0,
                "ComparisonOperator": "GreaterThanThreshold",
            },
        )
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


def _dashboard_metrics(synthesized: Synthesized) -> set[tuple[str, str, frozenset[tuple[str, str]]]]:
    """(namespace, name, dimensions) of each metric the dashboard graphs: references as their template text."""
    (dashboard,) = _of_type(synthesized.resources, "AWS::CloudWatch::Dashboard").values()
    body = json.loads(_render_join(dashboard["Properties"]["DashboardBody"], _reference))
    graphed = set()
    for widget in body["widgets"]:
        for row in widget["properties"].get("metrics", []):
            fields = [f for f in row if not isinstance(f, dict)]  # [namespace, name, dimension, value, …, {options}]
            namespace, name, dimensions = fields[0], fields[1], fields[2:]
            graphed.add((namespace, name, frozenset(zip(dimensions[::2], dimensions[1::2], strict=True))))
    return graphed


def _reference(value: Any) -> str:
    """A reference inside a JSON string: ``{"Ref": "X"}`` → ``<X>``, ``{"Fn::GetAtt": ["X", "Arn"]}`` → ``<X.Arn>``."""
    return "<{}>".format(value["Ref"] if "Ref" in value else ".".join(value["Fn::GetAtt"]))


def test_dashboard_graphs_the_custom_metrics_as_the_functions_emit_them(synthesized: Synthesized) -> None:
    """Each custom metric with the namespace and the one dimension Powertools gives it in the functions
    (``tests/e2e/test_metrics.py`` holds the functions' output to ``custom_metric``, these graphs' source)."""
    custom = {m for m in _dashboard_metrics(synthesized) if m[0] == deployment.METRICS_NAMESPACE}
    service = frozenset({("service", deployment.SERVICE_NAME)})
    assert custom == {(deployment.METRICS_NAMESPACE, m.value, service) for m in deployment.Metric}
    expected = set()
    for metric, statistic in CUSTOM_STATISTICS.items():
        shown = custom_metric(metric, statistic)
        expected.add((shown.namespace, shown.metric_name, frozenset(shown.dimensions.items())))
    assert custom == expected


# what AWS emits for a resource of this stack, by namespace: the metric names and the dimension naming the resource
AWS_METRICS = {
    "AWS/Lambda": ({"Errors", "Invocations", "Duration", "Throttles"}, "FunctionName", "AWS::Lambda::Function"),
    "AWS/SQS": ({"NumberOfMessagesReceived", "ApproximateNumberOfMessagesVisible"}, "QueueName", "AWS::SQS::Queue"),
    "AWS/States": ({"ExecutionsFailed"}, "StateMachineArn", "AWS::StepFunctions::StateMachine"),
}


def test_every_alarm_watches_a_metric_that_is_emitted(synthesized: Synthesized) -> None:
    """An alarm reads either a metric AWS emits for a resource of this stack, or a custom metric the
    dashboard graphs (which tests/e2e/test_metrics.py shows the functions emit)."""
    graphed = _dashboard_metrics(synthesized)
    alarms = _of_type(synthesized.resources, "AWS::CloudWatch::Alarm").values()
    assert alarms
    for alarm in alarms:
        props = alarm["Properties"]
        namespace, name = props["Namespace"], props["MetricName"]
        if namespace == deployment.METRICS_NAMESPACE:
            dimensions = frozenset((d["Name"], d["Value"]) for d in props.get("Dimensions", []))
            assert (namespace, name, dimensions) in graphed, props
            continue
        names, dimension, resource_type = AWS_METRICS[namespace]
        assert name in names, props
        (watched,) = [d["Value"] for d in props["Dimensions"] if d["Name"] == dimension]
        reference = watched.get("Ref") or watched["Fn::GetAtt"][0]
        assert synthesized.resources[reference]["Type"] == resource_type, props


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


def _render_join(value: object, reference: Callable[[object], str] = lambda _: "REF") -> str:
    """A DefinitionString (plain or Fn::Join of literals and references) as text, references as "REF"
    (or as ``reference`` writes them)."""
    if isinstance(value, str):
        return value
    parts = value["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else reference(p) for p in parts)


def test_each_functions_log_group_is_an_output(synthesized: Synthesized) -> None:
    """The CLI reads a deployed run's usage lines from the log groups these outputs name."""
    outputs = synthesized.template.to_json()["Outputs"]
    for fn in wiring.FUNCTIONS:
        logged_to = _function(synthesized, fn.name)["LoggingConfig"]["LogGroup"]
        assert outputs[deployment.log_group_output(fn.name)]["Value"] == logged_to
        assert synthesized.resources[logged_to["Ref"]]["Type"] == "AWS::Logs::LogGroup"
