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

Time: a worker computes its share at one environment's throughput. A card's throughput comes from a calibration of
that very card (``slsml bench gpu``), never from another card's, else from the published figures in ``PUBLISHED``,
each with its source, else from an estimate by the cards' datasheets (``DATASHEETS``, ``estimated``), labelled so.
An environment with a fraction of a GPU's memory gets that fraction of its throughput (the GPU's compute shared as
its memory is), and no more than it measured alone with that memory. A figure measured on
another model is carried over by the models' compute on one vCPU (``compute_per_sample_s`` against the measured
model's ``params × compute_s_per_param_sample``, a ResNet-50-like network's).

S3: an environment runs on an EC2 instance, not in Lambda's sandbox, so it reads and writes S3 as an instance does
(``s3_mb_s``): ``S3_CONNECTION_MB_S`` a connection, as many connections as the worker keeps busy (16 GETs of the
weights or the samples; its update's parts, ``storage.PARALLEL_PARTS`` at once, or one PUT of an update under
``storage.MULTIPART_BYTES``), within its share of the instance's network (``NETWORK_GBPS``, the instance's
environments sharing it), not Lambda's 65 MB/s a function (``s3_read_mb_s``)."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from slsml.accounting.prices import LAMBDA_PRICING, PRIVATELINK_PRICING, GpuInstance, PriceTable
from slsml.aws.storage import PARALLEL_PARTS, upload_parts
from slsml.cost.calibration import CALIBRATION_FILE, GpuCalibration, Precision, card_key, load_calibration
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
RESNET50_PARAMS = 25_636_712  # Keras's ResNet50: 102,546,848 B of float32 weights (Parameters.keras_file_overhead)
LAMBDA_BENCHMARK = "https://github.com/lambdal/deeplearning-benchmark/blob/master/pytorch/pytorch-train-throughput"


class Published(BaseModel):
    """A card's published ResNet-50 training throughput in one precision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    card: str
    precision: Precision
    samples_per_s: float
    source: str


class Datasheet(BaseModel):
    """A card's figures as its maker publishes them: dense float32 and float16 tensor throughput, memory and its
    bandwidth."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    card: str
    float32_tflops: float
    tensor_tflops: float = Field(description="float16 on the tensor cores, dense (without sparsity)")
    memory_gib: int
    memory_gb_s: float
    source: str

    def tflops(self, mode: Precision) -> float:
        """Its throughput in ``mode``: float32's, or the tensor cores' for mixed float16."""
        return self.float32_tflops if mode == "float32" else self.tensor_tflops

    def described(self) -> str:
        """Its figures, in words."""
        return (
            f"{self.float32_tflops:g} TFLOPS float32, {self.tensor_tflops:g} TFLOPS float16 tensor (dense),"
            f" {self.memory_gib} GB at {self.memory_gb_s:g} GB/s"
        )


_A10G = (
    "Lambda's GPU benchmark, ResNet-50 training (PyTorch) on an A10, {csv}; the A10G is AWS's variant of the A10"
    " (GA102, 24 GB), assumed as fast"
)
PUBLISHED = (
    Published(
        card="NVIDIA A10G",
        precision="float32",
        samples_per_s=349,
        source=_A10G.format(csv=f"{LAMBDA_BENCHMARK}-fp32.csv"),
    ),
    Published(
        card="NVIDIA A10G",
        precision="mixed_float16",
        samples_per_s=638,
        source=_A10G.format(csv=f"{LAMBDA_BENCHMARK}-fp16.csv"),
    ),
)
DATASHEETS = (
    Datasheet(
        card="NVIDIA A10G",
        float32_tflops=31.2,
        tensor_tflops=125,
        memory_gib=24,
        memory_gb_s=600,
        source="NVIDIA A10 datasheet, https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (the A10G: AWS's"
        " variant, assumed alike)",
    ),
    Datasheet(
        card="NVIDIA L4",
        float32_tflops=30.3,
        tensor_tflops=121,
        memory_gib=24,
        memory_gb_s=300,
        source="NVIDIA L4 datasheet, https://www.nvidia.com/en-us/data-center/l4/",
    ),
)
MEASURE = "measure it: `slsml bench gpu` on a {instance}, then --gpu-calibration FILE"


