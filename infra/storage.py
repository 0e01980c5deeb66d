"""Storage: the data bucket (models, datasets, run scratch), its access-log bucket and the run table."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import CustomResourceProviderBase, Duration, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.settings import Settings
from slsml.spec import deployment
from slsml.state import records

_TYPES = {"S": dynamodb.AttributeType.STRING, "N": dynamodb.AttributeType.NUMBER}


def _attribute(key: records.KeyAttribute) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=key.name, type=_TYPES[key.type])


class Storage(Construct):
    """The bucket every function reads and writes, and the table holding run and iteration state."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings) -> None:
        super().__init__(scope, construct_id)
        removal = settings.cdk_removal_policy
        destroy = settings.removal_policy == "destroy"

        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            lifecycle_rules=[s3.LifecycleRule(id="ExpireAccessLogs", expiration=Duration.days(90))],
            removal_policy=removal,
            auto_delete_objects=destroy,
        )

        # Lifecycle filters match a key prefix (and tags), not a pattern, and transient scratch lives at
        # runs/<run>/iters/ beside carried state: writers tag transient objects (slsml.spec.deployment.SCRATCH_TAG_*)
        # and the rule matches prefix runs/ AND that tag; untagged objects (models, run configs, carried state) are
        # kept. The rules are declared once (slsml.spec.deployment), for this bucket and the local cloud's alike.
        lifecycle_rules = [
            s3.LifecycleRule(
                id=rule.id,
                prefix=rule.prefix or None,
                tag_filters=rule.tags or None,
                expiration=Duration.days(rule.expiration_days) if rule.expiration_days else None,
                noncurrent_version_expiration=(
                    Duration.days(rule.expiration_days) if rule.expiration_days and settings.bucket_versioning else None
                ),
                abort_incomplete_multipart_upload_after=(
                    Duration.days(rule.abort_uploads_days) if rule.abort_uploads_days else None
                ),
            )
            for rule in deployment.lifecycle_rules(settings.scratch_expiry_days)
        ]
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="data/",
            versioned=settings.bucket_versioning,
            lifecycle_rules=lifecycle_rules,
            removal_policy=removal,
            auto_delete_objects=destroy,
        )

        # create-only, enforced by S3 for whoever writes: the statements the local cloud installs and enforces too
        for statement in deployment.bucket_policy_statements(self.bucket.bucket_arn):
            self.bucket.add_to_resource_policy(iam.PolicyStatement.from_json(statement))

        # the table as slsml.state.records defines it (the local runtime creates it from the same definition)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=_attribute(records.PARTITION_KEY),
            sort_key=_attribute(records.SORT_KEY),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=records.TTL_ATTRIBUTE,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            removal_policy=removal,
        )
        for index in records.INDEXES:
            self.table.add_global_secondary_index(
                index_name=index.name,
                partition_key=_attribute(index.partition),
                sort_key=_attribute(index.sort),
                projection_type=dynamodb.ProjectionType.ALL,
            )

    def guard_run_deletes(self, roles: Mapping[str, iam.IRole]) -> None:
        """Deletes under runs/ refused by the bucket's policy to every principal but the roles (``roles``: by function)
        of the steps that delete each kind of object (``wiring.Function.deletes``), and, where the stack destroys its
        bucket, CDK's handler that empties it."""
        emptier = Stack.of(self).node.try_find_child("Custom::S3AutoDeleteObjectsCustomResourceProvider")
        others = [emptier.role_arn] if isinstance(emptier, CustomResourceProviderBase) else []
        deleters = deployment.run_deleters({name: role.role_arn for name, role in roles.items()}, others)
        for statement in deployment.deletion_statements(self.bucket.bucket_arn, deleters):
            self.bucket.add_to_resource_policy(iam.PolicyStatement.from_json(statement))
