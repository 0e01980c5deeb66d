"""The limits an operator sets once on every run of a deployment (CDK context ``run_limits``, ``slsml local up
--limit-*``): handed to the functions in their environment (``slsml.spec.wiring.RUN_LIMITS_ENV``) and to the CLI
as a stack output, and enforced by the pipeline whatever started a run."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from slsml.spec.config import DropInRequest, TrainingSpec
from slsml.spec.deployment import DEFAULT_FUNCTIONS, STAGE_FUNCTIONS


class RunLimits(BaseModel):
    """What an operator allows any one run of a deployment: its workers (the most it may ever train with,
    ``run scale`` and ``--workers auto`` included), reducers, iterations and run time; and the shortest deadline,
    the timeouts of the functions its stages wait on (``deployment.STAGE_FUNCTIONS``), which the deployment fills
    in from its functions' settings. Set once per deployment (CDK context ``run_limits``, ``slsml local up
    --limit-*``), handed to the functions in their environment (``wiring.RUN_LIMITS_ENV``) and enforced by the
    pipeline whatever started the run: a run asking beyond a limit is FAILED before any of its work is launched,
    with a reason naming the limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(default=256, ge=1, description="the most workers a run may train with")
    reducers: int = Field(default=64, ge=1, description="the most reducers a run may have")
    iterations: int = Field(default=100_000, ge=1, description="the most iterations a run may ask for")
    time_budget_s: int = Field(
        default=7 * 24 * 3600, ge=1, description="the longest time budget (seconds) a run may ask for"
    )
    function_timeouts_s: dict[str, int] = Field(
        default_factory=lambda: {name: DEFAULT_FUNCTIONS[name].timeout_s for name in STAGE_FUNCTIONS},
        description="the deployment's timeouts of the functions a stage waits on: a run's deadline may not be"
        " shorter, or the watchdog would re-launch a step that still runs, and its work would be done again",
    )

    worker_memory_mb: int = Field(
        default=DEFAULT_FUNCTIONS["worker"].memory_mb,
        ge=128,
        description="the deployment's worker memory, which a run's micro-batches must fit (one sample at least)",
    )

    worker_accelerator_gib: int | None = Field(
        default=None,
        gt=0,
        description="the deployment's GPU memory per worker (functions.worker.accelerator_gib; None: CPU workers),"
        " which a GPU worker's micro-batches fit and the plan, the budget check and the tuner price",
    )
    worker_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="the most Worker invocations that run at once (functions.worker.reserved_concurrency; locally,"
        " its warm processes), which a run's workers times its pipeline stages must keep within (None: unbounded)",
    )
    worker_instance_types: tuple[str, ...] = Field(
        default=(),
        description="the EC2 instance types a GPU worker's fleet may run on (functions.worker.instance_types)",
    )

    def with_worker_concurrency(self, concurrency: int | None) -> RunLimits:
        """These limits with the most Worker invocations the deployment runs at once (None: unbounded)."""
        return self.model_copy(update={"worker_concurrency": concurrency})

    def with_worker_memory(self, memory_mb: int) -> RunLimits:
        """These limits with the deployment's worker memory ``memory_mb``."""
        return self.model_copy(update={"worker_memory_mb": memory_mb})

    def with_worker_accelerator(self, accelerator_gib: int | None, instance_types: tuple[str, ...] = ()) -> RunLimits:
        """These limits with the deployment's worker accelerator: ``accelerator_gib`` of GPU memory on one of
        ``instance_types`` (None: CPU workers)."""
        types = instance_types if accelerator_gib is not None else ()
        return self.model_copy(update={"worker_accelerator_gib": accelerator_gib, "worker_instance_types": types})

    def with_timeouts(self, timeouts_s: dict[str, int]) -> RunLimits:
        """These limits with the timeouts ``timeouts_s`` names (function → s) of the functions a stage waits on."""
        stages = {name: timeout for name, timeout in timeouts_s.items() if name in STAGE_FUNCTIONS}
        return self.model_copy(update={"function_timeouts_s": {**self.function_timeouts_s, **stages}})

    def refusal(self, spec: TrainingSpec, workers: int | None = None) -> str | None:
        """Why the deployment refuses a run of ``spec`` (its iterations resolved) training with ``workers`` now
        (default: its first round's), or None. The workers a run asks for are the most it names (``max_workers``,
        which bounds ``run scale`` and ``--workers auto``), else those it trains with."""
        asked = {
            "workers": spec.asked_workers(workers),
            "reducers": spec.reducers,
            "iterations": spec.iterations,
            "time_budget_s": spec.time_budget_s,
        }
        over = [
            f"{value} {_ASKED[name]}, over the deployment's limit {name}={getattr(self, name)}"
            for name, value in asked.items()
            if value > getattr(self, name)
        ]
        early = self.deadline_refusal(spec.deadline_s)
        reasons = ([f"the run asks for {'; '.join(over)}"] if over else []) + ([early] if early else [])
        staged = self.stages_refusal(spec, asked["workers"])
        return "; ".join(reasons + ([staged] if staged else [])) or None

    def stages_refusal(self, spec: TrainingSpec, workers: int) -> str | None:
        """Why ``workers`` workers in ``spec.pipeline_stages`` stages cannot run: a worker's stages wait on each other,
        so every one of them must run at once, within the Worker's concurrency (None: they can)."""
        stages = spec.pipeline_stages
        if stages == 1:
            return None
        if self.worker_accelerator_gib is not None:
            return f"--pipeline-stages {stages}: stages run on CPU workers, and this deployment's run on GPUs"
        if self.worker_concurrency is None or workers * stages <= self.worker_concurrency:
            return None
        return (
            f"--pipeline-stages {stages}: {workers} workers of {stages} stages are {workers * stages} Worker"
            f" invocations at once, and the deployment runs {self.worker_concurrency} (the Worker's reserved"
            " concurrency; locally, its warm processes): give fewer workers or stages (locally, or more warm processes:"
            " --pool, pool=, SLSML_POOL)"
        )

    def drop_in_defaults(self) -> DropInRequest:
        """What a model dropped under ``incoming/`` trains with on a deployment that names no run defaults (the local
        service): ``TrainingSpec``'s, with the shortest deadline these limits allow where the default one is shorter
        (a deployed stack refuses run defaults whose deadline is too short instead)."""
        default = TrainingSpec.model_fields["deadline_s"].default
        if self.deadline_refusal(default) is None:
            return DropInRequest()
        return DropInRequest(training={"deadline_s": max(self.function_timeouts_s.values())})

    def deadline_refusal(self, deadline_s: float) -> str | None:
        """Why a stage deadline of ``deadline_s`` is too short for the deployment's function timeouts, or None."""
        function, timeout = max(self.function_timeouts_s.items(), key=lambda item: item[1], default=("", 0))
        if deadline_s >= timeout:
            return None
        return (
            f"a deadline of {deadline_s:g} s (deadline_s, --deadline) is shorter than the {function} function's"
            f" {timeout} s timeout: the watchdog would re-launch {function} steps that may still run, doing their"
            f" work again; give a deadline of at least {timeout} s (or lower the deployment's"
            f" functions.{function}.timeout_s)"
        )


_ASKED = {"workers": "workers", "reducers": "reducers", "iterations": "iterations", "time_budget_s": "s of time budget"}
RUN_LIMITS_OUTPUT = "RunLimits"  # the stack output holding the deployment's RunLimits (JSON)
