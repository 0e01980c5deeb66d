"""The figures the cost model rests on, each with its published or measured source (``Parameters``), and AWS's
quotas (``Quotas``); overridden by a calibration file or ``name=value`` pairs."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slsml.cost import cards
from slsml.rounds import sizing
from slsml.spec import errors
from slsml.spec.errors import BadInputError
from slsml.spec.messages import PARALLEL_BATCHES


def _param(default: float, unit: str, what: str, source: str, positive: bool = False) -> Any:
    extra: dict[str, Any] = {"unit": unit, "source": source}
    if positive:
        return Field(default=default, description=what, json_schema_extra=extra, gt=0)
    return Field(default=default, description=what, json_schema_extra=extra, ge=0)


class Parameters(BaseModel):
    """Every figure the model rests on, with its published or measured source. Override any of them
    with ``--param name=value`` or a calibration file (a JSON object of fitted values)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    s3_event_s: float = _param(
        1.0,
        "s",
        "the initial model's copy → S3 event → SNS ModelUpdated (the first iteration's launch)",
        "S3 docs: event notifications 'typically seconds, sometimes a minute or longer'",
    )
    sns_lambda_s: float = _param(0.073, "s", "SNS → Lambda delivery", "published p50 73 ms (p90 125 ms, p99 225 ms)")
    sns_publish_s: float = _param(
        0.02, "s", "one PublishBatch call", "estimate: one in-region HTTPS round trip; calibrate"
    )
    s3_request_s: float = _param(
        0.04,
        "s",
        "S3 request latency (first byte)",
        "FuncPipe §3.3: under 40 ms from Lambda (LambdaML Table 6: 80 ± 20 ms)",
    )
    s3_read_mb_s: float = _param(
        65.0,
        "MB/s",
        "S3 read bandwidth of one function",
        "LambdaML Table 6: 65 ± 7 MB/s; 50–70 MB/s re-measured in 2026",
        True,
    )
    s3_write_mb_s: float = _param(65.0, "MB/s", "S3 write bandwidth of one function", "as s3_read_mb_s", True)
    s3_parallel_reads: float = _param(16, "GETs", "concurrent GETs of one reader", "slsml.aws.storage.get_many", True)
    sns_parallel_publishes: float = _param(
        PARALLEL_BATCHES,
        "PublishBatch",
        "concurrent PublishBatch calls of one publisher",
        "slsml.pipeline.bus",
        True,
    )
    dynamodb_s: float = _param(0.005, "s", "one DynamoDB request", "DynamoDB docs: single-digit milliseconds")
    handler_s: float = _param(0.005, "s", "warm invocation overhead (parse, log)", "estimate; calibrate")
    cold_start_zip_s: float = _param(
        0.5,
        "s",
        "cold start of a zip function (numpy layer)",
        "Lambda docs: cold starts 'from under 100 ms to over 1 second'",
    )
    cold_start_image_s: float = _param(
        6.0, "s", "cold start of the TensorFlow image", "TensorFlow 2.21 import ~6 s, measured (DESIGN.md)"
    )
    vcpu_efficiency: float = _param(0.8, "", "TensorFlow's speed-up per vCPU beyond the first", "estimate; calibrate")
    compute_s_per_param_sample: float = _param(
        1.92e-8,
        "s",
        "gradient time per sample and weight on one vCPU (--params only)",
        "ResNet-50 on 224×224×3: 0.49 s per sample on one core, TF 2.21, measured",
    )
    train_flops_per_param_sample: float = _param(
        cards.RESNET50_TRAIN_FLOPS / cards.RESNET50_PARAMS,
        "FLOPs",
        "a training step's floating-point operations per sample and weight, on a GPU (--params only)",
        "ResNet-50 on 224×224×3: 23.39 GFLOPs a sample (forward 7.80), counted by TensorFlow's cost analysis"
        " (slsml.cost.flops)",
    )
    activation_bytes_per_param_sample: float = _param(
        5.8,
        "B",
        "layer outputs kept for the backward pass, per sample and weight (--params only)",
        "ResNet-50 on 224×224×3: 148 MB of layer outputs per sample, counted",
    )
    keras_file_overhead: float = _param(
        0.0064,
        "",
        ".keras file bytes beyond the weights, relative (--params only)",
        "ResNet-50: 103,199,296 B file for 102,546,848 B of weights, measured",
    )
    significance_density: float = _param(
        0.01,
        "",
        "fraction of a part's trainable entries a significance:V update sends",
        "estimate: depends on V and the model; calibrate",
    )
    keras_mb_s: float = _param(
        73.0, "MB/s", "saving or loading a .keras file, one vCPU", "ResNet-50 .keras saved in 1.41 s, measured", True
    )
    average_ns: float = _param(
        1.0, "ns", "weighted sum of one part, per weight (reducer)", "numpy on one core: 0.7 ns, measured"
    )
    optimizer_ns: float = _param(10.6, "ns", "optimizer step per weight (reducer)", "numpy Adam on one core, measured")
    tf_runtime_mb: float = _param(
        sizing.TF_RUNTIME_MB,
        "MB",
        "memory of a TensorFlow function before the model",
        "RSS after importing TensorFlow 2.21, measured (slsml.rounds.sizing)",
    )
    python_runtime_mb: float = _param(
        50,
        "MB",
        "memory of a zip function before its data",
        "RSS after importing numpy, boto3, pydantic, Powertools, measured",
    )
    worker_model_copies: float = _param(
        sizing.MODEL_COPIES,
        "× M",
        "model-sized buffers of a worker's step beside its warm cache (its micro-batches' float64 sum adds 2 more)",
        "steps/worker: gradients, flat update, encoded update, weights read; the model is the cache's (rounds.sizing)",
    )
    merger_model_copies: float = _param(
        4,
        "× M",
        "model-sized buffers of the merger",
        "steps/merger: shards read, flat weights, model weights, saved file",
    )
    record_bytes: float = _param(200, "B", "one worker's record item", "the pipeline's table layout")
    participant_bytes: float = _param(30, "B", "one participant in the participants item", "the table layout")
    counter_item_bytes: float = _param(500, "B", "the iteration counter item", "the table layout: under 1 KB")
    run_item_bytes: float = _param(1000, "B", "the run's META item", "the table layout: ~1 KB")
    log_bytes_per_invocation: float = _param(
        1000, "B", "CloudWatch log bytes per invocation", "estimate: START/END/REPORT lines and one usage line"
    )
    zip_layer_mb: float = _param(
        95, "MB", "unzipped zip function + layer", "numpy, pydantic, Powertools, slsml as installed, measured"
    )
    gpu_scale_up_s: float = _param(
        300,
        "s",
        "a GPU worker fleet's scale-up before the first iteration: instances launched, image pulled, CUDA started",
        "estimate: Lambda Managed Instances scale asynchronously, a doubling of traffic within 5 minutes (Lambda"
        " docs, scaling Managed Instances); calibrate",
    )
    gpu_scale_down_s: float = _param(
        300,
        "s",
        "a GPU worker fleet's instances billed after the run ends: its execution environments set to none, the"
        " instances drained and terminated",
        "estimate: Lambda Managed Instances scale asynchronously, down as up (Lambda docs, scaling Managed"
        " Instances); calibrate",
    )
    vm_start_s: float = _param(
        120,
        "s",
        "a machine compared with (--compare-vm): launched, booted, its framework loaded before its first step",
        "estimate: an EC2 instance's launch and boot with a deep learning AMI; calibrate",
    )
    image_mb: float = _param(
        2000,
        "MB",
        "TensorFlow container image",
        "TensorFlow 2.21 + keras installed 1.3 GB, measured, on the Lambda base image",
    )


