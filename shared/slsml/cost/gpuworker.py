"""The GPU worker: an execution environment of Lambda Managed Instances with ``accelerator_gib`` of a GPU, on EC2
instances held for the whole run, billed as Lambda Managed Instances bill them.

Dollars, over the run (its scale-up before the first iteration and the idle time between iterations included: the
environments are held until the run ends):

- the instances: ⌈W / environments per instance⌉, and no fewer than the ``LAUNCHED_INSTANCES`` Lambda launches for
  AZ resiliency, × the type's on-demand price (``PriceTable.gpu_instances``), an instance holding
  ⌊GPU memory / accelerator_gib⌋ environments on each of its GPUs;
- Lambda Managed Instances' management fee, ``managed_instances_fee`` (15 %) of that on-demand price;
- the requests, as every function's ($0.20 per million); no GB-second duration charge;
- the VPC's interface endpoints (``deployment.INTERFACE_ENDPOINTS`` in ``ENDPOINT_AZS`` zones) per Availability Zone
  and hour, and per GB they carry (the worker's SNS messages and logs); its gateway endpoints (S3, DynamoDB) are free.

A whole run adds (``run_extras``) the instances over the fleet's scale-down tail and the endpoints' hours rounded up
to whole hours.

Time: a worker computes its share at one environment's throughput: the model's training FLOPs per sample
(``slsml.cost.flops``, else estimated from its weights) ÷ (the card's published peak in the run's precision,
``cards.DATASHEETS`` × the fraction of it achieved). The fraction comes from a calibration of that very card
(``slsml bench gpu``), never from another card's, else from an estimate (``cards.estimated_fraction``), labelled so.
An environment with a share of a GPU's memory gets that share of its compute (the GPU's compute shared as its
memory is), and no more than it measured alone with that memory.

S3: an environment runs on an EC2 instance, not in Lambda's sandbox, so it reads and writes S3 as an instance does
(``s3_mb_s``): ``S3_CONNECTION_MB_S`` a connection, as many connections as the worker keeps busy (16 GETs of the
weights or the samples; its update's parts, ``storage.PARALLEL_PARTS`` at once, or one PUT of an update under
``storage.MULTIPART_BYTES``), within its share of the instance's network (``NETWORK_GBPS``, the instance's
environments sharing it), not Lambda's 65 MB/s a function (``s3_read_mb_s``)."""

from __future__ import annotations

import math

from slsml.accounting.prices import LAMBDA_PRICING, PRIVATELINK_PRICING, GpuInstance, PriceTable
from slsml.aws.storage import PARALLEL_PARTS, upload_parts
from slsml.cost.calibration import CALIBRATION_FILE, GpuCalibration, Precision, load_calibration
from slsml.cost.cards import DATASHEETS, MEASURE, Datasheet, datasheet, estimated_fraction
from slsml.cost.chain import round_traffic
from slsml.cost.parameters import Parameters, parameter_facts
from slsml.cost.workerkind import Fact, WorkerFigures
from slsml.cost.workload import Accelerator, Workload
from slsml.rounds.sizing import DEVICE_MODEL_COPIES, DEVICE_SAMPLE_SHARE
from slsml.spec.deployment import (
    ENDPOINT_AZS,
    GATEWAY_ENDPOINTS,
    GPU_INSTANCES,
    GPU_WORKER_DEFAULTS,
    INTERFACE_ENDPOINTS,
)
from slsml.spec.errors import BadInputError
from slsml.spec.limits import RunLimits

