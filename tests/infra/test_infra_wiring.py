"""The deployed wiring is exactly slsml.spec.wiring: the same spec the local runtime reads."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from infra.naming import pascal
from slsml.spec import wiring

if TYPE_CHECKING:
    from conftest import Synthesized


def test_each_function_is_subscribed_to_its_trigger_topic_and_nothing_else(synthesized: Synthesized) -> None:
    stack = synthesized.stack
    topic_names = {synthesized.logical_id(topic): name for name, topic in stack.messaging.topics.items()}
    function_names = {synthesized.logical_id(fn): name for name, fn in stack.compute.functions.items()}
    queues = {synthesized.logical_id(queue) for queue in stack.messaging.dead_letter_queues.values()}

    deployed = set()
    for resource in synthesized.resources.values():
        if resource["Type"] == "AWS::SNS::Subscription":
            props = resource["Properties"]
            assert props["Protocol"] == "lambda"
            assert props["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0] in queues
            deployed.add((topic_names[props["TopicArn"]["Ref"]], function_names[props["Endpoint"]["Fn::GetAtt"][0]]))

    assert deployed == {(topic.name, fn.name) for fn in wiring.FUNCTIONS for topic in fn.triggers}


def test_bucket_notifications_are_the_declared_ones(synthesized: Synthesized) -> None:
    stack = synthesized.stack
    topic_names = {synthesized.logical_id(topic): name for name, topic in stack.messaging.topics.items()}
    notifications = [r for r in synthesized.resources.values() if r["Type"] == "Custom::S3BucketNotifications"]
    assert len(notifications) == 1
    props = notifications[0]["Properties"]
    assert props["BucketName"] == {"Ref": synthesized.logical_id(stack.storage.bucket)}

    assert set(props["NotificationConfiguration"]) == {"TopicConfigurations"}  # S3 notifies topics only
    deployed = set()
    for config in props["NotificationConfiguration"]["TopicConfigurations"]:
        assert config["Events"] == ["s3:ObjectCreated:*"]
        rules = {rule["Name"]: rule["Value"] for rule in config["Filter"]["Key"]["FilterRules"]}
        deployed.add((rules.get("prefix", ""), rules.get("suffix", ""), topic_names[config["TopicArn"]["Ref"]]))

    assert deployed == {(n.prefix, n.suffix, n.topic.name) for n in wiring.BUCKET_NOTIFICATIONS}


def test_each_queue_triggers_its_function_and_fails_over_to_a_dead_letter_queue(synthesized: Synthesized) -> None:
    stack = synthesized.stack
    queue_names = {synthesized.logical_id(queue): name for name, queue in stack.messaging.queues.items()}
    function_names = {synthesized.logical_id(fn): name for name, fn in stack.compute.functions.items()}
    dead_letter_names = {synthesized.logical_id(q): name for name, q in stack.messaging.dead_letter_queues.items()}
    dead_letter_queues = set(dead_letter_names)

    deployed = set()
    for resource in synthesized.resources.values():
        if resource["Type"] == "AWS::Lambda::EventSourceMapping":
            props = resource["Properties"]
            source = props["EventSourceArn"]["Fn::GetAtt"][0]
            deployed.add(
                (queue_names.get(source) or dead_letter_names[source], function_names[props["FunctionName"]["Ref"]])
            )
    reader = wiring.dead_letter_reader().name
    assert deployed == {(fn.queue.name, fn.name) for fn in wiring.FUNCTIONS if fn.queue is not None} | {
        (name, reader)
        for name in stack.messaging.dead_letter_queues  # every dead-letter queue feeds the reader
    }

    for name, queue in stack.messaging.queues.items():
        props = synthesized.resources[synthesized.logical_id(queue)]["Properties"]
        assert props["RedrivePolicy"]["maxReceiveCount"] == 3
        assert props["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0] in dead_letter_queues
        consumer = next(fn for fn in wiring.FUNCTIONS if fn.queue is not None and fn.queue.name == name)
        assert props["VisibilityTimeout"] >= stack.settings.functions[consumer.name].timeout_s


def test_the_dead_letter_reader_knows_whose_each_dead_letter_is(synthesized: Synthesized) -> None:
    """Its sources: each topic with the function it triggers, and each dead-letter queue that holds one
    function's messages with that function (Lambda's asynchronous-invocation DLQ holds several: its
    messages are SNS events, which name their topic)."""
    stack = synthesized.stack
    reader = synthesized.resources[synthesized.logical_id(stack.compute.functions[wiring.dead_letter_reader().name])]
    sources = reader["Properties"]["Environment"]["Variables"][wiring.DEAD_LETTER_SOURCES_ENV]
    text = "".join(
        p if isinstance(p, str) else "<{}>".format(p.get("Ref") or ".".join(p["Fn::GetAtt"]))
        for p in sources["Fn::Join"][1]
    )
    parsed = json.loads(text)
    topics = {f"<{synthesized.logical_id(topic)}>": name for name, topic in stack.messaging.topics.items()}
    assert {(topics[arn], fn) for arn, fn in parsed["topics"]} == {
        (topic.name, fn.name) for fn in wiring.FUNCTIONS for topic in fn.triggers
    }
    queues = {f"<{synthesized.logical_id(q)}.Arn>": name for name, q in stack.messaging.dead_letter_queues.items()}
    held = {(queues[arn], fn) for arn, fn in parsed["queues"]}
    assert held == {(f"{pascal(fn.name)}Subscription", fn.name) for fn in wiring.FUNCTIONS if fn.triggers} | {
        (fn.queue.name, fn.name) for fn in wiring.FUNCTIONS if fn.queue is not None
    }
    assert "FunctionFailures" in stack.messaging.dead_letter_queues  # read by the topics its events name


def test_a_trigger_queue_hands_its_function_one_message_at_a_time(synthesized: Synthesized) -> None:
    """A failing message is retried and dead-lettered alone (its batch-mates' runs are not failed with it)."""
    queues = {synthesized.logical_id(queue) for queue in synthesized.stack.messaging.queues.values()}
    mappings = [
        r["Properties"]
        for r in synthesized.resources.values()
        if r["Type"] == "AWS::Lambda::EventSourceMapping"
        and r["Properties"]["EventSourceArn"]["Fn::GetAtt"][0] in queues
    ]
    assert mappings and all(m["BatchSize"] == 1 for m in mappings)


def test_the_dead_letter_reader_reports_the_letters_it_failed_on_alone(synthesized: Synthesized) -> None:
    """Its batches of 10 answer with the letters that failed (partial batch response), so one poison letter
    does not hold back the nine beside it."""
    reader = synthesized.logical_id(synthesized.stack.compute.functions[wiring.dead_letter_reader().name])
    mappings = [
        resource["Properties"]
        for resource in synthesized.resources.values()
        if resource["Type"] == "AWS::Lambda::EventSourceMapping"
        and resource["Properties"]["FunctionName"] == {"Ref": reader}
    ]
    assert mappings and all(m["FunctionResponseTypes"] == ["ReportBatchItemFailures"] for m in mappings)
