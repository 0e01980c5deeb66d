"""What a kind of worker tells the cost model (``WorkerKind``): how long its compute takes, how its time is billed,
what it adds to the first iteration, and the figures it rests on with their sources. The kinds are registered in
``slsml.cost.workers``; ``predict`` asks the workload's kind."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from slsml.accounting.prices import PriceTable
from slsml.cost.parameters import Parameters
from slsml.cost.workload import Workload


class Fact(BaseModel):
    """One figure of a worker kind, with where it comes from."""

    name: str
    value: str = Field(description="the figure, in words with its unit")
    source: str


class WorkerFigures(BaseModel):
    """What the plan's workers are and how they are billed."""

    kind: str
    compute: str = Field(description="where a worker computes its share, and how fast")
    billing: str = Field(description="what its time costs")
    facts: list[Fact] = Field(default_factory=list, description="the figures beyond the model's parameters")


class WorkerKind(Protocol):
    """A kind of worker: one module, registered in ``slsml.cost.workers``."""

    name: str

    def compute_s(self, w: Workload, p: Parameters, samples: int) -> float:
        """Seconds one worker takes to compute the gradients of ``samples`` samples."""
        ...

    def compute_detail(self, w: Workload) -> str:
        """Where the Worker stage's compute runs, in words (appended to it; empty: nothing to add)."""
        ...

    def cold_start_s(self, w: Workload, p: Parameters) -> float:
        """What a worker adds to the first iteration's path before it runs."""
        ...

    def billed_gb_seconds(self, seconds: float, memory_mb: int) -> float:
        """The GB-seconds Lambda bills for one invocation of ``seconds`` (0: not billed by duration)."""
        ...

    def capacity_dollars(
        self, w: Workload, p: Parameters, price_table: PriceTable, seconds: float, endpoint_bytes: float
    ) -> dict[str, float]:
        """What the workers' capacity bills, by line, over ``seconds`` of the run in which its interface endpoints
        carry ``endpoint_bytes`` (none: billed per invocation only)."""
        ...

    def memory_choices(self, w: Workload) -> tuple[int, ...]:
        """The worker memory sizes a recommendation may choose from."""
        ...

    def figures(self, w: Workload, p: Parameters, price_table: PriceTable) -> WorkerFigures:
        """The kind's figures for the plan, each with its source."""
        ...