class Quotas(BaseModel):
    """AWS default quotas (raise some by request: ``--quota name=value``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lambda_concurrency: int = Field(1000, gt=0, description="concurrent executions per region (account)")
    lambda_burst_per_10s: int = Field(1000, gt=0, description="new execution environments per 10 s per function")
    lambda_memory_mb: int = Field(10240, gt=0, description="memory of one function")
    lambda_timeout_s: int = Field(900, gt=0, description="duration of one invocation")
    zip_mb: int = Field(250, gt=0, description="unzipped zip function + layers")
    image_mb: int = Field(10240, gt=0, description="container image")
    dynamodb_item_bytes: int = Field(400 * 1024, gt=0, description="one item")
    dynamodb_partition_wu_s: int = Field(1000, gt=0, description="write units per second on one partition")
    s3_put_per_s: int = Field(3500, gt=0, description="PUT/COPY/POST/DELETE per second per prefix")
    s3_get_per_s: int = Field(5500, gt=0, description="GET/HEAD per second per prefix")
    sns_message_bytes: int = Field(256 * 1024, gt=0, description="one SNS message")
    ec2_g_vcpus: int | None = Field(
        None,
        ge=0,
        description="Running On-Demand G and VT instances, vCPUs per region (Service Quotas L-DB2E81BA), which a GPU"
        " worker's fleet counts against; unknown unless given (an account's own, often low on a new one)",
    )


def load_overrides(calibration: str | Path | None, pairs: Iterable[str], model: type[BaseModel]) -> tuple[Any, dict]:
    """``model`` with values from a calibration JSON file, then ``name=value`` pairs; and where each
    overridden value came from."""
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if calibration:
        path = Path(calibration)
        try:
            fitted = json.loads(path.read_text())
        except FileNotFoundError:
            raise BadInputError(f"calibration file {path} does not exist") from None
        except json.JSONDecodeError as error:
            raise BadInputError(f"calibration file {path} is not JSON: {error}") from None
        if not isinstance(fitted, dict):
            raise BadInputError(f"calibration file {path} must hold a JSON object of parameter values")
        values.update(fitted)
        origin.update(dict.fromkeys(fitted, f"calibration {path.name}"))
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise BadInputError(f"{pair!r}: write name=value")
        values[name.strip()] = value.strip()
        origin[name.strip()] = "given"
    unknown = sorted(set(values) - set(model.model_fields))
    if unknown:
        raise BadInputError(f"unknown {model.__name__.lower()} {unknown}; known: {', '.join(model.model_fields)}")
    try:
        return model(**values), origin
    except ValidationError as error:
        raise BadInputError(f"{model.__name__.lower()}: {errors.described(error)}") from None


@functools.cache  # a field's facts never change: a plan's recommendation reads them thousands of times
def parameter_facts(name: str) -> dict[str, Any]:
    """A parameter's unit and source (its field's ``json_schema_extra``, as ``_param`` gives it)."""
    extra = Parameters.model_fields[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def described(p: Parameters) -> dict[str, dict[str, Any]]:
    """Each parameter's value, unit, meaning and source, as the plan lists them."""
    out = {}
    for name, field in Parameters.model_fields.items():
        extra = parameter_facts(name)
        out[name] = {
            "value": getattr(p, name),
            "unit": extra.get("unit", ""),
            "what": field.description,
            "source": extra.get("source", ""),
        }
    return out
