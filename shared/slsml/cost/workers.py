"""The kinds of worker the cost model knows, by name (``Workload.worker_kind``): a kind is one module
(``WorkerKind``) and a line here."""

from __future__ import annotations

from slsml.cost import cpuworker, gpuworker
from slsml.cost.workerkind import WorkerKind
from slsml.cost.workload import Workload

KINDS: dict[str, WorkerKind] = {kind.name: kind for kind in (cpuworker.KIND, gpuworker.KIND)}


def kind_of(w: Workload) -> WorkerKind:
    """The kind of the workload's workers."""
    return KINDS[w.worker_kind]
