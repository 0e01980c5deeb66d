"""Messaging: the pipeline's SNS topics and queues (from slsml.spec.wiring), encrypted with the stack's topic key, the
bucket notifications that feed the topics, the function subscriptions and the dead-letter queues that catch what could
not be delivered, which all feed the dead-letter reader (it fails the runs their messages name).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import CfnResource, Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_logs as logs
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
# what SNS asks of KMS for a publisher of an encrypted topic: a data key to encrypt the message with, and its decryption
PUBLISH_KEY_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")


def grant_publish(topic: sns.ITopic, grantee: iam.IGrantable) -> None:
    """Publishing to ``topic`` and the use of its key a publish takes, no more (``Topic.grant_publish`` would grant
    ``kms:GenerateDataKey*``, every kind of data key)."""
    iam.Grant.add_to_principal(grantee=grantee, actions=["sns:Publish"], resource_arns=[topic.topic_arn])
    if topic.master_key is not None:
        iam.Grant.add_to_principal(
            grantee=grantee, actions=list(PUBLISH_KEY_ACTIONS), resource_arns=[topic.master_key.key_arn]
        )


class Messaging(Construct):
    """Topics, bucket notifications, subscriptions and dead-letter queues."""

    def __init__(self, scope: Construct, construct_id: str, *, bucket: s3.IBucket, settings: Settings) -> None:
        super().__init__(scope, construct_id)
        # S3 and CloudWatch publish to an encrypted topic only with a customer-managed key, whose policy lets them
        # (S3's statement: added by its notifications, CloudWatch's: by Observability); the functions and the run
        # state machine publish with their roles' grants (``grant_publish``)
        self.topic_key = kms.Key(
            self,
            "TopicKey",
            description="slsml: the key of the pipeline's and the alarms' SNS topics",
            enable_key_rotation=True,
            removal_policy=settings.cdk_removal_policy,
        )
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
        self._retain_notifications_handler_logs(settings)

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
        NagSuppressions.add_resource_suppressions(
            self._notifications_handler(),
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

    def _retain_notifications_handler_logs(self, settings: Settings) -> None:
        """CDK's bucket-notification handler logs to a group of the stack, kept as long as the functions' logs
        (Lambda's own group for it would keep them forever)."""
        handler = self._notifications_handler()
        function = handler.node.default_child
        assert isinstance(function, CfnResource) and function.cfn_resource_type == "AWS::Lambda::Function"
        self.notifications_handler_logs = logs.LogGroup(
            self,
            "NotificationsHandlerLogs",
            retention=settings.log_retention,
            removal_policy=settings.cdk_removal_policy,
        )
        function.add_property_override("LoggingConfig.LogGroup", self.notifications_handler_logs.log_group_name)

    def _notifications_handler(self) -> Construct:
        """The CDK singleton (a function and its role, at the stack's root) that writes the bucket's notification
        configuration."""
        stack = Stack.of(self)
        (handler,) = [c for c in stack.node.children if c.node.id.startswith("BucketNotificationsHandler")]
        return handler

    def _topic(self, name: str) -> sns.Topic:
        # TLS enforced, encrypted with the topic key: messages carry run ids, S3 keys and counters, never data
        return sns.Topic(self, name, display_name=f"slsml {name}", enforce_ssl=True, master_key=self.topic_key)

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
