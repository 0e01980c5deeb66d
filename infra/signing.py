"""The signing key: the KMS key that seals each run's signing keys (slsml.pipeline.proof). Each role may unseal its own
kind's alone (its grants: ``deployment.signing_grants``), and the key's policy denies the rest to every role
(``deployment.key_policy_statements``), whatever else a role were granted."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from slsml.spec import deployment


class Signing(Construct):
    """The key that seals runs' signing keys."""

    def __init__(self, scope: Construct, construct_id: str, *, removal_policy: RemovalPolicy) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(
            self,
            "SigningKey",
            description="slsml: seals each run's signing keys, one per kind of step",
            enable_key_rotation=True,
            removal_policy=removal_policy,
        )

    def guard(self, roles: Mapping[str, iam.IRole]) -> None:
        """Deny every role (``roles``: by function) the use of the key beyond its own kind's keys."""
        arns = {name: role.role_arn for name, role in roles.items()}
        for statement in deployment.key_policy_statements(arns):
            self.key.add_to_resource_policy(iam.PolicyStatement.from_json(statement))
