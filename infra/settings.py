"""Deployment settings: CDK context (cdk.json, ``cdk deploy -c key=value``) over the defaults here
(function sizes: ``slsml.spec.deployment.DEFAULT_FUNCTIONS``, which ``slsml plan`` reads too).

Per-function overrides merge over the function's defaults, e.g. in cdk.json
``"functions": {"worker": {"memory_mb": 4096, "reserved_concurrency": 50}}`` (``null`` reserves none);
the limits of every run, e.g. ``"run_limits": {"workers": 64, "iterations": 5000}`` (the shortest deadline a run may
have is the Worker's and the Reducer's timeout, ``functions.<name>.timeout_s``). A GPU worker on Lambda Managed
Instances: ``"functions": {"worker": {"accelerator_gib": 24}}``, its fleet's other settings defaulting to
``deployment.GPU_WORKER_DEFAULTS`` (docs/deploy.md, "GPU workers").
"""

from __future__ import annotations

import json
from typing import Any, Literal

from aws_cdk import RemovalPolicy
from aws_cdk import aws_logs as logs
from constructs import Node
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from slsml.spec import wiring
from slsml.spec.config import DropInRequest, TrainingSpec
from slsml.spec.deployment import (
    ACCOUNT_CONCURRENCY,
    DAY_S,
    DEFAULT_FUNCTIONS,
    GPU_WORKER_DEFAULTS,
    SCRATCH_EXPIRY_DAYS,
    TRANSIENT_USE_MAX_S,
    UNRESERVED_MINIMUM,
    FunctionSettings,
    check_gpu_function,
)
from slsml.spec.limits import RunLimits

GPU_FUNCTION = "worker"  # the one step that may run on GPU instances (``functions.worker.accelerator_gib``)


