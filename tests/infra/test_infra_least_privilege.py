"""Every function role allows only what its step needs: its logs, reads of runs/ and datasets/,
writes under runs/ only, the run table, its own published topics and queues, the failure queue and X-Ray;
the dead-letter reader only its logs, its queues (the dead-letter queues), the run item's update, the
execution's task failure and X-Ray.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from infra.compute import TABLE_ACTIONS
from slsml.spec import deployment, keys, wiring

if TYPE_CHECKING:
    from conftest import Synthesized

POLICY_DOCUMENTS = {
    "AWS::IAM::Policy": "PolicyDocument",
    "AWS::IAM::ManagedPolicy": "PolicyDocument",
    "AWS::S3::BucketPolicy": "PolicyDocument",
    "AWS::SNS::TopicPolicy": "PolicyDocument",
    "AWS::SQS::QueuePolicy": "PolicyDocument",
}
S3_READ_ACTIONS = {"s3:GetObject", "s3:ListBucket"}
SQS_SEND_ACTIONS = {"sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"}
SQS_CONSUME_ACTIONS = {
    "sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:GetQueueAttributes",
    "sqs:GetQueueUrl",
}


def render(value: Any) -> str:
    """A resource ARN as text: ``{"Fn::GetAtt": ["Bucket", "Arn"]}`` → ``<Bucket.Arn>``."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return f"<{value['Ref']}>"
    if "Fn::GetAtt" in value:
        return "<{}.{}>".format(*value["Fn::GetAtt"])
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(render(part) for part in parts)
    if "Fn::Select" in value:  # e.g. a state machine's name, cut out of its ARN
        index, (source,) = value["Fn::Select"][0], [value["Fn::Select"][1]]
        separator, of = source["Fn::Split"]
        return f"<part {index} of {render(of)} split by {separator!r}>"
    raise AssertionError(f"unexpected intrinsic in a policy: {value}")


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def role_statements(synthesized: Synthesized, role_id: str) -> Iterator[dict[str, Any]]:
    """Statements of every policy attached to the role (inline, attached or role-default)."""
    role = synthesized.resources[role_id]["Properties"]
    assert "ManagedPolicyArns" not in role, "AWS managed policies grant more than a step needs"
    for policy in role.get("Policies", []):
        yield from policy["PolicyDocument"]["Statement"]
    for resource in synthesized.resources.values():
        attached = resource["Properties"].get("Roles", []) if resource["Type"].startswith("AWS::IAM::") else []
        if {"Ref": role_id} in attached:
            yield from resource["Properties"]["PolicyDocument"]["Statement"]


def test_no_wildcard_action_is_allowed_anywhere(synthesized: Synthesized) -> None:
    for name, resource in synthesized.resources.items():
        document = POLICY_DOCUMENTS.get(resource["Type"])
        policies = [resource["Properties"][document]] if document else []
        policies += [p["PolicyDocument"] for p in resource["Properties"].get("Policies", [])]
        for policy in policies:
            for statement in policy["Statement"]:
                if statement["Effect"] == "Allow":
                    assert not [a for a in as_list(statement["Action"]) if "*" in a], name


