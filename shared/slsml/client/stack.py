"""A deployed slsml stack, found by name from its CloudFormation outputs: no ARNs typed by hand."""

from __future__ import annotations

from botocore.exceptions import ClientError

from slsml.accounting import usage
from slsml.aws import clients as aws
from slsml.pipeline.services import Services
from slsml.spec import wiring
from slsml.spec.deployment import log_group_output
from slsml.spec.errors import NotFoundError
from slsml.spec.limits import RUN_LIMITS_OUTPUT, RunLimits


def _outputs(name: str, wanted: list[str]) -> dict[str, str]:
    try:
        stacks = aws.client("cloudformation").describe_stacks(StackName=name)["Stacks"]
    except ClientError as error:
        raise NotFoundError(f"no stack named {name!r}: {error}") from None
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
    missing = [key for key in wanted if key not in outputs]
    if missing:
        raise NotFoundError(f"stack {name!r} is not an slsml stack (no outputs {', '.join(missing)})")
    return outputs


def services_for_stack(name: str) -> Services:
    """The bucket, table, topics and state machine of stack ``name`` (AWS credentials, region and
    ``AWS_ENDPOINT_URL`` as for any AWS tool)."""
    wanted = ["BucketName", "TableName", "StateMachineArn", *(f"{t.name}TopicArn" for t in wiring.TOPICS)]
    outputs = _outputs(name, wanted)
    return Services.from_names(
        outputs["BucketName"],
        outputs["TableName"],
        {t.name: outputs[f"{t.name}TopicArn"] for t in wiring.TOPICS},
        outputs["StateMachineArn"],
        limits=RunLimits.model_validate_json(outputs[RUN_LIMITS_OUTPUT]) if RUN_LIMITS_OUTPUT in outputs else None,
    )


def usage_records(name: str, run_id: str, since: float) -> list[usage.UsageRecord]:
    """The usage lines of ``run_id`` that stack ``name``'s functions logged to CloudWatch since ``since``."""
    wanted = [log_group_output(fn.name) for fn in wiring.FUNCTIONS]
    outputs = _outputs(name, wanted)
    return usage.read_cloudwatch(aws.client("logs"), [outputs[key] for key in wanted], run_id, since)
