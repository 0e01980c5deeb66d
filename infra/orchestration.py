"""Orchestration: the run state machine (slsml.state.orchestration's definition, the same one the local
runtime executes), traced with X-Ray and logged in full. Service integrations only: its role may
register runs in the table, copy a run's source model, and publish to RunControl and RunEvents.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from cdk_nag import NagPackSuppression, NagSuppressions, RegexAppliesTo
from constructs import Construct

from infra.messaging import grant_publish
from infra.settings import Settings
from slsml.spec import keys, wiring
from slsml.state import orchestration


class Orchestration(Construct):
    """One execution of ``state_machine`` per training run."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        bucket: s3.IBucket,
        table: dynamodb.ITable,
        topics: Mapping[str, sns.ITopic],
    ) -> None:
        super().__init__(scope, construct_id)
        definition = orchestration.definition(
            bucket.bucket_name,
            table.table_name,
            topics[wiring.RUN_CONTROL.name].topic_arn,
            topics[wiring.RUN_EVENTS.name].topic_arn,
        )
        log_group = logs.LogGroup(
            self, "Logs", retention=settings.log_retention, removal_policy=settings.cdk_removal_policy
        )
        self.state_machine = sfn.StateMachine(
            self,
            "RunStateMachine",
            definition_body=sfn.DefinitionBody.from_string(Stack.of(self).to_json_string(definition)),
            state_machine_type=sfn.StateMachineType.STANDARD,
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
        )
        role = self.state_machine.role
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:GetItem"], resources=[table.table_arn]
            )
        )
        # the initial model: a copy of the run's source.keras to its models/
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects(keys.SOURCE_MODEL_OBJECTS)])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:PutObject"], resources=[bucket.arn_for_objects(keys.MODEL_OBJECTS)])
        )
        for topic in (wiring.RUN_CONTROL, wiring.RUN_EVENTS):
            grant_publish(topics[topic.name], role)
        NagSuppressions.add_resource_suppressions(
            role,
            [
                NagPackSuppression(
                    id="AwsSolutions-IAM5",
                    reason="The state machine copies runs/<run>/source.keras to runs/<run>/models/ for any run,"
                    " so it reads source models and writes models of every run; log delivery and X-Ray accept no"
                    " resource but *.",
                    applies_to=[
                        RegexAppliesTo(regex=r"/^Resource::<.+\.Arn>\/runs\/\*\/(source\.keras|models\/\*)$/g"),
                        "Resource::*",
                    ],
                )
            ],
            apply_to_children=True,
        )
