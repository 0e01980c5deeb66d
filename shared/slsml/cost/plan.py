"""The plan of one configuration, as ``predict`` answers it: stages, functions, requests, units, dollars, the first
iteration and the quota checks; and the sentences that sum it up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from slsml.cost.chain import ExtraCall
from slsml.cost.datatraffic import DataTraffic
from slsml.cost.proofs import ProofCost
from slsml.cost.workerkind import WorkerFigures
from slsml.cost.workerround import Continuations
from slsml.cost.workload import Workload


class Stage(BaseModel):
    """One stage of an iteration's critical path."""

    name: str
    function: str | None = Field(description="the function that runs it; None for a hop between functions")
    seconds: float
    detail: str


class FunctionFigures(BaseModel):
    """One function's share of an iteration."""

    function: str
    invocations: int
    memory_mb: int
    seconds: float = Field(description="the invocation on the critical path")
    gb_seconds: float = Field(description="all invocations of one iteration")
    bytes_read: int = Field(description="S3, the invocation on the critical path")
    bytes_written: int
    bytes_read_total: int = Field(description="S3, all invocations of one iteration")
    bytes_written_total: int
    memory_needed_mb: float


class QuotaCheck(BaseModel):
    """One quota against what the configuration asks of it."""

    name: str
    value: float
    limit: float
    unit: str
    ok: bool
    hard: bool = Field(
        description="the run cannot work at all (the plan refuses it, but for memory: it answers, naming the memory"
        " to give); else it is slowed or throttled"
    )
    detail: str

    @property
    def utilization(self) -> float:
        return self.value / self.limit


class FirstIteration(BaseModel):
    """What the first iteration (cold containers) adds on top of a steady one."""

    extra_s: float
    extra_requests: dict[str, int]
    extra_dollars: float
    detail: str


class GoingOn(BaseModel):
    """``stale_weights``: a worker's invocation goes on to its next round once the model that round enters is merged,
    while it has ``GO_ON_ROUNDS`` rounds' time left (``slsml.pipeline.steps.worker.going_on``); the round after the
    last it can compute is launched as its iteration's reduce fires."""

    period_s: float = Field(
        description="a round that follows the worker's round before in its invocation: the Worker's time less its"
        " invocation's start, the round before's update stored and announced (as this one computes) and its first"
        " micro-batch's read (as the round before's last computed), plus the merged model's HeadObject, the run's"
        " read and the round's take (DynamoDB)"
    )
    reported_s: float = Field(
        description="from a round's compute to its report at the ReduceLauncher: its update stored, WorkDone"
        " published and delivered"
    )
    rounds: int = Field(description="rounds one invocation computes: its first, and those it goes on to")


