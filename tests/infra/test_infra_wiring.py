"""The deployed wiring is exactly slsml.wiring: the same spec the local runtime reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slsml import wiring

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
    dead_letter_queues = {synthesized.logical_id(queue) for queue in stack.messaging.dead_letter_queues.values()}

    deployed = set()
    for resource in synthesized.resources.values():
        if resource["Type"] == "AWS::Lambda::EventSourceMapping":
            props = resource["Properties"]
            deployed.add((queue_names[props["EventSourceArn"]["Fn::GetAtt"][0]],
                          function_names[props["FunctionName"]["Ref"]]))
    assert deployed == {(fn.queue.name, fn.name) for fn in wiring.FUNCTIONS if fn.queue is not None}

    for name, queue in stack.messaging.queues.items():
        props = synthesized.resources[synthesized.logical_id(queue)]["Properties"]
        assert props["RedrivePolicy"]["maxReceiveCount"] == 3
        assert props["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0] in dead_letter_queues
        consumer = next(fn for fn in wiring.FUNCTIONS if fn.queue is not None and fn.queue.name == name)
        assert props["VisibilityTimeout"] >= stack.settings.functions[consumer.name].timeout_s
