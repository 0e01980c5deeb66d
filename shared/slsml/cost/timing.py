"""Lambda's CPU share of a function's memory, and the time to move bytes in requests: the arithmetic every stage of
the cost model shares."""

from __future__ import annotations

import math

VCPU_MB = 1769  # one vCPU; Lambda allocates CPU in proportion to memory, 6 vCPUs at 10,240 MB


def vcpus(memory_mb: float) -> float:
    """Lambda's CPU share: in proportion to memory, 1 vCPU at 1,769 MB, 6 at 10,240 MB."""
    if memory_mb <= VCPU_MB:
        return memory_mb / VCPU_MB
    return 1 + (memory_mb - VCPU_MB) * 5 / (10240 - VCPU_MB)


def speedup(cpus: float, efficiency: float) -> float:
    """How many times faster than one vCPU TensorFlow runs on ``cpus``."""
    return cpus if cpus <= 1 else 1 + (cpus - 1) * efficiency


def units(item_bytes: float, unit_bytes: int) -> int:
    """DynamoDB's capacity units of one item: one per started ``unit_bytes``, one at least."""
    return max(1, math.ceil(item_bytes / unit_bytes))


def transfer(requests: float, size: float, latency: float, mb_s: float, parallel: float = 1) -> float:
    """Seconds to move ``size`` bytes in ``requests`` requests, ``parallel`` at a time."""
    return math.ceil(requests / max(1, parallel)) * latency + size / (mb_s * 1e6)