@pytest.mark.parametrize("fn", wiring.FUNCTIONS, ids=lambda fn: fn.name)
def test_function_role_is_least_privilege(synthesized: Synthesized, fn: wiring.Function) -> None:
    stack = synthesized.stack
    function = synthesized.resources[synthesized.logical_id(stack.compute.functions[fn.name])]["Properties"]
    bucket = f"<{synthesized.logical_id(stack.storage.bucket)}.Arn>"
    readable = {f"{bucket}/{prefix}*" for prefix in (*deployment.READABLE_PREFIXES, *wiring.notified_prefixes(fn))}
    writable = {f"{bucket}/{prefix}*" for prefix in deployment.WRITABLE_PREFIXES}
    own_topics = {f"<{synthesized.logical_id(stack.messaging.topics[t.name])}>" for t in fn.publishes}
    table = f"<{synthesized.logical_id(stack.storage.table)}.Arn>"
    failures = f"<{synthesized.logical_id(stack.messaging.function_failures)}.Arn>"
    log_group = f"<{function['LoggingConfig']['LogGroup']['Ref']}.Arn>"
    state_machine = f"<{synthesized.logical_id(stack.orchestration.state_machine)}>"
    state_machine_name = synthesized.logical_id(stack.orchestration.state_machine)
    sent_to = {f"<{synthesized.logical_id(stack.messaging.queues[q.name])}.Arn>" for q in fn.sends}
    trigger_queue = {f"<{synthesized.logical_id(stack.messaging.queues[fn.queue.name])}.Arn>"} if fn.queue else set()
    if fn.reads_dead_letters:
        trigger_queue = {f"<{synthesized.logical_id(q)}.Arn>" for q in stack.messaging.dead_letter_queues.values()}

    published: set[str] = set()
    for statement in role_statements(synthesized, function["Role"]["Fn::GetAtt"][0]):
        assert statement["Effect"] == "Allow"
        resources = {render(r) for r in as_list(statement["Resource"])}
        for action in as_list(statement["Action"]):
            assert "*" not in action
            service = action.split(":")[0]
            if action == "s3:ListBucket":
                assert resources == {bucket}
            elif action == "s3:GetObject":
                assert resources <= readable
            elif action == "s3:DeleteObject":  # under an iteration only: models and final models stay create-only
                assert resources == {f"{bucket}/{deployment.DELETABLE_OBJECTS}"}
            elif service == "s3":
                assert action not in S3_READ_ACTIONS
                assert resources <= writable, f"{fn.name} may write outside {deployment.WRITABLE_PREFIXES}"
            elif service == "sns":
                assert action == "sns:Publish"
                published |= resources
            elif service == "dynamodb":
                assert action in TABLE_ACTIONS
                assert resources == {table}
            elif service == "logs":
                assert resources == {log_group}
            elif service == "sqs":
                if resources == {failures} and not fn.reads_dead_letters:
                    assert action == "sqs:SendMessage"
                else:  # a queue it sends to, or the one that triggers it
                    assert resources <= sent_to | trigger_queue, (action, resources)
                    allowed = (SQS_SEND_ACTIONS if resources <= sent_to else set()) | (
                        SQS_CONSUME_ACTIONS if resources <= trigger_queue else set())
                    assert action in allowed, (action, resources)
            elif service == "states":  # answering the run execution's task token; starting runs if allowed
                if action in {"states:StartExecution", "states:DescribeExecution"}:
                    assert fn.starts_runs, f"{fn.name} may not start runs"
                    assert len(resources) == 1 and state_machine_name in next(iter(resources))
                else:
                    assert action in {"states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat"}
                    assert resources == {state_machine}
            else:
                assert service == "xray", f"{fn.name} has an unexpected action {action}"
                assert action in {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
    assert published == own_topics


def test_the_dead_letter_reader_may_fail_runs_and_do_nothing_else(synthesized: Synthesized) -> None:
    stack = synthesized.stack
    reader = wiring.dead_letter_reader()
    function = synthesized.resources[synthesized.logical_id(stack.compute.functions[reader.name])]["Properties"]
    table = f"<{synthesized.logical_id(stack.storage.table)}.Arn>"
    state_machine = f"<{synthesized.logical_id(stack.orchestration.state_machine)}>"
    queues = {f"<{synthesized.logical_id(q)}.Arn>" for q in stack.messaging.dead_letter_queues.values()}
    granted: dict[str, set[str]] = {}
    for statement in role_statements(synthesized, function["Role"]["Fn::GetAtt"][0]):
        for action in as_list(statement["Action"]):
            granted.setdefault(action, set()).update(render(r) for r in as_list(statement["Resource"]))
    assert granted.pop("dynamodb:UpdateItem") == {table}  # the run item, FAILED with the reason
    assert granted.pop("states:SendTaskFailure") == {state_machine}  # the run's execution, failed
    for action in SQS_CONSUME_ACTIONS - {"sqs:GetQueueUrl"}:  # every dead-letter queue, and only those
        assert granted.pop(action) == queues, action
    granted.pop("sqs:GetQueueUrl", None)
    assert {action.split(":")[0] for action in granted} <= {"logs", "xray"}, granted


def test_the_key_layout_stays_inside_the_granted_prefixes() -> None:
    written = [
        keys.run_config("r"),
        keys.model("r", 1),
        keys.final_model("r"),
        keys.weights("r", 1),
        keys.shard("r", 1, 0),
        keys.update("r", 1, 0, attempt=1),
        keys.residual("r", 1, 0),
    ]
    read = [*written, keys.dataset_manifest("d"), keys.dataset_shard("d", "train", 0)]
    assert all(key.startswith(deployment.WRITABLE_PREFIXES) for key in written)
    assert all(key.startswith(deployment.READABLE_PREFIXES) for key in read)
    # what the pipeline deletes (superseded carried state) is deletable, and no model, config or final model is
    carried = keys.carried("r", 2, reducers=2, slots=2, slot_state=True, residuals=True)
    assert all(fnmatch.fnmatchcase(key, deployment.DELETABLE_OBJECTS) for key in carried)
    kept = [keys.run_config("r"), keys.model("r", 1), keys.final_model("r"), keys.source_model("r")]
    assert not any(fnmatch.fnmatchcase(key, deployment.DELETABLE_OBJECTS) for key in kept)