S3_PERFORMANCE = (
    "https://docs.aws.amazon.com/whitepapers/latest/s3-optimizing-performance-best-practices/"
    "horizontal-scaling-and-request-parallelization-for-high-throughput.html"
)
S3_CONNECTION_MB_S = 85.0  # "one concurrent request for each 85–90 MB/s of desired network throughput" (the low end)
EC2_NETWORK = "https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html#ac_network"
# each GPU instance type's network bandwidth, Gbps ("up to": its burst, for instances of 16 vCPUs or fewer)
NETWORK_GBPS = {
    "g4dn.xlarge": 25.0,
    "g5.xlarge": 10.0,
    "g5.2xlarge": 10.0,
    "g6.xlarge": 10.0,
    "g6.2xlarge": 10.0,
    "g6.12xlarge": 40.0,
    "g6e.xlarge": 20.0,
    "g6e.2xlarge": 20.0,
}
MANAGED_INSTANCES_SCALING = "https://docs.aws.amazon.com/lambda/latest/dg/lambda-managed-instances-scaling.html"
LAUNCHED_INSTANCES = 3  # "it launches three by default for AZ resiliency" (MANAGED_INSTANCES_SCALING)


def precision(w: Workload) -> Precision:
    """What the workers compute in: the run's mixed-precision policy, else float32."""
    return w.training.mixed_precision or "float32"


def train_flops(w: Workload, p: Parameters) -> float:
    """The FLOPs of one sample's training step of the workload's model: counted (``slsml.cost.flops``), else
    estimated from its weights as a ResNet-50-like network's (``train_flops_per_param_sample``)."""
    return w.train_flops_per_sample or w.params * p.train_flops_per_param_sample


def _fraction(
    name: str,
    instance: GpuInstance,
    gib: int,
    mode: Precision,
    calibration: GpuCalibration | None,
    calibration_name: str,
) -> tuple[Datasheet, float, float, str] | None:
    """(the card's datasheet, the fraction of its peak in ``mode`` a whole card and one environment of ``gib``
    achieve, where the fraction comes from) of the card of ``instance`` (type ``name``): a calibration of that card,
    else the estimate (``cards.estimated_fraction``); None where the card has no datasheet or no peak in ``mode``."""
    sheet = datasheet(instance.card)
    if sheet is None or sheet.tflops(mode) is None:
        return None
    share = gib / instance.gpu_memory_gib
    if calibration is not None and calibration.measures(instance.card):
        card = calibration.card_fraction(mode)
        if card is not None:
            alone = calibration.fraction(gib, mode)
            environment = min(card * share, alone) if alone is not None else card * share
            source = (
                f"measured on {calibration.card} by slsml bench gpu ({calibration_name}: {calibration.model}, {mode},"
                f" {calibration.measured_at})"
            )
            return sheet, card, environment, source
    estimate = estimated_fraction(mode, name)
    return sheet, estimate.value, estimate.value * share, estimate.source


def check_calibration(calibration: GpuCalibration, path: str, instance_types: tuple[str, ...]) -> None:
    """BadInputError, in one line, where ``calibration`` measured none of the cards of ``instance_types``: a card's
    measure is never applied to another card."""
    cards = sorted({GPU_INSTANCES[name].card for name in instance_types if name in GPU_INSTANCES})
    if cards and not any(calibration.measures(card) for card in cards):
        raise BadInputError(
            f"--gpu-calibration {path}: measured on {calibration.card}, not on the {' or '.join(cards)} of"
            f" {', '.join(instance_types)}; a calibration is never applied to another card:"
            f" {MEASURE.format(instance=instance_types[0])}"
        )


