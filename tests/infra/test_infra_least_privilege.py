"""Every function role allows only what its step needs: its logs, reads of runs/ and datasets/, writes
of the kinds of object its step creates (and deletes of those it deletes), the run table, its own
published topics and queues, the failure queue, the answers to a run's execution its step gives, its own kind's
signing keys (test_infra_signing.py), and X-Ray;
the dead-letter reader only its logs, its queues (the dead-letter queues), the run item's update, the run's public
keys and run.json (a moved deadline is re-checked as the watchdog would), the execution's task failure and X-Ray.
Only a step that handles messages once deletes items: its own message records.
The bucket's policy refuses overwrites of run objects, whoever writes, and deletes of run objects by any principal but
the roles of the steps that delete them.
"""

from __future__ import annotations

import ast
import fnmatch
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from infra.compute import IDEMPOTENCY_PARTITION_PREFIX, TABLE_ACTIONS
from infra.layers import ROOT
from infra.messaging import PUBLISH_KEY_ACTIONS
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
    "sqs:ReceiveMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
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
    written = {f"{bucket}/{kind}" for kind in fn.writes}
    deleted = {f"{bucket}/{kind}" for kind in fn.deletes}
    own_topics = {f"<{synthesized.logical_id(stack.messaging.topics[t.name])}>" for t in fn.publishes}
    table = f"<{synthesized.logical_id(stack.storage.table)}.Arn>"
    failures = f"<{synthesized.logical_id(stack.messaging.function_failures)}.Arn>"
    log_group = f"<{function['LoggingConfig']['LogGroup']['Ref']}.Arn>"
    state_machine = f"<{synthesized.logical_id(stack.orchestration.state_machine)}>"
    state_machine_name = synthesized.logical_id(stack.orchestration.state_machine)
    topic_key = f"<{synthesized.logical_id(stack.messaging.topic_key)}.Arn>"
    signing_key = f"<{synthesized.logical_id(stack.signing.key)}.Arn>"
    own_records = {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [_records_of(synthesized, fn.name)]}}
    sent_to = {f"<{synthesized.logical_id(stack.messaging.queues[q.name])}.Arn>" for q in fn.sends}
    trigger_queue = {f"<{synthesized.logical_id(stack.messaging.queues[fn.queue.name])}.Arn>"} if fn.queue else set()
    if fn.reads_dead_letters:
        trigger_queue = {f"<{synthesized.logical_id(q)}.Arn>" for q in stack.messaging.dead_letter_queues.values()}
        readable = {f"{bucket}/{keys.RUN_CONFIG_OBJECTS}"}  # a moved deadline's run, to re-check it

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
            elif action == "s3:PutObject":
                assert resources <= written, f"{fn.name} may write other objects than {fn.writes}"
            elif action in {"s3:PutObjectTagging", "s3:AbortMultipartUpload"}:  # scratch's expiry tag and parts
                assert resources <= written & {f"{bucket}/{keys.SCRATCH_OBJECTS}"}
            elif action == "s3:DeleteObject":
                assert resources <= deleted, f"{fn.name} may delete other objects than {fn.deletes}"
            elif service == "s3":
                raise AssertionError(f"{fn.name} has an unexpected action {action}")
            elif service == "sns":
                assert action == "sns:Publish"
                published |= resources
            elif action == "dynamodb:DeleteItem":  # its own message records alone
                assert fn.once_per_message, f"{fn.name} deletes no items"
                assert statement["Condition"] == own_records and resources == {table}, statement
            elif service == "dynamodb":
                assert action in TABLE_ACTIONS
                assert resources == {table}
            elif service == "kms" and resources == {signing_key}:  # its own kind's keys (test_infra_signing.py)
                assert {**statement, "Resource": signing_key} in deployment.signing_grants(fn, signing_key), statement
            elif service == "kms":  # what SNS asks of the topics' key for a publisher
                assert fn.publishes and action in PUBLISH_KEY_ACTIONS and resources == {topic_key}, (action, resources)
            elif service == "logs":
                assert resources == {log_group}
            elif service == "sqs":
                if resources == {failures} and not fn.reads_dead_letters:
                    assert action == "sqs:SendMessage"
                else:  # a queue it sends to, or the one that triggers it
                    assert resources <= sent_to | trigger_queue, (action, resources)
                    allowed = (SQS_SEND_ACTIONS if resources <= sent_to else set()) | (
                        SQS_CONSUME_ACTIONS if resources <= trigger_queue else set()
                    )
                    assert action in allowed, (action, resources)
            elif service == "states":  # answering the run execution's task token; starting runs if allowed
                if action in {"states:StartExecution", "states:DescribeExecution"}:
                    assert fn.starts_runs, f"{fn.name} may not start runs"
                    assert len(resources) == 1 and state_machine_name in next(iter(resources))
                else:
                    assert action in {f"states:{answer}" for answer in fn.answers}, (fn.name, action)
                    assert resources == {state_machine}
            else:
                assert service == "xray", f"{fn.name} has an unexpected action {action}"
                assert action in {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
    assert published == own_topics


def _records_of(synthesized: Synthesized, function: str) -> Any:
    """The partition key of the function's message records, as the template writes it."""
    name = {"Ref": synthesized.logical_id(synthesized.stack.compute.functions[function])}
    return {"Fn::Join": ["", [IDEMPOTENCY_PARTITION_PREFIX, name]]}


def _granted(synthesized: Synthesized, function: str) -> dict[str, set[str]]:
    """Action → the resources (rendered) that the function's role allows it on."""
    props = synthesized.resources[synthesized.logical_id(synthesized.stack.compute.functions[function])]["Properties"]
    granted: dict[str, set[str]] = defaultdict(set)
    for statement in role_statements(synthesized, props["Role"]["Fn::GetAtt"][0]):
        for action in as_list(statement["Action"]):
            granted[action] |= {render(r) for r in as_list(statement["Resource"])}
    return granted


# What each step writes in the bucket and tells a run's execution, by hand: a declaration that grants more fails
WRITES = {
    "work_launcher": {"runs/*/final.keras"},  # a run's final model, when the budget is spent and evaluated
    "worker": {"runs/*/iters/*"},  # its updates, residuals, slot and evaluation states: scratch alone
    "reduce_launcher": set(),  # counts reports in the table and fires the reducers: nothing in the bucket
    "reducer": {"runs/*/iters/*"},  # shards and means
    "merger": {"runs/*/iters/*", "runs/*/models/*"},  # the flat weights and the next model
    "watchdog": {"runs/*/iters/*", "runs/*/final.keras"},  # a shard that keeps its weights; a late completion
    "run_starter": {"runs/*/run.json", "runs/*/source.keras", "runs/*/iters/*"},  # a dropped model's run
    "dead_letters": set(),
}
ANSWERS = {
    "work_launcher": {"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"},
    "worker": set(),  # runs the user's model: it can neither complete nor fail an execution (the watchdog does)
    "reduce_launcher": {"SendTaskFailure"},
    "reducer": {"SendTaskFailure"},
    "merger": {"SendTaskFailure", "SendTaskHeartbeat"},
    "watchdog": {"SendTaskSuccess", "SendTaskFailure"},
    "run_starter": set(),  # starts executions, and answers none
    "dead_letters": {"SendTaskFailure"},
}


@pytest.mark.parametrize("fn", wiring.FUNCTIONS, ids=lambda fn: fn.name)
def test_each_step_writes_only_its_objects_and_answers_executions_only_as_its_step_must(
    synthesized: Synthesized, fn: wiring.Function
) -> None:
    granted = _granted(synthesized, fn.name)
    bucket = f"<{synthesized.logical_id(synthesized.stack.storage.bucket)}.Arn>"
    assert granted.get("s3:PutObject", set()) == {f"{bucket}/{kind}" for kind in WRITES[fn.name]}
    assert {a.removeprefix("states:") for a in granted if a.startswith("states:SendTask")} == ANSWERS[fn.name]
    written = {a for a in granted if a.startswith("s3:") and a not in S3_READ_ACTIONS}
    assert written <= {"s3:PutObject", "s3:PutObjectTagging", "s3:AbortMultipartUpload", "s3:DeleteObject"}
    assert bool(written) == bool(WRITES[fn.name])  # a ReduceLauncher cannot write S3 at all


def test_the_bucket_refuses_overwrites_of_run_objects_whoever_writes(synthesized: Synthesized) -> None:
    bucket = synthesized.logical_id(synthesized.stack.storage.bucket)
    (policy,) = [
        r["Properties"]["PolicyDocument"]
        for r in synthesized.resources.values()
        if r["Type"] == "AWS::S3::BucketPolicy" and r["Properties"]["Bucket"] == {"Ref": bucket}
    ]
    (create_only,) = [s for s in policy["Statement"] if s.get("Sid") == "CreateOnlyRunObjects"]
    assert (create_only["Effect"], create_only["Principal"], create_only["Action"]) == (
        "Deny",
        {"AWS": "*"},
        "s3:PutObject",
    )
    # a request that creates an object without If-None-Match (a multipart upload's start and parts create none)
    assert create_only["Condition"] == {
        "Null": {"s3:if-none-match": "true"},
        "Bool": {"s3:ObjectCreationOperation": "true"},
    }
    covered = {render(r) for r in as_list(create_only["Resource"])}
    assert covered == {
        f"<{bucket}.Arn>/{kind}" for kind in ("runs/*/iters/*", "runs/*/run.json", "runs/*/source.keras")
    }
    # models and final models are server-side copies, which S3 refuses under such a policy: left out, by name
    assert not covered & {f"<{bucket}.Arn>/runs/*/models/*", f"<{bucket}.Arn>/runs/*/final.keras"}


def test_the_run_state_machine_reads_source_models_and_writes_models_alone(synthesized: Synthesized) -> None:
    role = synthesized.stack.orchestration.state_machine.role
    bucket = f"<{synthesized.logical_id(synthesized.stack.storage.bucket)}.Arn>"
    granted: dict[str, set[str]] = defaultdict(set)
    for statement in role_statements(synthesized, synthesized.stack.get_logical_id(role.node.default_child)):
        for action in as_list(statement["Action"]):
            granted[action] |= {render(r) for r in as_list(statement["Resource"])}
    s3 = {action: resources for action, resources in granted.items() if action.startswith("s3:")}
    assert s3 == {"s3:GetObject": {f"{bucket}/runs/*/source.keras"}, "s3:PutObject": {f"{bucket}/runs/*/models/*"}}


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
    # a deadline SQS moved, re-checked as the watchdog would: the run's public keys and its run.json
    assert granted.pop("dynamodb:GetItem") == {table}
    bucket = f"<{synthesized.logical_id(stack.storage.bucket)}.Arn>"
    assert granted.pop("s3:GetObject") == {f"{bucket}/{keys.RUN_CONFIG_OBJECTS}"}
    # and the launch's vouch for the public keys, unsealed (its kind of the signing key alone: test_infra_signing.py)
    assert granted.pop("kms:Decrypt") == {f"<{synthesized.logical_id(stack.signing.key)}.Arn>"}
    assert granted.pop("states:SendTaskFailure") == {state_machine}  # the run's execution, failed
    for action in SQS_CONSUME_ACTIONS - {"sqs:GetQueueUrl"}:  # every dead-letter queue, and only those
        assert granted.pop(action) == queues, action
    granted.pop("sqs:GetQueueUrl", None)
    assert {action.split(":")[0] for action in granted} <= {"logs", "xray"}, granted


def test_the_key_layout_stays_inside_the_granted_kinds_of_object() -> None:
    """Each key a step writes is of a kind some step may write; what the lifecycle expires is scratch."""
    kinds = {kind for fn in wiring.FUNCTIONS for kind in fn.writes}
    written = {
        keys.run_config("r"): keys.RUN_CONFIG_OBJECTS,
        keys.source_model("r"): keys.SOURCE_MODEL_OBJECTS,
        keys.model("r", 1): keys.MODEL_OBJECTS,
        keys.final_model("r"): keys.FINAL_MODEL_OBJECTS,
        keys.manifest("r", 1): keys.MODEL_OBJECTS,
        keys.shard("r", 1, 0): keys.SCRATCH_OBJECTS,
        keys.mean("r", 1, 0): keys.SCRATCH_OBJECTS,
        keys.update("r", 1, 0, attempt=1): keys.SCRATCH_OBJECTS,
        keys.residual("r", 1, 0): keys.SCRATCH_OBJECTS,
        keys.local_state("r", 1, 0): keys.SCRATCH_OBJECTS,
        keys.evaluation("r", 1, 0, "test"): keys.SCRATCH_OBJECTS,
        keys.handed("r", 1, 0, 0, 1, 0, back=True): keys.SCRATCH_OBJECTS,
        keys.stage_progress("r", 1, 0, 0, 1, 3): keys.SCRATCH_OBJECTS,
    }
    for key, kind in written.items():
        assert fnmatch.fnmatchcase(key, kind) and kind in kinds, key
        assert not keys.is_transient(key) or kind == keys.SCRATCH_OBJECTS, key  # the tag expires scratch alone
    read = [*written, keys.dataset_manifest("d"), keys.dataset_shard("d", "train", 0)]
    assert all(key.startswith(deployment.READABLE_PREFIXES) for key in read)
    # what the Merger deletes (superseded carried state) is of a kind it may delete, and no run config or source is
    carried = keys.carried("r", 2, reducers=2, slots=2, slot_state=True, residuals=True)
    merger = wiring.function("merger").deletes
    assert all(any(fnmatch.fnmatchcase(key, kind) for kind in merger) for key in carried)
    kept = [keys.run_config("r"), keys.source_model("r")]
    deletable = {kind for fn in wiring.FUNCTIONS for kind in fn.deletes}
    assert not any(fnmatch.fnmatchcase(key, kind) for key in kept for kind in deletable)


# The steps that handle (some of) their messages once, by hand: Powertools Idempotency deletes a message's record when
# the step fails on it. No other step deletes an item of the table.
DELETES_ITEMS = {"worker", "watchdog", "run_starter"}


@pytest.mark.parametrize("fn", wiring.FUNCTIONS, ids=lambda fn: fn.name)
def test_only_the_steps_that_handle_messages_once_delete_items_and_only_their_own_records(
    synthesized: Synthesized, fn: wiring.Function
) -> None:
    props = synthesized.resources[synthesized.logical_id(synthesized.stack.compute.functions[fn.name])]["Properties"]
    deleting = [
        statement
        for statement in role_statements(synthesized, props["Role"]["Fn::GetAtt"][0])
        if "dynamodb:DeleteItem" in as_list(statement["Action"])
    ]
    if fn.name not in DELETES_ITEMS:
        assert deleting == [], f"{fn.name} may delete items"
        return
    (statement,) = deleting
    assert as_list(statement["Action"]) == ["dynamodb:DeleteItem"]
    assert statement["Condition"] == {
        "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [_records_of(synthesized, fn.name)]}
    }


def _handles_messages_once(function: str) -> bool:
    """Whether ``functions/<function>/handler.py`` runs some of its messages under Powertools Idempotency: its
    ``pipeline_handler`` call's ``idempotent`` is left True, or is a choice of messages (anything but False)."""
    tree = ast.parse((ROOT / "functions" / function / "handler.py").read_text())
    (call,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "pipeline_handler"
    ]
    idempotent = {keyword.arg: keyword.value for keyword in call.keywords}.get("idempotent")
    return not (isinstance(idempotent, ast.Constant) and idempotent.value is False)


@pytest.mark.parametrize("fn", wiring.FUNCTIONS, ids=lambda fn: fn.name)
def test_a_step_declared_to_handle_messages_once_is_one_whose_handler_does(fn: wiring.Function) -> None:
    assert fn.once_per_message == _handles_messages_once(fn.name)


def test_the_records_a_step_may_delete_are_in_the_partition_powertools_keeps_them_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slsml.state import idempotency

    monkeypatch.setenv(wiring.TABLE_ENV, "table")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = "Slsml-ComputeWorker-x1"
    assert idempotency._persistence(name).static_pk_value == f"{IDEMPOTENCY_PARTITION_PREFIX}{name}"


# Who may delete each kind of object under runs/, by hand (S3's lifecycle expirations aside, which are no request)
DELETERS = {
    # scratch, once superseded; a foreign object where a step stores its own (the Reducer: a shard's average)
    keys.shard("r", 1, 0): {"work_launcher", "worker", "reducer", "merger", "watchdog"},
    keys.model("r", 1): {"merger"},  # a foreign object at a model's key, replaced
    keys.manifest("r", 1): {"merger"},
    keys.final_model("r"): {"work_launcher", "watchdog"},  # a final model not a copy of the run's last, replaced
    keys.run_config("r"): set(),
    keys.source_model("r"): set(),
}
SOMEONE = "arn:aws:iam::123456789012:role/someone"  # any other principal of the account, or of another


def _deletes_denied(statements: list[dict[str, Any]], principal: str, resource: str) -> bool:
    """Whether a Deny statement of a bucket policy refuses ``principal`` a DeleteObject of ``resource``."""
    for statement in statements:
        actions = as_list(statement["Action"])
        if statement["Effect"] != "Deny" or not {"s3:DeleteObject", "s3:DeleteObject*", "s3:*"} & set(actions):
            continue
        if not any(fnmatch.fnmatchcase(resource, render(r)) for r in as_list(statement["Resource"])):
            continue
        condition = statement.get("Condition", {})
        if set(condition) - {"ArnNotEquals", "Bool"}:
            raise AssertionError(f"a condition this test does not evaluate: {condition}")
        if "Bool" in condition:  # the TLS statement: not for a request over TLS
            continue
        allowed = {render(arn) for arn in as_list(condition.get("ArnNotEquals", {}).get("aws:PrincipalArn", []))}
        if principal not in allowed:
            return True
    return False


def test_the_bucket_refuses_deletes_of_run_objects_to_all_but_the_steps_that_delete_them(
    synthesized: Synthesized,
) -> None:
    stack = synthesized.stack
    bucket = synthesized.logical_id(stack.storage.bucket)
    (policy,) = [
        r["Properties"]["PolicyDocument"]
        for r in synthesized.resources.values()
        if r["Type"] == "AWS::S3::BucketPolicy" and r["Properties"]["Bucket"] == {"Ref": bucket}
    ]
    statements = policy["Statement"]
    roles = {
        fn.name: "<{}.Arn>".format(
            synthesized.resources[synthesized.logical_id(stack.compute.functions[fn.name])]["Properties"]["Role"][
                "Fn::GetAtt"
            ][0]
        )
        for fn in wiring.FUNCTIONS
    }
    for key, deleters in DELETERS.items():
        resource = f"<{bucket}.Arn>/{key}"
        may = {name for name, role in roles.items() if not _deletes_denied(statements, role, resource)}
        assert may == deleters, key
        assert _deletes_denied(statements, SOMEONE, resource), key
    # a version, deleted for good where the bucket keeps versions: refused to the same principals
    for statement in statements:
        if "s3:DeleteObject" in as_list(statement["Action"]):
            assert "s3:DeleteObjectVersion" in as_list(statement["Action"]), statement
    # datasets are not a run's: a user removes them (`slsml data rm`)
    assert not _deletes_denied(statements, SOMEONE, f"<{bucket}.Arn>/{keys.dataset_manifest('d')}")
