"""The CPU worker: TensorFlow on the vCPU share Lambda gives a function of its memory, billed by the GB-second of
each invocation and per request."""

from __future__ import annotations

from slsml.accounting import prices
from slsml.accounting.prices import PriceTable
from slsml.cost.parameters import Parameters
from slsml.cost.timing import speedup, vcpus
from slsml.cost.workerkind import WorkerFigures
from slsml.cost.workload import MEMORY_CHOICES_MB, Workload


class CpuWorker:
    """A worker on Lambda's CPUs."""

    name = "cpu"

    def compute_s(self, w: Workload, p: Parameters, samples: int) -> float:
        """``samples`` samples' gradients at the workload's seconds per sample on one vCPU, sped up by the worker's
        vCPUs as TensorFlow uses them (``vcpu_efficiency``)."""
        return samples * w.compute_per_sample_s / speedup(vcpus(w.memory_mb["worker"]), p.vcpu_efficiency)

    def compute_detail(self, w: Workload) -> str:
        """Nothing to add: a CPU worker's compute is the Worker's own."""
        return ""

    def cold_start_s(self, w: Workload, p: Parameters) -> float:
        """The TensorFlow image's cold start."""
        return p.cold_start_image_s

    def billed_gb_seconds(self, seconds: float, memory_mb: int) -> float:
        """Lambda's duration charge: GB-seconds, each invocation rounded up to the millisecond."""
        return prices.gb_seconds(seconds, memory_mb)

    def capacity_dollars(
        self, w: Workload, p: Parameters, price_table: PriceTable, seconds: float, endpoint_bytes: float
    ) -> dict[str, float]:
        """None: a CPU worker is billed per invocation (its GB-seconds and requests)."""
        return {}

    def memory_choices(self, w: Workload) -> tuple[int, ...]:
        """Lambda's usual memory sizes."""
        return MEMORY_CHOICES_MB

    def figures(self, w: Workload, p: Parameters, price_table: PriceTable) -> WorkerFigures:
        """The worker's vCPUs and what TensorFlow makes of them."""
        memory = w.memory_mb["worker"]
        cpus = vcpus(memory)
        return WorkerFigures(
            kind=self.name,
            compute=f"{cpus:.3g} vCPUs of a {memory:,} MB function (Lambda's share of its memory): TensorFlow"
            f" {speedup(cpus, p.vcpu_efficiency):.3g}× one vCPU (vcpu_efficiency)",
            billing=f"Lambda: ${price_table.lambda_gb_second * 1e6:.4g} per million GB-seconds of each invocation"
            f" and ${price_table.lambda_request * 1e6:.2f} per million requests",
        )


KIND = CpuWorker()