def accelerator(
    gib: int,
    w: Workload,
    p: Parameters,
    price_table: PriceTable,
    calibration: GpuCalibration | None = None,
    calibration_name: str = "",
    instance_types: tuple[str, ...] = GPU_WORKER_DEFAULTS["instance_types"],
) -> Accelerator:
    """The GPU of a worker of ``gib`` GiB for workload ``w`` on the instance type of ``instance_types`` (a
    deployment's ``functions.worker.instance_types``, by default the one the stack deploys) whose fleet of W
    environments costs least per sample a worker computes. BadInputError, in one line, where none can be priced."""
    mode = precision(w)
    types = price_table.gpu_instances
    for name in instance_types:
        if name not in types:
            raise BadInputError(f"GPU instance type {name}: not one of the price table ({', '.join(types)})")
        if types[name].gpu_memory_gib < gib:
            raise BadInputError(
                f"GPU instance type {name}: its {types[name].card} has {types[name].gpu_memory_gib} GiB, less than"
                f" the {gib} GiB of a worker's execution environment"
            )
    choices = []
    for name in instance_types:
        found = _fraction(name, types[name], gib, mode, calibration, calibration_name)
        if found is None:
            continue
        sheet, card, environment, source = found
        peak = sheet.tflops(mode)
        assert peak is not None
        candidate = Accelerator(
            gib=gib,
            instance=name,
            precision=mode,
            peak_tflops=peak,
            fraction=card,
            environment_fraction=environment,
            source=source,
        )
        choices.append((_fleet_dollars_per_sample(w.at(accelerator=candidate), p, price_table), candidate))
    if not choices:
        cards = sorted({types[name].card for name in instance_types})
        known = sorted(sheet.card for sheet in DATASHEETS if sheet.tflops(mode) is not None)
        raise BadInputError(
            f"--accelerator worker={gib} on {', '.join(instance_types)}: no {mode} peak is published of"
            f" {' or '.join(cards)} (datasheets: {', '.join(known)}); give --gpu-instance of one of them"
        )
    return min(choices, key=lambda choice: choice[0])[1]