class Settings(BaseModel):
    """Everything a deployment may tune; each field is a CDK context key of the same name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stack_name: str = Field(default="Slsml", pattern=r"^[A-Za-z][A-Za-z0-9-]{0,100}$")
    removal_policy: Literal["retain", "destroy"] = "retain"
    bucket_versioning: bool = False
    # transient scratch only (updates, means, evaluation states): carried state is never expired by a rule
    scratch_expiry_days: int = SCRATCH_EXPIRY_DAYS
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    # Tests only: ship layers/common as is instead of pip-installing the layer (fast, not deployable).
    skip_layer_build: bool = False
    functions: dict[str, FunctionSettings] = Field(default_factory=dict, validate_default=True)
    # what a model dropped under incoming/ trains with, e.g. {"dataset": "digits", "training": {"iterations": 300}}
    run_defaults: DropInRequest = DropInRequest()
    # what any one run may ask for: workers, reducers, iterations, time budget (slsml.spec.limits.RunLimits)
    run_limits: RunLimits = RunLimits()
    # the account's Lambda concurrency quota in the stack's region: the functions' reservations must leave
    # AWS's unreserved minimum of it
    account_concurrency: int = Field(default=ACCOUNT_CONCURRENCY, ge=UNRESERVED_MINIMUM)

    @field_validator("run_defaults", "run_limits", mode="before")
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("run_limits", mode="after")
    @classmethod
    def _timeouts_from_functions(cls, limits: RunLimits) -> RunLimits:
        if "function_timeouts_s" in limits.model_fields_set:
            raise ValueError("run_limits take the functions' timeouts from functions.<name>.timeout_s: leave them out")
        if "worker_memory_mb" in limits.model_fields_set:
            raise ValueError("run_limits take the worker's memory from functions.worker.memory_mb: leave it out")
        return limits

    @field_validator("scratch_expiry_days")
    @classmethod
    def _outlive_transient_use(cls, days: int) -> int:
        if days * DAY_S <= TRANSIENT_USE_MAX_S:
            raise ValueError(
                f"{days} days: a run reads an iteration's updates for up to {TRANSIENT_USE_MAX_S // DAY_S}"
                " days ((staleness + 1) × heartbeat), so transient scratch must expire later than that"
            )
        return days

    @field_validator("functions", mode="before")
    @classmethod
    def _merge_function_defaults(cls, value: Any) -> dict[str, Any]:
        overrides = json.loads(value) if isinstance(value, str) else dict(value)
        unknown = set(overrides) - {fn.name for fn in wiring.FUNCTIONS}
        if unknown:
            raise ValueError(f"no pipeline function named {sorted(unknown)}")
        merged = {}
        for fn in wiring.FUNCTIONS:
            given = overrides.get(fn.name, {})
            defaults = DEFAULT_FUNCTIONS.get(fn.name, FunctionSettings()).model_dump()
            if given.get("accelerator_gib") is not None and fn.name == GPU_FUNCTION:
                defaults |= GPU_WORKER_DEFAULTS  # what a GPU worker is unless its context says otherwise
            merged[fn.name] = defaults | given
        return merged

    @field_validator("functions", mode="after")
    @classmethod
    def _gpu_worker_only(cls, functions: dict[str, FunctionSettings]) -> dict[str, FunctionSettings]:
        for name, function in functions.items():
            if function.gpu and name != GPU_FUNCTION:
                raise ValueError(
                    f"functions.{name}.accelerator_gib={function.accelerator_gib}: only the {GPU_FUNCTION} may run on"
                    " a GPU (Lambda Managed Instances); the other steps are CPU functions"
                )
            if function.gpu:
                check_gpu_function(function, f"functions.{name}")
        return functions

    @model_validator(mode="after")
    def _runs_fit_the_fleet(self) -> Settings:
        worker = self.functions[GPU_FUNCTION]
        cap = worker.max_environments
        if cap is not None and "workers" in self.run_limits.model_fields_set and self.run_limits.workers > cap:
            raise ValueError(
                f"run_limits.workers={self.run_limits.workers}: a GPU worker's fleet has at most"
                f" functions.{GPU_FUNCTION}.max_environments={cap} execution environments, one worker each; lower"
                " the one or raise the other"
            )
        return self

    @model_validator(mode="after")
    def _reservations_fit(self) -> Settings:
        reserved = sum(f.reserved_concurrency or 0 for f in self.functions.values())
        if reserved > self.account_concurrency - UNRESERVED_MINIMUM:
            raise ValueError(
                f"the functions reserve {reserved} of the account's concurrency of {self.account_concurrency}:"
                f" AWS keeps {UNRESERVED_MINIMUM} unreserved (for the watchdog, the dead-letter reader and the"
                " launchers among others); lower functions.<name>.reserved_concurrency or raise account_concurrency"
            )
        return self

    @model_validator(mode="after")
    def _default_deadline_fits(self) -> Settings:
        deadline = self.run_defaults.training.get("deadline_s", TrainingSpec.model_fields["deadline_s"].default)
        if isinstance(deadline, int | float) and (refusal := self.limits.deadline_refusal(deadline)):
            raise ValueError(f"run_defaults: {refusal}")
        return self

    @property
    def limits(self) -> RunLimits:
        """What every run of the deployment must keep within: ``run_limits``, with its functions' timeouts (and, for a
        GPU worker, no more workers than its fleet's execution environments)."""
        timeouts = {name: f.timeout_s for name, f in self.functions.items()}
        worker = self.functions[GPU_FUNCTION]
        limits = (
            self.run_limits.with_timeouts(timeouts)
            .with_worker_memory(worker.memory_mb)
            .with_worker_accelerator(worker.accelerator_gib, tuple(worker.instance_types))
            .with_worker_concurrency(worker.reserved_concurrency)
        )
        if worker.max_environments is not None and limits.workers > worker.max_environments:
            limits = limits.model_copy(update={"workers": worker.max_environments})
        return limits

    @property
    def gpu_worker(self) -> FunctionSettings | None:
        """The worker's settings if it runs on GPU instances; None for a CPU worker."""
        worker = self.functions[GPU_FUNCTION]
        return worker if worker.gpu else None

    @classmethod
    def from_context(cls, node: Node) -> Settings:
        """The settings named in the app's context; the defaults for the others."""
        given = {name: node.try_get_context(name) for name in cls.model_fields}
        return cls.model_validate({k: v for k, v in given.items() if v is not None})

    @property
    def cdk_removal_policy(self) -> RemovalPolicy:
        return RemovalPolicy.DESTROY if self.removal_policy == "destroy" else RemovalPolicy.RETAIN