def datasheet(card: str) -> Datasheet | None:
    """The published figures of ``card``; None where slsml has none."""
    return next((sheet for sheet in DATASHEETS if card_key(sheet.card) == card_key(card)), None)


def estimated(card: str, mode: Precision, instance: str) -> Published | None:
    """An estimate of ``card``'s ResNet-50 training throughput in ``mode`` where none is published: a published
    card's figure times the lower of the two cards' published ratios of throughput in that precision and of memory
    bandwidth (what bounds a training step: its arithmetic or its memory traffic). None: no datasheet to scale by."""
    sheet = datasheet(card)
    if sheet is None:
        return None
    for figure in PUBLISHED:
        known = datasheet(figure.card)
        if figure.precision != mode or known is None or known is sheet:
            continue
        compute, bandwidth = sheet.tflops(mode) / known.tflops(mode), sheet.memory_gb_s / known.memory_gb_s
        return Published(
            card=card,
            precision=mode,
            samples_per_s=figure.samples_per_s * min(compute, bandwidth),
            source=f"estimate: the {figure.card}'s {figure.samples_per_s:g} samples/s × {min(compute, bandwidth):.3g},"
            f" the lower of the {'float32' if mode == 'float32' else 'float16 tensor'} throughput ratio"
            f" ({compute:.3g}) and the memory bandwidth ratio ({bandwidth:.3g}) of the datasheets ({sheet.source};"
            f" {known.source}); its ResNet-50 figure: {figure.source}; {MEASURE.format(instance=instance)}",
        )
    return None


def precision(w: Workload) -> Precision:
    """What the workers compute in: the run's mixed-precision policy, else float32."""
    return w.training.mixed_precision or "float32"


