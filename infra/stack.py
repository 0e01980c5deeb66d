"""The slsml stack: storage, messaging, orchestration, compute and observability, wired by slsml.spec.wiring."""

from __future__ import annotations

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from infra.compute import Compute
from infra.gpu import GpuFleet
from infra.messaging import Messaging
from infra.naming import pascal
from infra.observability import Observability
from infra.orchestration import Orchestration
from infra.settings import Settings
from infra.signing import Signing
from infra.storage import Storage
from slsml.spec import wiring
from slsml.spec.deployment import log_group_output
from slsml.spec.limits import RUN_LIMITS_OUTPUT


class SlsmlStack(Stack):
    """Everything one slsml deployment needs."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings) -> None:
        super().__init__(scope, construct_id, description="slsml: serverless training of Keras models")
        self.settings = settings
        self.storage = Storage(self, "Storage", settings=settings)
        self.messaging = Messaging(self, "Messaging", bucket=self.storage.bucket, settings=settings)
        self.orchestration = Orchestration(
            self,
            "Orchestration",
            settings=settings,
            bucket=self.storage.bucket,
            table=self.storage.table,
            topics=self.messaging.topics,
        )
        worker = settings.gpu_worker
        self.gpu = (
            None
            if worker is None
            else GpuFleet(
                self,
                "GpuFleet",
                worker=worker,
                log_retention=settings.log_retention,
                removal_policy=settings.cdk_removal_policy,
            )
        )
        self.signing = Signing(self, "Signing", removal_policy=settings.cdk_removal_policy)
        self.compute = Compute(
            self,
            "Compute",
            settings=settings,
            bucket=self.storage.bucket,
            table=self.storage.table,
            topics=self.messaging.topics,
            queues=self.messaging.queues,
            failures=self.messaging.function_failures,
            state_machine=self.orchestration.state_machine,
            signing_key=self.signing.key,
            gpu=self.gpu,
        )
        self.messaging.subscribe(self.compute.functions)
        roles = {name: fn.role for name, fn in self.compute.functions.items() if fn.role}
        self.storage.guard_run_deletes(roles)
        self.signing.guard(roles)
        self.observability = Observability(
            self,
            "Observability",
            functions=self.compute.functions,
            dead_letter_queues=self.messaging.dead_letter_queues,
            state_machine=self.orchestration.state_machine,
            topic_key=self.messaging.topic_key,
        )

        CfnOutput(self, "BucketName", value=self.storage.bucket.bucket_name)
        CfnOutput(self, "TableName", value=self.storage.table.table_name)
        CfnOutput(self, "StateMachineArn", value=self.orchestration.state_machine.state_machine_arn)
        # the CLI refuses a run beyond them before it stores anything (the pipeline enforces them anyway)
        CfnOutput(self, RUN_LIMITS_OUTPUT, value=settings.limits.model_dump_json())
        for name, topic in self.messaging.topics.items():
            CfnOutput(self, f"{name}TopicArn", value=topic.topic_arn)
        CfnOutput(self, "AlarmsTopicArn", value=self.observability.alarm_topic.topic_arn)
        CfnOutput(self, "DashboardUrl", value=self.observability.dashboard_url)
        for fn in wiring.FUNCTIONS:
            CfnOutput(self, f"{pascal(fn.name)}FunctionName", value=self.compute.functions[fn.name].function_name)
            # where the CLI reads the functions' usage lines
            CfnOutput(self, log_group_output(fn.name), value=self.compute.log_groups[fn.name].log_group_name)