def per_instance(a: Accelerator, price_table: PriceTable) -> int:
    """Execution environments one instance holds: ⌊GPU memory / accelerator memory⌋ on each of its GPUs."""
    kind = price_table.gpu_instances[a.instance]
    return kind.gpus * (kind.gpu_memory_gib // a.gib)


def environments_per_instance(a: Accelerator) -> int:
    """Execution environments one instance of ``a``'s type holds (its hardware: ``deployment.GPU_INSTANCES``)."""
    kind = GPU_INSTANCES[a.instance]
    return kind.gpus * (kind.gpu_memory_gib // a.gib)


def s3_mb_s(w: Workload, connections: float) -> float:
    """S3 MB/s of one environment moving bytes over ``connections`` at once: ``S3_CONNECTION_MB_S`` each, within its
    share of its instance's network."""
    a = w.accelerator
    assert a is not None
    network = NETWORK_GBPS[a.instance] * 1e3 / 8 / environments_per_instance(a)
    return min(max(1.0, connections) * S3_CONNECTION_MB_S, network)


def update_writes(w: Workload, p: Parameters) -> str:
    """The rate a GPU worker stores its update at, and in how many requests, in words."""
    parts = upload_parts(round_traffic(w, p).update_bytes)
    if parts == 1:
        return f"{s3_mb_s(w, 1):,.0f} MB/s for its update's one PUT"
    at_once = min(parts, PARALLEL_PARTS)
    return f"{s3_mb_s(w, at_once):,.0f} MB/s for its update's {parts} parts, {at_once} at once (a multipart upload)"


def instances(w: Workload, price_table: PriceTable) -> int:
    """The instances billed for W environments: those they take, and no fewer than the ``LAUNCHED_INSTANCES``
    Lambda launches for a version."""
    assert w.accelerator is not None
    return max(LAUNCHED_INSTANCES, math.ceil(w.workers / per_instance(w.accelerator, price_table)))


def fleet_vcpus(w: Workload) -> int:
    """The vCPUs of the instances W environments run on (``deployment.GPU_INSTANCES``), as the account's EC2 quota
    of running on-demand G instances counts them."""
    a = w.accelerator
    assert a is not None
    fleet = max(LAUNCHED_INSTANCES, math.ceil(w.workers / environments_per_instance(a)))
    return fleet * GPU_INSTANCES[a.instance].vcpus


def run_extras(w: Workload, p: Parameters, price_table: PriceTable, run_s: float) -> dict[str, float]:
    """What a whole run of ``run_s`` bills beside its iterations: the fleet's instances and their fee over the
    scale-down tail, and its interface endpoints' hours rounded up to whole hours (a partial endpoint-hour is
    billed as a whole one)."""
    assert w.accelerator is not None
    hourly = instances(w, price_table) * price_table.gpu_instances[w.accelerator.instance].dollars_per_hour
    hours = (run_s + p.gpu_scale_down_s) / 3600
    return {
        "scale-down tail": hourly * (1 + price_table.managed_instances_fee) * p.gpu_scale_down_s / 3600,
        "endpoint-hours, whole": (math.ceil(hours) - run_s / 3600)
        * len(INTERFACE_ENDPOINTS)
        * ENDPOINT_AZS
        * price_table.vpc_endpoint_hour,
    }


def seconds_per_sample(w: Workload, p: Parameters) -> float:
    """One environment's seconds per sample of the workload's model: its training FLOPs ÷ the fraction of the card's
    peak the environment achieves."""
    a = w.accelerator
    assert a is not None
    return train_flops(w, p) / (a.peak_tflops * 1e12 * a.environment_fraction)


def machine(w: Workload, p: Parameters, price_table: PriceTable) -> tuple[float, float, str, str]:
    """One machine of the workers' instance type training alone: (samples/s on the workload's model, its on-demand
    $/h, its name, the figures' sources), every GPU of it at the fraction of its peak the plan uses."""
    a = w.accelerator
    assert a is not None
    kind = price_table.gpu_instances[a.instance]
    rate = kind.gpus * a.peak_tflops * 1e12 * a.fraction / train_flops(w, p)
    return rate, kind.dollars_per_hour, a.instance, f"achieved fraction: {a.source}; price: {kind.source}"


class GpuWorker:
    """A worker on Lambda Managed Instances with a share of a GPU."""

    name = "gpu"

    def compute_s(self, w: Workload, p: Parameters, samples: int) -> float:
        """``samples`` samples at one environment's throughput on the workload's model."""
        return samples * seconds_per_sample(w, p)

    def compute_detail(self, w: Workload) -> str:
        """The GPU it computes on."""
        a = w.accelerator
        assert a is not None
        return f" on {a.gib} GiB of a {a.instance} GPU ({a.precision})"

    def cold_start_s(self, w: Workload, p: Parameters) -> float:
        """The fleet's scale-up: the run's first launch asks for the environments, which take requests once their
        instances run them."""
        return p.gpu_scale_up_s

    def billed_gb_seconds(self, seconds: float, memory_mb: int) -> float:
        """None: Lambda Managed Instances bill the instances, not the invocations' duration."""
        return 0.0

    def capacity_dollars(
        self, w: Workload, p: Parameters, price_table: PriceTable, seconds: float, endpoint_bytes: float
    ) -> dict[str, float]:
        """The instances at their on-demand price, the management fee on it, and the interface endpoints, over
        ``seconds``."""
        assert w.accelerator is not None
        hours = seconds / 3600
        ec2 = instances(w, price_table) * price_table.gpu_instances[w.accelerator.instance].dollars_per_hour * hours
        endpoint_hours = len(INTERFACE_ENDPOINTS) * ENDPOINT_AZS * hours
        return {
            "ec2": ec2,
            "managed_instances": ec2 * price_table.managed_instances_fee,
            "vpc_endpoints": endpoint_hours * price_table.vpc_endpoint_hour
            + endpoint_bytes / 1e9 * price_table.vpc_endpoint_gb,
        }

    def memory_choices(self, w: Workload) -> tuple[int, ...]:
        """Its own: its memory is the environment's, not what buys its compute."""
        return (w.memory_mb["worker"],)

    def figures(self, w: Workload, p: Parameters, price_table: PriceTable) -> WorkerFigures:
        """The instances, their price and fee, the throughput and the endpoints, each with its source."""
        a = w.accelerator
        assert a is not None
        kind = price_table.gpu_instances[a.instance]
        each, fleet = per_instance(a, price_table), instances(w, price_table)
        rate = 1 / seconds_per_sample(w, p)
        flops = train_flops(w, p)
        counted = (
            "counted by TensorFlow's cost analysis (slsml.cost.flops)"
            if w.train_flops_per_sample
            else f"estimated from its {w.params:,} weights as a ResNet-50-like network's"
            " (train_flops_per_param_sample; --model counts them)"
        )
        gpus = f"{kind.gpus} GPU{'s' if kind.gpus > 1 else ''}"
        return WorkerFigures(
            kind=self.name,
            compute=f"{a.gib} GiB of a {kind.card} ({kind.gpu_memory_gib} GiB) on {a.instance}, {a.precision}:"
            f" {rate:,.4g} samples/s on this model",
            billing=f"Lambda Managed Instances: {fleet} × {a.instance} held for the run at ${kind.dollars_per_hour:g}/h"
            f" on demand + {price_table.managed_instances_fee:.0%} management fee, requests; no GB-seconds;"
            f" {len(INTERFACE_ENDPOINTS)} interface endpoints × {ENDPOINT_AZS} AZs",
            facts=[
                Fact(
                    name="instance type",
                    value=f"{a.instance}: {kind.gpus} × {kind.card}, {kind.gpu_memory_gib} GiB each",
                    source=kind.source,
                ),
                *(
                    [Fact(name="card", value=f"{kind.card}: {sheet.described()}", source=sheet.source)]
                    if (sheet := datasheet(kind.card)) is not None
                    else []
                ),
                Fact(
                    name="environments per instance",
                    value=f"{each} ({gpus} × ⌊{kind.gpu_memory_gib} / {a.gib} GiB⌋)",
                    source="functions.worker.accelerator_gib: one environment's share of a GPU's memory",
                ),
                Fact(
                    name="instances",
                    value=f"{fleet}: ⌈{w.workers} workers / {each}⌉, at least the {LAUNCHED_INSTANCES} Lambda launches"
                    f" for AZ resiliency; held from the scale-up to the run's end and its {p.gpu_scale_down_s:g} s"
                    " scale-down tail",
                    source=f"the run sizes the fleet to its workers at its first launch and releases it at its end;"
                    f" {MANAGED_INSTANCES_SCALING}; the tail: {parameter_facts('gpu_scale_down_s')['source']}",
                ),
                Fact(
                    name="EC2 quota",
                    value=f"{fleet_vcpus(w)} vCPUs of running on-demand G instances; --quota ec2_g_vcpus=N checks them"
                    " against the account's (not Lambda's concurrency, which Managed Instances do not take)",
                    source="Service Quotas, Running On-Demand G and VT instances (`aws service-quotas"
                    " get-service-quota --service-code ec2 --quota-code L-DB2E81BA`)",
                ),
                Fact(name="on-demand price", value=f"${kind.dollars_per_hour:g} per instance-hour", source=kind.source),
                Fact(
                    name="management fee",
                    value=f"{price_table.managed_instances_fee:.0%} of the on-demand price",
                    source=LAMBDA_PRICING,
                ),
                Fact(
                    name="training FLOPs",
                    value=f"{flops / 1e9:,.4g} GFLOPs a sample (forward and backward)",
                    source=counted,
                ),
                Fact(
                    name="achieved fraction",
                    value=f"{a.fraction:.3g} of the card's {a.peak_tflops:g} TFLOPS {a.precision} peak:"
                    f" {a.fraction * a.peak_tflops:,.4g} TFLOPS",
                    source=a.source,
                ),
                Fact(
                    name="environment throughput",
                    value=f"{rate:,.4g} samples/s on this model: {flops / 1e9:,.4g} GFLOPs ÷"
                    f" ({a.peak_tflops:g} TFLOPS × {a.environment_fraction:.3g}, {a.gib} of the card's"
                    f" {kind.gpu_memory_gib} GiB)",
                    source="assumed: a share of a GPU's memory gets that share of its compute, and no more than it"
                    " measured alone with that memory",
                ),
                Fact(
                    name="S3 rate",
                    value=f"{S3_CONNECTION_MB_S:g} MB/s a connection, within the instance's"
                    f" {NETWORK_GBPS[a.instance]:g} Gbps shared by its {each} environment{'s' if each > 1 else ''}:"
                    f" {s3_mb_s(w, p.s3_parallel_reads):,.0f} MB/s over {p.s3_parallel_reads:g} GETs (weights,"
                    f" samples), {update_writes(w, p)}",
                    source=f"{S3_PERFORMANCE}; network: {EC2_NETWORK} ('up to': the burst of a 16-vCPU-or-smaller"
                    " instance, which an iteration's reads and writes averaged under its baseline keep)",
                ),
                Fact(
                    name="micro-batch",
                    value=f"the most samples whose step fits {a.gib} GiB: {DEVICE_SAMPLE_SHARE[a.precision]:g} of a"
                    f" sample's layer outputs ({w.activation_bytes_per_sample / 1e6:,.0f} MB float32) and"
                    f" {DEVICE_MODEL_COPIES:g} model-sized buffers on the GPU",
                    source="slsml.rounds.sizing.AcceleratorMemory: device memory peaks of ResNet-50 measured by"
                    " `slsml bench gpu` (docs/benchmarks.md#gpu); the worker sizes its micro-batches with it",
                ),
                Fact(
                    name="scale-up",
                    value=f"{p.gpu_scale_up_s:g} s before the first iteration, billed",
                    source=parameter_facts("gpu_scale_up_s")["source"],
                ),
                Fact(
                    name="VPC endpoints",
                    value=f"interface {', '.join(INTERFACE_ENDPOINTS)} × {ENDPOINT_AZS} AZs at"
                    f" ${price_table.vpc_endpoint_hour:g}/AZ-hour (a run's whole hours)"
                    f" + ${price_table.vpc_endpoint_gb:g}/GB; gateway {', '.join(GATEWAY_ENDPOINTS)} free",
                    source=PRIVATELINK_PRICING,
                ),
            ],
        )


KIND = GpuWorker()


def deployed(w: Workload, p: Parameters, price_table: PriceTable, limits: RunLimits | None) -> Workload:
    """``w`` on the workers of the deployment of run ``limits``: GPU workers of its ``worker_accelerator_gib`` on the
    cheapest of its instance types whose card's peak is published (the fraction of it achieved from the calibration at
    ``CALIBRATION_FILE`` where it measured that card), else ``w`` itself (CPU workers). BadInputError where none of
    its types can be priced."""
    if limits is None or limits.worker_accelerator_gib is None:
        return w
    calibration = load_calibration(CALIBRATION_FILE) if CALIBRATION_FILE.exists() else None
    types = limits.worker_instance_types or GPU_WORKER_DEFAULTS["instance_types"]
    gib = limits.worker_accelerator_gib
    return w.at(accelerator=accelerator(gib, w, p, price_table, calibration, str(CALIBRATION_FILE), types))


def measured(w: Workload, p: Parameters, compute_per_sample_s: float, limits: RunLimits) -> Workload:
    """``w`` on the GPU workers of the deployment of run ``limits`` (it has them), at the throughput its workers
    measured: ``compute_per_sample_s`` on one environment, on the first of its instance types, as a fraction of its
    card's peak (its float32 peak where the card has none in the run's precision)."""
    gib = limits.worker_accelerator_gib
    assert gib is not None
    instance = (limits.worker_instance_types or GPU_WORKER_DEFAULTS["instance_types"])[0]
    sheet = datasheet(GPU_INSTANCES[instance].card)
    assert sheet is not None  # every GPU instance type's card has one (tests/unit/test_cost_gpu.py)
    peak = sheet.tflops(precision(w)) or sheet.float32_peak
    environment = train_flops(w, p) / (max(compute_per_sample_s, 1e-9) * peak * 1e12)
    a = Accelerator(
        gib=gib,
        instance=instance,
        precision=precision(w),
        peak_tflops=peak,
        fraction=environment * GPU_INSTANCES[instance].gpu_memory_gib / gib,
        environment_fraction=environment,
        source="measured: the run's workers' compute per sample",
    )
    return w.at(accelerator=a)


def _fleet_dollars_per_sample(w: Workload, p: Parameters, price_table: PriceTable) -> float:
    """The fleet's $/h per sample/s of one worker: how ``accelerator`` ranks instance types."""
    assert w.accelerator is not None
    return (
        instances(w, price_table)
        * price_table.gpu_instances[w.accelerator.instance].dollars_per_hour
        * (seconds_per_sample(w, p))
    )