def _throughput(
    name: str,
    instance: GpuInstance,
    gib: int,
    mode: Precision,
    calibration: GpuCalibration | None,
    calibration_name: str,
) -> tuple[float, float, bool, str] | None:
    """(one environment's, the whole card's throughput, whether the calibration measured them, their source) of
    the card of ``instance`` (type ``name``) in ``mode``: a calibration of that card, else its published figure, else
    an estimate from its datasheet (``estimated``); None where there is none of these."""
    share = gib / instance.gpu_memory_gib
    if calibration is not None and calibration.measures(instance.card):
        card = calibration.card_samples_per_s(mode)
        if card is not None:
            alone = calibration.samples_per_s(gib, mode)
            environment = min(card * share, alone) if alone is not None else card * share
            source = (
                f"calibration {calibration_name}: {calibration.model} on {calibration.card}, {mode}, measured"
                f" {calibration.measured_at}"
            )
            return environment, card, True, source
    for figure in PUBLISHED:
        if card_key(figure.card) == card_key(instance.card) and figure.precision == mode:
            return figure.samples_per_s * share, figure.samples_per_s, False, figure.source
    estimate = estimated(instance.card, mode, name)
    if estimate is not None:
        return estimate.samples_per_s * share, estimate.samples_per_s, False, estimate.source
    return None


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
        kind = types[name]
        found = _throughput(name, kind, gib, mode, calibration, calibration_name)
        if found is None:
            continue
        environment, card, measured, source = found
        measured_params = calibration.params if measured and calibration is not None else RESNET50_PARAMS
        candidate = Accelerator(
            gib=gib,
            instance=name,
            precision=mode,
            samples_per_s=environment,
            card_samples_per_s=card,
            measured_params=None if measured_params == w.params else measured_params,  # the same model: as measured
            source=source,
        )
        choices.append((_fleet_dollars_per_sample(w.at(accelerator=candidate), p, price_table), candidate))
    if not choices:
        cards = sorted({types[name].card for name in instance_types})
        published = sorted({f.card for f in PUBLISHED if f.precision == mode} | {d.card for d in DATASHEETS})
        raise BadInputError(
            f"--accelerator worker={gib} on {', '.join(instance_types)}: no {mode} throughput is known of"
            f" {' or '.join(cards)} (published or estimated: {', '.join(published)});"
            f" {MEASURE.format(instance=instance_types[0])}"
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
    """One environment's seconds per sample of the workload's model: the measured throughput, carried over to this
    model by the two models' compute on one vCPU where another model was measured."""
    a = w.accelerator
    assert a is not None
    if a.measured_params is None:
        return 1 / a.samples_per_s
    return w.compute_per_sample_s / (a.samples_per_s * a.measured_params * p.compute_s_per_param_sample)


def machine(w: Workload, p: Parameters, price_table: PriceTable) -> tuple[float, float, str, str]:
    """One machine of the workers' instance type training alone: (samples/s on the workload's model, its on-demand
    $/h, its name, the figures' sources), every GPU of it at the throughput the plan uses."""
    a = w.accelerator
    assert a is not None
    kind = price_table.gpu_instances[a.instance]
    rate = kind.gpus * a.card_samples_per_s / a.samples_per_s / seconds_per_sample(w, p)
    return rate, kind.dollars_per_hour, a.instance, f"throughput: {a.source}; price: {kind.source}"


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
        if a.measured_params is None:
            carried = "this very model was measured"
        else:
            measured_s = a.measured_params * p.compute_s_per_param_sample
            carried = (
                f"× {measured_s / w.compute_per_sample_s:.3g}: the measured model's {measured_s:.3g} s a sample on one"
                f" vCPU ({a.measured_params:,} weights × compute_s_per_param_sample) over this one's"
                f" {w.compute_per_sample_s:.3g} s"
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
                    name="card throughput",
                    value=f"{a.card_samples_per_s:,.4g} samples/s, {a.precision}",
                    source=a.source,
                ),
                Fact(
                    name="environment throughput",
                    value=f"{rate:,.4g} samples/s on this model: {a.samples_per_s:,.4g} on the measured one"
                    f" ({a.gib} of the card's {kind.gpu_memory_gib} GiB), {carried}",
                    source="assumed: a share of a GPU's memory gets that share of its compute; a model's GPU time"
                    " scales as its time on one vCPU",
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
    cheapest of its instance types whose throughput is known (the calibration at ``CALIBRATION_FILE`` where there is
    one), else ``w`` itself (CPU workers). BadInputError where none of its types can be priced."""
    if limits is None or limits.worker_accelerator_gib is None:
        return w
    calibration = load_calibration(CALIBRATION_FILE) if CALIBRATION_FILE.exists() else None
    types = limits.worker_instance_types or GPU_WORKER_DEFAULTS["instance_types"]
    gib = limits.worker_accelerator_gib
    return w.at(accelerator=accelerator(gib, w, p, price_table, calibration, str(CALIBRATION_FILE), types))


def measured(w: Workload, compute_per_sample_s: float, limits: RunLimits) -> Workload:
    """``w`` on the GPU workers of the deployment of run ``limits`` (it has them), at the throughput its workers
    measured: ``compute_per_sample_s`` on one environment, on the first of its instance types."""
    gib = limits.worker_accelerator_gib
    assert gib is not None
    instance = (limits.worker_instance_types or GPU_WORKER_DEFAULTS["instance_types"])[0]
    rate = 1 / max(compute_per_sample_s, 1e-9)
    a = Accelerator(
        gib=gib,
        instance=instance,
        precision=precision(w),
        samples_per_s=rate,
        card_samples_per_s=rate * GPU_INSTANCES[instance].gpu_memory_gib / gib,
        measured_params=None,
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
