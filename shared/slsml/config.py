"""Run configuration: what a user asks for, stored once as ``runs/<run>/run.json``."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from slsml.plan import ShardPlan

RUN_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
DATASET_PATTERN = RUN_ID_PATTERN


class OptimizerConfig(BaseModel):
    """An element-wise optimizer the reducers apply in numpy, matching ``keras.optimizers``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["sgd", "adam"] = "adam"
    learning_rate: float = Field(default=0.003, gt=0)
    momentum: float = Field(default=0.0, ge=0, lt=1)
    nesterov: bool = False
    beta_1: float = Field(default=0.9, ge=0, lt=1)
    beta_2: float = Field(default=0.999, ge=0, lt=1)
    epsilon: float = Field(default=1e-7, gt=0)
    amsgrad: bool = False


class TrainingSpec(BaseModel):
    """The knobs of a training run that a user sets (CLI flags, API arguments)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(default=4, ge=1, le=1000)
    reducers: int = Field(default=2, ge=1, le=256)
    global_batch: int = Field(default=128, ge=1)
    iterations: int = Field(default=150, ge=1, le=999_999)  # model keys hold six digits
    quorum: float = Field(default=1.0, gt=0, le=1)
    seed: int = Field(default=0, ge=0)
    eval_every: int = Field(default=10, ge=0, description="test-set evaluation period; 0: only at the end")
    optimizer: OptimizerConfig | None = Field(
        default=None, description="None: take the optimizer the model was compiled with"
    )
    loss: str | None = Field(default=None, description="Keras loss name; None: the model's compiled loss")
    heartbeat_s: int = Field(default=900, ge=1, description="the run fails if an iteration takes longer")
    time_budget_s: int = Field(default=7 * 24 * 3600, ge=1, description="the run fails if it takes longer")
    deadline_s: float = Field(
        default=120.0, gt=0, le=24 * 3600,
        description="how long a stage (the workers, then the reducers) of an iteration may take before the"
        " watchdog acts on what is missing",
    )
    deadline_floor: float = Field(
        default=0.5, gt=0, le=1,
        description="at a deadline, the fraction of workers that lets the reduce fire without the others"
        " (at most the quorum)",
    )
    deadline_retries: int = Field(
        default=2, ge=0, le=20,
        description="how often missing workers or reducers are re-launched before the run fails"
        " (workers) or a shard keeps its weights (reducers)",
    )

    @model_validator(mode="after")
    def _batch_covers_workers(self) -> TrainingSpec:
        if self.global_batch < self.workers:
            raise ValueError(
                f"global_batch ({self.global_batch}) must be at least the number of workers ({self.workers})"
            )
        return self


class RunConfig(BaseModel):
    """Everything the functions need to know about a run; immutable once written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    run_id: str
    dataset: str
    training: TrainingSpec
    optimizer: OptimizerConfig
    loss: str
    classification: bool = Field(description="labels are class ids: workers report accuracy")
    plan: ShardPlan
    update_format: Literal[1] = 1

    @field_validator("run_id")
    @classmethod
    def _valid_run_id(cls, value: str) -> str:
        if not RUN_ID_PATTERN.match(value):
            raise ValueError(f"run id {value!r} must be 1-63 lowercase letters, digits or '-'")
        return value

    @property
    def workers(self) -> int:
        return self.training.workers

    @property
    def reducers(self) -> int:
        return self.training.reducers


class DropInRequest(BaseModel):
    """How a model dropped under ``incoming/`` trains: the deployment's defaults, overridden field by
    field by an optional ``incoming/<name>.json`` of the same shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str | None = None
    training: dict[str, object] = Field(default_factory=dict, description="TrainingSpec fields")

    def over(self, defaults: DropInRequest) -> DropInRequest:
        return DropInRequest(
            dataset=self.dataset or defaults.dataset, training={**defaults.training, **self.training}
        )
