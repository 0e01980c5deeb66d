"""AWS list prices, one table for everything slsml prices: run summaries and ``slsml plan``.

The built-in table is us-east-1 on-demand list prices as of November 2026, from the public pricing
pages (aws.amazon.com/lambda/pricing, /s3/pricing, /sns/pricing, /sqs/pricing, /dynamodb/pricing,
/step-functions/pricing, /cloudwatch/pricing, /privatelink/pricing, /kms/pricing, /ec2/pricing/on-demand). Another
region or a newer price list is a JSON file of the same shape (any subset of fields), given as ``--prices FILE`` or
``SLSML_PRICES``.

GPU workers run on Lambda Managed Instances: EC2 instances of the types in ``GPU_INSTANCES`` (billed at their
on-demand price, with a management fee of 15 % of it, and per request; no GB-seconds), in a VPC whose interface
endpoints are billed per Availability Zone and hour and per GB they process.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slsml.spec import deployment
from slsml.spec.errors import BadInputError, described

PRICES_ENV = "SLSML_PRICES"
LAMBDA_PRICING = "https://aws.amazon.com/lambda/pricing/"
PRIVATELINK_PRICING = "https://aws.amazon.com/privatelink/pricing/"
KMS_PRICING = "https://aws.amazon.com/kms/pricing/"
EC2_PRICING = "https://aws.amazon.com/ec2/pricing/on-demand/"


class GpuInstance(BaseModel):
    """An EC2 instance type GPU workers may run on, what it holds and its on-demand price."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    card: str = Field(description="its GPU, as NVIDIA's driver names it")
    gpus: int = Field(gt=0)
    gpu_memory_gib: int = Field(gt=0, description="of each GPU")
    dollars_per_hour: float = Field(gt=0, description="on demand, Linux, us-east-1")
    source: str


# on demand, Linux, us-east-1, $/h; what each type holds: ``slsml.spec.deployment.GPU_INSTANCES``
GPU_DOLLARS_PER_HOUR = {
    "g4dn.xlarge": 0.526,
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g6.xlarge": 0.8048,
    "g6.2xlarge": 0.9776,
    "g6.12xlarge": 4.6016,
    "g6e.xlarge": 1.861,
    "g6e.2xlarge": 2.24208,
}


def _gpu_instance(name: str, dollars_per_hour: float) -> GpuInstance:
    hardware = deployment.GPU_INSTANCES[name]
    family = name.split(".")[0].removesuffix("dn")
    return GpuInstance(
        card=hardware.card,
        gpus=hardware.gpus,
        gpu_memory_gib=hardware.gpu_memory_gib,
        dollars_per_hour=dollars_per_hour,
        source=f"{EC2_PRICING} (hardware: https://aws.amazon.com/ec2/instance-types/{family}/)",
    )


GPU_INSTANCES = {name: _gpu_instance(name, price) for name, price in GPU_DOLLARS_PER_HOUR.items()}


