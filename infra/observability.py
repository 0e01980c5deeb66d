"""Observability: a CloudWatch dashboard of the pipeline and alarms on function errors, dead letters,
failed runs, rejected messages and the watchdog's deadline actions, all notifying one topic (encrypted with the
pipeline topics' key). Custom metrics follow slsml.spec.deployment (Powertools EMF),
emitted where slsml.pipeline.metrics says. The dead-letter queues feed the dead-letter reader, which takes each
message as it comes: what they show is the messages received from them (by the reader).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.naming import pascal
from slsml.spec.deployment import METRICS_NAMESPACE, SERVICE_NAME, Metric

PERIOD = Duration.minutes(5)
WIDGET_WIDTH = 8
CUSTOM_STATISTICS = {
    Metric.ITERATION_SECONDS: "Average",
    Metric.WORKER_COMPUTE_SECONDS: "Average",
    Metric.TRAIN_LOSS: "Average",
    Metric.WORKERS_DONE: "Sum",
    Metric.LATE_WORKERS: "Sum",
    Metric.BYTES_READ: "Sum",
    Metric.BYTES_WRITTEN: "Sum",
    Metric.DEADLINE_ACTIONS: "Sum",
    Metric.REJECTED_MESSAGES: "Sum",
    Metric.REFUSED_STARTS: "Sum",
    Metric.REFUSED_OBJECTS: "Sum",
}


def custom_metric(metric: Metric, statistic: str) -> cloudwatch.Metric:
    """A metric the functions emit through Powertools (namespace and service dimension shared by all)."""
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=metric.value,
        dimensions_map={"service": SERVICE_NAME},
        statistic=statistic,
        period=PERIOD,
    )


class Observability(Construct):
    """Dashboard, alarms and the topic the alarms notify."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        functions: Mapping[str, lambda_.IFunction],
        dead_letter_queues: Mapping[str, sqs.IQueue],
        state_machine: sfn.IStateMachine,
        topic_key: kms.IKey,
    ) -> None:
        super().__init__(scope, construct_id)
        # CloudWatch publishes to an encrypted topic with a customer-managed key whose policy lets it (as AWS
        # documents it for alarm actions)
        topic_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AlarmsPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
            )
        )
        self.alarm_topic = sns.Topic(
            self, "Alarms", display_name="slsml alarms", enforce_ssl=True, master_key=topic_key
        )

        self.alarms: list[cloudwatch.Alarm] = []
        for name, fn in functions.items():
            self._alarm(f"{pascal(name)}Errors", fn.metric_errors(period=PERIOD, statistic="Sum"), f"{name} failed")
        for name, queue in dead_letter_queues.items():
            received = queue.metric_number_of_messages_received(period=PERIOD, statistic="Sum")
            self._alarm(
                f"{name}DeadLetters",
                received,
                f"messages dead-lettered in the {name} queue (the dead-letter reader fails their runs)",
            )
        self._alarm("RunsFailed", state_machine.metric_failed(period=PERIOD, statistic="Sum"), "a training run failed")
        self._alarm(
            "RejectedMessages",
            custom_metric(Metric.REJECTED_MESSAGES, CUSTOM_STATISTICS[Metric.REJECTED_MESSAGES]),
            "messages rejected: malformed, forged, or not of the run they name (no step acted on them)",
        )
        self._alarm(
            "DeadlineActions",
            custom_metric(Metric.DEADLINE_ACTIONS, CUSTOM_STATISTICS[Metric.DEADLINE_ACTIONS]),
            "the watchdog acted at a deadline: fired a barrier, re-launched steps, kept a stale shard or failed a run",
        )

        self.dashboard = cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=f"{Stack.of(self).stack_name}-pipeline",
            default_interval=Duration.hours(3),
        )
        self.dashboard.add_widgets(
            self._graph("Invocations", [fn.metric_invocations(period=PERIOD, label=n) for n, fn in functions.items()]),
            self._graph("Errors", [fn.metric_errors(period=PERIOD, label=n) for n, fn in functions.items()]),
            self._graph(
                "Duration p90 (ms)",
                [fn.metric_duration(period=PERIOD, statistic="p90", label=n) for n, fn in functions.items()],
            ),
        )
        self.dashboard.add_widgets(
            self._graph(
                "Dead letters",
                [
                    queue.metric_number_of_messages_received(period=PERIOD, statistic="Sum", label=n)
                    for n, queue in dead_letter_queues.items()
                ],
            ),
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=self.alarms, width=2 * WIDGET_WIDTH),
        )
        self.dashboard.add_widgets(
            *(
                self._graph(f"{metric.value} ({statistic})", [custom_metric(metric, statistic)])
                for metric, statistic in CUSTOM_STATISTICS.items()
            )
        )

    @property
    def dashboard_url(self) -> str:
        stack = Stack.of(self)
        return (
            f"https://{stack.region}.console.aws.amazon.com/cloudwatch/home?region={stack.region}"
            f"#dashboards:name={self.dashboard.dashboard_name}"
        )

    def _alarm(self, construct_id: str, metric: cloudwatch.IMetric, description: str) -> None:
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            metric=metric,
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"slsml: {description}",
        )
        alarm.add_alarm_action(actions.SnsAction(self.alarm_topic))
        self.alarms.append(alarm)

    @staticmethod
    def _graph(title: str, metrics: list[cloudwatch.IMetric]) -> cloudwatch.GraphWidget:
        return cloudwatch.GraphWidget(title=title, left=metrics, width=WIDGET_WIDTH)