class Plan(BaseModel):
    """What one configuration takes: an iteration's requests, units, stages, functions and dollars, the first
    iteration, the quotas, and the figures they rest on."""

    workload: Workload
    participants: int
    state_slots: int
    requests_per_iteration: dict[str, int] = Field(description="by service:Operation, as botocore names them")
    minimum_requests_per_iteration: dict[str, int] = Field(description="the minimum chain, by service:Operation")
    extra_calls: list[ExtraCall] = Field(description="the chain's calls beyond the minimum")
    read_units: float
    write_units: float
    sns_billed_publishes: int
    stages: list[Stage]
    functions: list[FunctionFigures]
    chain_s: float = Field(description="the critical path of one iteration")
    floor_s: float = Field(description="the iteration counter item's writes at the partition's write rate")
    overlap_s: float | None = Field(
        default=None,
        description="stale_weights: an iteration's mean period, each worker's next round computed as soon as its round"
        " before has reported and the model the round enters is merged (slsml.cost.predict.overlapped); None: each"
        " round waits for the chain",
    )
    going_on: GoingOn | None = Field(
        default=None, description="stale_weights: the rounds a worker's invocation goes on to (None: each is launched)"
    )
    iteration_s: float
    epoch_s: float | None
    run_s: float
    dollars_per_iteration: dict[str, float]
    first_iteration: FirstIteration
    quotas: list[QuotaCheck]
    parameters: dict[str, dict[str, Any]]
    data: DataTraffic | None = Field(
        default=None, description="the workers' data reads (with --samples and the sample's bytes)"
    )
    micro_batch: int = Field(
        description="a worker's micro-batch, at most its share of a batch: --micro-batch, else the most samples that"
        " fit its memory (slsml.rounds.sizing; 1 where not one does); a step's micro-batches are as even as can be"
    )
    micro_batches: int = Field(description="micro-batches of a worker's step, their gradients added up")
    continuations: Continuations = Field(description="a round that outlasts the Worker's timeout, handed on")
    worker: WorkerFigures = Field(description="the workers' kind (slsml.cost.workers): where they compute, their bill")
    proofs: ProofCost = Field(description="the proofs of the run's messages: KMS requests a run, time a hop")

    @property
    def iteration_dollars(self) -> float:
        return sum(self.dollars_per_iteration.values())

    @property
    def epoch_dollars(self) -> float | None:
        per_epoch = self.workload.iterations_per_epoch
        return None if per_epoch is None else per_epoch * self.iteration_dollars

    @property
    def run_dollars(self) -> float:
        return self.workload.iterations * self.iteration_dollars + self.first_iteration.extra_dollars

    @property
    def requests_ratio(self) -> float:
        """Requests per iteration over those of the minimum chain."""
        return sum(self.requests_per_iteration.values()) / sum(self.minimum_requests_per_iteration.values())

    @property
    def violations(self) -> list[QuotaCheck]:
        return [q for q in self.quotas if not q.ok]

    @property
    def binding(self) -> QuotaCheck:
        """The quota closest to (or furthest past) its limit: the first to bind as load grows (the package sizes,
        which the configuration does not change, only when they are exceeded)."""
        return max((q for q in self.quotas if q.name not in STATIC_QUOTAS or not q.ok), key=lambda q: q.utilization)

    def summary(self) -> dict[str, Any]:
        """The plan as one JSON-ready object."""
        out = self.model_dump(mode="json")
        out["iterations_per_epoch"] = self.workload.iterations_per_epoch
        out["dollars"] = {"iteration": self.iteration_dollars, "epoch": self.epoch_dollars, "run": self.run_dollars}
        for check, row in zip(self.quotas, out["quotas"], strict=True):
            row["utilization"] = check.utilization
        out["binding"] = binding_sentence(self)
        out["requests_ratio"] = self.requests_ratio
        return out


STATIC_QUOTAS = ("zip package", "container image")  # the deployment's, whatever the configuration
MEMORY_QUOTAS = ("memory: worker", "memory: reducer", "memory: merger")  # answered, naming the memory to give


def with_origin(plan: Plan, origin: Mapping[str, str]) -> Plan:
    """The plan with overridden parameters' sources naming where their values came from."""
    for name, where in origin.items():
        plan.parameters[name]["source"] = where
    return plan


def binding_sentence(plan: Plan) -> str:
    """The quota that binds first, its use and headroom, in words."""
    q = plan.binding
    share = q.utilization
    head = f"{q.name} binds first: {q.value:,.4g} of {q.limit:,.4g} {q.unit} ({share:.0%})"
    if share > 1:
        return f"{head}, over by {q.value - q.limit:,.4g} {q.unit}. {q.detail}"
    return f"{head}: {1 / share:.2g}× headroom. {q.detail}"


def minimum_sentence(plan: Plan) -> str:
    """The requests of an iteration against the minimum chain's, in words."""
    total, minimum = sum(plan.requests_per_iteration.values()), sum(plan.minimum_requests_per_iteration.values())
    return f"requests: {total:,} per iteration, {minimum:,} in the minimum chain ({plan.requests_ratio:.2f}×)"