class PriceTable(BaseModel):
    """Dollars per unit. Requests are priced by ``service:Operation`` (as botocore names them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = "us-east-1"
    as_of: str = "2026-11"
    source: str = "AWS public pricing pages, on-demand list prices"
    lambda_gb_second: float = Field(default=0.0000166667, description="x86; arm64 is 0.0000133334")
    lambda_request: float = 0.20 / 1e6
    s3_put: float = Field(default=0.005 / 1000, description="PUT, COPY, POST, LIST")
    s3_get: float = Field(default=0.0004 / 1000, description="GET, HEAD and all other requests but DELETE")
    sns_publish: float = Field(default=0.50 / 1e6, description="per 64 KB chunk of a published message")
    sqs_request: float = Field(default=0.40 / 1e6, description="per 64 KB chunk")
    dynamodb_write_unit: float = Field(default=0.625 / 1e6, description="on demand, per write request unit")
    dynamodb_read_unit: float = Field(default=0.125 / 1e6, description="on demand, per read request unit")
    kms_request: float = Field(default=0.03 / 10_000, description=f"a KMS request, e.g. a Decrypt ({KMS_PRICING})")
    kms_key_pair: float = Field(default=0.10 / 10_000, description="an ECC GenerateDataKeyPair(WithoutPlaintext)")
    states_transition: float = 0.025 / 1000
    logs_ingested_gb: float = 0.50
    managed_instances_fee: float = Field(
        default=0.15,
        description="Lambda Managed Instances' management fee, a share of the instances' on-demand price"
        f" ({LAMBDA_PRICING})",
    )
    vpc_endpoint_hour: float = Field(
        default=0.01, description=f"an interface VPC endpoint, per Availability Zone and hour ({PRIVATELINK_PRICING})"
    )
    vpc_endpoint_gb: float = Field(
        default=0.01, description="data processed by interface endpoints, per GB (the first PB a month)"
    )
    gpu_instances: dict[str, GpuInstance] = Field(
        default_factory=lambda: dict(GPU_INSTANCES), description="the instance types GPU workers may run on"
    )

    def request_price(self, operation: str) -> float:
        """The price of one ``service:Operation`` request, apart from what it consumes (DynamoDB units)."""
        service, _, name = operation.partition(":")
        if service == "s3":
            if name in _S3_FREE:
                return 0.0
            return self.s3_put if name in _S3_PUT_CLASS else self.s3_get
        if service == "sns":
            return self.sns_publish if name.startswith("Publish") else 0.0
        if service == "sqs":
            return self.sqs_request
        if service == "kms":
            return self.kms_key_pair if name.startswith("GenerateDataKeyPair") else self.kms_request
        return 0.0  # DynamoDB is priced by units; Step Functions by state transitions; control calls are free

    def cost(
        self,
        requests: Mapping[str, float],
        read_units: float = 0.0,
        write_units: float = 0.0,
        gb_seconds: float = 0.0,
        invocations: float = 0.0,
        publish_chunks: Mapping[str, float] | None = None,
        log_bytes: float = 0.0,
    ) -> dict[str, float]:
        """Dollars by service for the given usage. ``publish_chunks`` overrides the request count of
        SNS operations where messages span several 64 KB chunks (a PublishBatch entry is one publish)."""
        by_service: dict[str, float] = {}
        for operation, count in requests.items():
            if publish_chunks and operation in publish_chunks:
                count = publish_chunks[operation]
            service = operation.partition(":")[0]
            by_service[service] = by_service.get(service, 0.0) + count * self.request_price(operation)
        units = read_units * self.dynamodb_read_unit + write_units * self.dynamodb_write_unit
        by_service["dynamodb"] = by_service.get("dynamodb", 0.0) + units
        by_service["lambda"] = gb_seconds * self.lambda_gb_second + invocations * self.lambda_request
        by_service["logs"] = log_bytes / 1e9 * self.logs_ingested_gb
        return {service: dollars for service, dollars in by_service.items() if dollars}


_S3_FREE = {"DeleteObject", "DeleteObjects", "AbortMultipartUpload"}  # S3 bills no DELETE or CANCEL request
_S3_PUT_CLASS = {
    "PutObject",
    "CopyObject",
    "PostObject",
    "ListObjects",
    "ListObjectsV2",
    "CreateMultipartUpload",
    "UploadPart",
    "CompleteMultipartUpload",
    "ListObjectVersions",
}


def usd(amount: float) -> str:
    """Dollars to four significant digits, in fixed point (a small run's figures differ in their fourth digit):
    ``$1,234.50``, ``$0.008661``, ``$0.000001``."""
    if amount >= 100 or amount <= 0:
        return f"${amount:,.2f}"
    text = f"{amount:,.{max(2, 3 - math.floor(math.log10(amount)))}f}"
    whole, _, decimals = text.partition(".")
    return f"${whole}.{decimals[:2] + decimals[2:].rstrip('0')}"


def sns_chunks(message_bytes: int) -> int:
    """SNS bills each 64 KB of a published payload as one request."""
    return max(1, math.ceil(message_bytes / (64 * 1024)))


def gb_seconds(duration_s: float, memory_mb: int) -> float:
    """Lambda bills duration rounded up to the millisecond, times the configured memory."""
    return math.ceil(duration_s * 1000) / 1000 * memory_mb / 1024


def load(path: str | os.PathLike | None = None) -> PriceTable:
    """The price table: built in, or overridden field by field from ``path`` (or ``$SLSML_PRICES``)."""
    path = path or os.environ.get(PRICES_ENV)
    if not path:
        return PriceTable()
    try:
        overrides = json.loads(Path(path).read_text())
        return PriceTable.model_validate({**PriceTable().model_dump(), **overrides})
    except FileNotFoundError:
        raise BadInputError(f"price file {path} does not exist") from None
    except (json.JSONDecodeError, TypeError) as error:
        raise BadInputError(f"price file {path} is not a JSON object: {error}") from None
    except ValidationError as error:
        raise BadInputError(f"price file {path}: {described(error)}") from None
