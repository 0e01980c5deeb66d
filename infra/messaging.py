"""Messaging: the pipeline's SNS topics and queues (from slsml.spec.wiring), the bucket notifications that
feed the topics, the function subscriptions and the dead-letter queues that catch what could not be
delivered, which all feed the dead-letter reader (it fails the runs their messages name).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from cdk_nag import NagPackSuppression, NagSuppressions
from constructs import Construct

from infra.naming import pascal
from infra.settings import Settings
from slsml.spec import wiring

DLQ_RETENTION = Duration.days(14)

_SUBSCRIPTION_DLQ_SUPPRESSIONS = [
    NagPackSuppression(
        id="AwsSolutions-SQS3",
        reason="This queue is the dead-letter queue of an SNS subscription (cdk-nag recognizes only SQS redrive).",
    )
]
_BASIC_EXECUTION_ROLE = "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"


class Messaging(Construct):
    """Topics, bucket notifications, subscriptions and dead-letter queues."""

    def __init__(self, scope: Construct, construct_id: str, *, bucket: s3.IBucket, settings: Settings) -> None:
        super().__init__(scope, construct_id)
        # the dead-letter reader is fed by every DLQ: AWS's advice for a Lambda event source, six times its timeout
        self._dead_letter_visibility = Duration.seconds(
            6 * settings.functions[wiring.dead_letter_reader().name].timeout_s
        )
        self.topics: dict[str, sns.Topic] = {topic.name: self._topic(topic.name) for topic in wiring.TOPICS}
        self.dead_letter_queues: dict[str, sqs.Queue] = {}
        self.queues: dict[str, sqs.Queue] = {
            fn.queue.name: self._trigger_queue(fn.queue.name, settings.functions[fn.name].timeout_s)
            for fn in wiring.FUNCTIONS
            if fn.queue is not None
        }
        # What Lambda could not process after its own retries of an asynchronous (SNS) invocation.
        self.function_failures = self._dead_letter_queue("FunctionFailures")

        for notification in wiring.BUCKET_NOTIFICATIONS:
            bucket.add_event_notification(
                s3.EventType.OBJECT_CREATED,
                s3n.SnsDestination(self.topics[notification.topic.name]),
                s3.NotificationKeyFilter(prefix=notification.prefix, suffix=notification.suffix),
            )
        self._suppress_notifications_handler()

    def subscribe(self, functions: Mapping[str, lambda_.Function]) -> None:
        """Each function to its trigger topics, with a dead-letter queue for undeliverable messages, or
        to its trigger queue; then the dead-letter reader to every dead-letter queue."""
        holds: list[tuple[str, str]] = []  # (dead-letter queue ARN, the one function whose messages it holds)
        for fn in wiring.FUNCTIONS:
            if fn.queue is not None:
                # one message per invocation, as the local host delivers them: a message that fails fails
                # alone, and only it is dead-lettered (and fails its run), not the others of its batch
                functions[fn.name].add_event_source(
                    event_sources.SqsEventSource(self.queues[fn.queue.name], batch_size=1)
                )
                holds.append((self.dead_letter_queues[fn.queue.name].queue_arn, fn.name))
            if not fn.triggers:
                continue
            dlq = self._dead_letter_queue(f"{pascal(fn.name)}Subscription")
            NagSuppressions.add_resource_suppressions(dlq, _SUBSCRIPTION_DLQ_SUPPRESSIONS)
            holds.append((dlq.queue_arn, fn.name))
            for topic in fn.triggers:
                self.topics[topic.name].add_subscription(
                    subscriptions.LambdaSubscription(functions[fn.name], dead_letter_queue=dlq)
                )
        # Lambda's asynchronous-invocation DLQ (function_failures) holds every SNS-triggered function's
        # events: they name their topic, which says whose they were.
        reader = functions[wiring.dead_letter_reader().name]
        topic_arns = {name: topic.topic_arn for name, topic in self.topics.items()}
        reader.add_environment(
            wiring.DEAD_LETTER_SOURCES_ENV, Stack.of(self).to_json_string(wiring.dead_letter_sources(holds, topic_arns))
        )
        for queue in self.dead_letter_queues.values():
            # a letter the reader fails on is retried alone: its batch-mates are not held back with it
            reader.add_event_source(event_sources.SqsEventSource(queue, batch_size=10, report_batch_item_failures=True))

    def _suppress_notifications_handler(self) -> None:
        """The custom resource writing the bucket's notification configuration is a CDK singleton."""
        stack = Stack.of(self)
        for handler in stack.node.children:
            if handler.node.id.startswith("BucketNotificationsHandler"):
                NagSuppressions.add_resource_suppressions(
                    handler,
                    [
                        NagPackSuppression(
                            id="AwsSolutions-IAM4",
                            reason="CDK's own bucket-notification handler, which only writes the log"
                            " streams of its one configuration call.",
                            applies_to=[_BASIC_EXECUTION_ROLE],
                        )
                    ],
                    apply_to_children=True,
                )

    def _topic(self, name: str) -> sns.Topic:
        # TLS enforced, no KMS: messages carry run ids, S3 keys and counters, never data, and S3 can
        # publish to an encrypted topic only with a customer-managed key (a key and KMS calls per message).
        return sns.Topic(self, name, display_name=f"slsml {name}", enforce_ssl=True)

    def _trigger_queue(self, name: str, consumer_timeout_s: int) -> sqs.Queue:
        """A queue that triggers a function; what fails three times moves to its dead-letter queue."""
        return sqs.Queue(
            self,
            f"{name}Queue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            # AWS's advice for a Lambda event source: six times the function's timeout
            visibility_timeout=Duration.seconds(6 * consumer_timeout_s),
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=3, queue=self._dead_letter_queue(name)),
        )

    def _dead_letter_queue(self, name: str) -> sqs.Queue:
        queue = sqs.Queue(
            self,
            f"{name}Dlq",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=DLQ_RETENTION,
            visibility_timeout=self._dead_letter_visibility,
        )
        self.dead_letter_queues[name] = queue
        return queue
