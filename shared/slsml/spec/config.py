"""Run configuration: what a user asks for, stored once as ``runs/<run>/run.json``."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from slsml.spec import algorithms, schedules
from slsml.spec.algorithms import ALGORITHMS
from slsml.spec.compression import Compression
from slsml.spec.deployment import TRANSIENT_USE_MAX_S
from slsml.spec.errors import BadInputError, nearest
from slsml.spec.schedules import Schedule
from slsml.spec.shardplan import ShardPlan


def _compiles(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(f"{pattern!r} is not a regular expression: {error}") from None
    return pattern


RegularExpression = Annotated[str, AfterValidator(_compiles)]
"""A field that holds a regular expression (checked when the model is validated)."""

RUN_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")  # \Z: "$" would take a trailing newline
DATASET_PATTERN = RUN_ID_PATTERN


KERAS_OPTIMIZERS = {
    "sgd": "SGD",
    "adam": "Adam",
    "adamw": "AdamW",
    "rmsprop": "RMSprop",
    "adagrad": "Adagrad",
    "adamax": "Adamax",
    "nadam": "Nadam",
    "lion": "Lion",
    "adadelta": "Adadelta",
    "ftrl": "Ftrl",
}
OptimizerName = Literal["sgd", "adam", "adamw", "rmsprop", "adagrad", "adamax", "nadam", "lion", "adadelta", "ftrl"]
OPTIMIZER_NAMES: tuple[str, ...] = get_args(OptimizerName)


def optimizer_named(name: str, other: str = "") -> str:
    """The optimizer a Python caller names (``optimizer="Adam"``: ``adam``); BadInputError naming the closest ones
    where slsml applies none of that name (``other``: what else the caller may give)."""
    if name.lower() in KERAS_OPTIMIZERS:
        return name.lower()
    raise BadInputError(
        f"optimizer={name!r} is not an optimizer slsml applies{nearest(name.lower(), KERAS_OPTIMIZERS, 2)}: give one"
        f" of {', '.join(map(repr, KERAS_OPTIMIZERS))}{f', {other}' if other else ''}"
    )


# Keras defaults that differ from the fields' defaults below, filled in where a field is not given
_KERAS_DEFAULTS: dict[str, dict[str, object]] = {
    "sgd": {"learning_rate": 0.01},
    "adamw": {"weight_decay": 0.004},
    "lion": {"beta_2": 0.99},
    "adadelta": {"rho": 0.95},
}
# Keras optimizers the reducers refuse, and why (a reducer steps one shard: a slice of the flat vector
# that cuts across variables, so it can apply only updates of each weight on its own)
_REFUSED_OPTIMIZERS = {
    "Adafactor": "it factors its second moment over the rows and columns of each variable, which model-parallel"
    " shards cut across",
    "Lamb": "its trust ratio scales each variable's update by the norms of the whole variable and of its update,"
    " which no one shard holds",
    "Muon": "it orthogonalizes the momentum of each matrix as a whole (Newton-Schulz iterations), which"
    " model-parallel shards cut across",
    "MultiOptimizer": "it applies different optimizers to different variables, and the reducers apply one to every"
    " weight",
}
# Keras optimizer options the reducers refuse, and why
_REFUSED = {
    "gradient_accumulation_steps": "the global batch already adds up every worker's gradient: raise --batch by"
    " that factor instead",
}


def _only(*names: str) -> dict[str, Any]:
    """A field's ``json_schema_extra``: the optimizers it applies to (a field without it applies to every one)."""
    assert set(names) <= set(OPTIMIZER_NAMES), names
    return {"optimizers": names}


class OptimizerConfig(BaseModel):
    """An element-wise optimizer the reducers apply in numpy, matching ``keras.optimizers``. A hyper-parameter
    that does not apply to ``name`` (its field's ``json_schema_extra["optimizers"]``) keeps its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: OptimizerName = "adam"
    learning_rate: float | Schedule = Field(
        default=0.001, description="a constant (> 0) or a Keras schedule; Keras's default: 0.001, SGD's 0.01"
    )
    momentum: float = Field(default=0.0, ge=0, lt=1, json_schema_extra=_only("sgd", "rmsprop"))
    nesterov: bool = Field(default=False, json_schema_extra=_only("sgd"))
    beta_1: float = Field(default=0.9, ge=0, le=1, json_schema_extra=_only("adam", "adamw", "adamax", "nadam", "lion"))
    beta_2: float = Field(
        default=0.999,
        ge=0,
        le=1,
        description="Lion's default 0.99",
        json_schema_extra=_only("adam", "adamw", "adamax", "nadam", "lion"),
    )
    epsilon: float = Field(
        default=1e-7,
        gt=0,
        json_schema_extra=_only("adam", "adamw", "rmsprop", "adagrad", "adamax", "nadam", "adadelta"),
    )
    amsgrad: bool = Field(default=False, json_schema_extra=_only("adam", "adamw"))
    rho: float = Field(
        default=0.9, ge=0, lt=1, description="Adadelta's default 0.95", json_schema_extra=_only("rmsprop", "adadelta")
    )
    centered: bool = Field(default=False, json_schema_extra=_only("rmsprop"))
    initial_accumulator_value: float = Field(default=0.1, ge=0, json_schema_extra=_only("adagrad", "ftrl"))
    learning_rate_power: float = Field(
        default=-0.5,
        le=0,
        description="how the per-weight learning rate falls (0: fixed)",
        json_schema_extra=_only("ftrl"),
    )
    l1_regularization_strength: float = Field(default=0.0, ge=0, json_schema_extra=_only("ftrl"))
    l2_regularization_strength: float = Field(
        default=0.0, ge=0, description="stabilization penalty", json_schema_extra=_only("ftrl")
    )
    l2_shrinkage_regularization_strength: float = Field(
        default=0.0, ge=0, description="magnitude penalty (added to the gradient)", json_schema_extra=_only("ftrl")
    )
    beta: float = Field(
        default=0.0, ge=0, description="the beta of McMahan et al. (2013)", json_schema_extra=_only("ftrl")
    )
    weight_decay: float | None = Field(default=None, ge=0, description="decoupled, applied before the update")
    exclude_from_weight_decay: tuple[RegularExpression, ...] = Field(
        default=(), description="patterns (regular expressions) of variable names that take no weight decay"
    )
    use_ema: bool = Field(
        default=False, description="keep an exponential moving average of the weights; the final model carries it"
    )
    ema_momentum: float = Field(default=0.99, ge=0, le=1, description="the average's momentum")
    ema_overwrite_frequency: int | None = Field(
        default=None, ge=1, description="every this many steps the weights take the average's value"
    )
    clipnorm: float | None = Field(default=None, gt=0, description="clip each variable's gradient to this norm")
    global_clipnorm: float | None = Field(
        default=None, gt=0, description="clip the whole gradient to this norm (over all shards)"
    )
    clipvalue: float | None = Field(default=None, gt=0, description="clip each gradient element to ±this")
    loss_scale_factor: float | None = Field(
        default=None,
        gt=0,
        description="static loss scaling: the loss is multiplied by this and the gradients divided by it",
    )
    dynamic_loss_scale: bool = Field(
        default=False,
        description="Keras's LossScaleOptimizer wraps it (dynamic loss scaling); a model that computes in float16 is"
        " scaled so whatever this says, as compile wraps its optimizer",
    )
    initial_scale: float = Field(
        default=2.0**15, gt=0, description="dynamic loss scaling: the scale it starts from (Keras's default 2**15)"
    )
    dynamic_growth_steps: int = Field(
        default=2000,
        ge=1,
        description="dynamic loss scaling: finite steps in a row after which the scale doubles (Keras's default 2000)",
    )

    @model_validator(mode="before")
    @classmethod
    def _keras_defaults(cls, data: object) -> object:
        if isinstance(data, dict):
            return {**_KERAS_DEFAULTS.get(data.get("name", "adam"), {}), **data}
        return data

    @classmethod
    @functools.cache  # fixed by the fields' declarations: every optimizer built asks it of each field
    def applies(cls, field: str, name: str) -> bool:
        """Whether the hyper-parameter ``field`` is one of optimizer ``name``'s."""
        extra = cls.model_fields[field].json_schema_extra
        return not isinstance(extra, dict) or name in extra["optimizers"]  # type: ignore[operator]

    @classmethod
    def optimizers_of(cls, field: str) -> tuple[str, ...]:
        """The optimizers the hyper-parameter ``field`` applies to."""
        return tuple(name for name in OPTIMIZER_NAMES if cls.applies(field, name))

    def foreign(self) -> list[str]:
        """The fields set to a value other than their default (or Keras's for this optimizer) that do not
        apply to this optimizer."""
        keras_defaults = _KERAS_DEFAULTS.get(self.name, {})
        return [
            field
            for field, info in type(self).model_fields.items()
            if not self.applies(field, self.name)
            and (value := getattr(self, field)) != info.default
            and value != keras_defaults.get(field, info.default)
        ]

    @model_validator(mode="after")
    def _consistent(self) -> OptimizerConfig:
        if foreign := self.foreign():
            raise ValueError(
                "; ".join(
                    f"{field} does not apply to {KERAS_OPTIMIZERS[self.name]} (only to"
                    f" {', '.join(KERAS_OPTIMIZERS[n] for n in self.optimizers_of(field))})"
                    for field in foreign
                )
            )
        if self.clipnorm and self.global_clipnorm:
            raise ValueError("clipnorm and global_clipnorm contradict each other: give one of them")
        if self.clipvalue and (self.clipnorm or self.global_clipnorm):
            raise ValueError(
                "clipvalue and a clipping norm contradict each other: Keras would clip by the norm and"
                " ignore clipvalue; give one of them"
            )
        if self.exclude_from_weight_decay and not self.weight_decay:
            raise ValueError("exclude_from_weight_decay needs a weight_decay")
        if self.dynamic_loss_scale and self.loss_scale_factor:
            raise ValueError(
                "dynamic_loss_scale and loss_scale_factor contradict each other: Keras's LossScaleOptimizer drops"
                " the factor of the optimizer it wraps; give one of them"
            )
        return self

    @property
    def clips_by_norm(self) -> bool:
        """The update needs gradient norms that span shards (clipnorm or global_clipnorm)."""
        return bool(self.clipnorm or self.global_clipnorm)

    def decays(self, variable_name: str) -> bool:
        """Whether weight decay applies to the variable of this name (``a/b/kernel``: Keras matches ``kernel``)."""
        name = variable_name.rsplit("/", 1)[-1]
        return bool(self.weight_decay) and not any(re.search(p, name) for p in self.exclude_from_weight_decay)

    @field_validator("learning_rate")
    @classmethod
    def _positive(cls, value: float | Schedule) -> float | Schedule:
        if isinstance(value, float) and value <= 0:
            raise ValueError(f"learning rate {value} must be positive")
        return value

    @classmethod
    def from_keras(cls, class_name: str, config: dict[str, Any]) -> OptimizerConfig:
        """A Keras optimizer's ``get_config()`` → the config, if the reducers can apply it exactly; else
        BadInputError naming what they cannot. A ``LossScaleOptimizer``'s is the optimizer it wraps, scaling the loss
        dynamically with its settings."""
        if class_name == "LossScaleOptimizer":
            return cls._loss_scaled(config)
        if class_name in _REFUSED_OPTIMIZERS:
            raise BadInputError(f"optimizer {class_name} is not supported: {_REFUSED_OPTIMIZERS[class_name]}")
        name = class_name.lower()
        if name not in KERAS_OPTIMIZERS:
            raise BadInputError(
                f"optimizer {class_name} is not supported; use one of {', '.join(KERAS_OPTIMIZERS.values())}"
            )
        for option, reason in _REFUSED.items():
            if config.get(option) and not (option == "gradient_accumulation_steps" and config[option] == 1):
                raise BadInputError(f"optimizer option {option}={config[option]!r} is not supported: {reason}")
        fields = {k: config[k] for k in cls.model_fields if k in config and k not in ("name", "learning_rate")}
        fields["learning_rate"] = _keras_learning_rate(config.get("learning_rate", 0.001))
        try:
            return cls(name=name, **fields)
        except ValidationError as error:
            raise BadInputError(f"optimizer {class_name}: {_problems(error)}") from None

    @classmethod
    def _loss_scaled(cls, config: dict[str, Any]) -> OptimizerConfig:
        """A ``LossScaleOptimizer``'s config → the config of the optimizer it wraps, with dynamic loss scaling."""
        inner = config.get("inner_optimizer")
        if not isinstance(inner, dict) or not isinstance(inner.get("config"), dict):
            raise BadInputError("optimizer LossScaleOptimizer has no inner optimizer")
        if inner.get("class_name") == "LossScaleOptimizer":
            raise BadInputError("optimizer LossScaleOptimizer wraps another one: wrap the optimizer once")
        wrapped = cls.from_keras(str(inner.get("class_name")), {**inner["config"], "loss_scale_factor": None})
        settings = {
            field: config[field] for field in ("initial_scale", "dynamic_growth_steps") if config.get(field) is not None
        }
        try:
            return cls.model_validate({**wrapped.model_dump(), **settings, "dynamic_loss_scale": True})
        except ValidationError as error:
            raise BadInputError(f"optimizer LossScaleOptimizer: {_problems(error)}") from None


# the fields of Keras's LossScaleOptimizer, which wraps the optimizer rather than configuring it
LOSS_SCALE_OPTIMIZER_FIELDS = frozenset({"dynamic_loss_scale", "initial_scale", "dynamic_growth_steps"})
# OptimizerConfig's hyper-parameters: its fields other than name and learning_rate (a CLI flag each)
HYPER_PARAMETERS: tuple[str, ...] = tuple(f for f in OptimizerConfig.model_fields if f not in {"name", "learning_rate"})


def _keras_learning_rate(value: object) -> object:
    """A serialized Keras learning rate: a number, or a built-in schedule as ``{class_name, config}``."""
    if not isinstance(value, dict):
        return value
    class_name, config = value.get("class_name"), value.get("config")
    if class_name not in schedules.NAMES or value.get("module", schedules.KERAS_MODULE) != schedules.KERAS_MODULE:
        raise BadInputError(
            f"learning-rate schedule {class_name} is not supported; use a constant or one of"
            f" {', '.join(schedules.NAMES)}"
        )
    if not isinstance(config, dict):
        raise BadInputError(f"learning-rate schedule {class_name} has no config")
    fields = {k: v for k, v in config.items() if k != "name"}
    try:
        return TypeAdapter(Schedule).validate_python({**fields, "class_name": class_name})
    except ValidationError as error:
        raise BadInputError(f"learning-rate schedule {class_name}: {_problems(error)}") from None


def _problems(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in e['loc'] if part not in schedules.NAMES) or 'config'}: {e['msg']}"
        for e in error.errors()
    )


def _class_weight_text(value: object) -> object:
    """A class_weight as the spec keeps it: "balanced", or a mapping of class id → weight (given as a dict or its
    JSON) as canonical JSON; ValueError naming what is wrong."""
    if value is None or value == "balanced":
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(
                f"class_weight {value!r} is neither balanced nor a JSON mapping of class to weight"
            ) from None
    if not isinstance(value, dict) or not value:
        raise ValueError('class_weight must be balanced or a mapping of class to weight, e.g. {"0": 1, "1": 3}')
    weights: dict[int, float] = {}
    for key, weight in value.items():
        try:
            number = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"class_weight: class {key!r} is not a class id (a whole number)") from None
        if number < 0:
            raise ValueError(f"class_weight: class {key!r} is not a class id (a whole number from 0)")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"class_weight: the weight of class {number} must be a number from 0, not {weight!r}")
        weights[number] = float(weight)
    return json.dumps({str(c): weights[c] for c in sorted(weights)})


def _early_stopping(value: str | None) -> str | None:
    """MONITOR[:PATIENCE[:MIN_DELTA]], checked (PATIENCE a whole number from 0, MIN_DELTA a number from 0)."""
    if value is None:
        return value
    rest = value.split(":")[1:]
    try:
        if len(rest) > 2 or (rest and int(rest[0]) < 0) or (len(rest) > 1 and not float(rest[1]) >= 0):
            raise ValueError
    except ValueError:
        raise ValueError(
            f"early_stopping {value!r} is not MONITOR[:PATIENCE[:MIN_DELTA]] (e.g. val_loss:3:0.001;"
            " PATIENCE a whole number from 0, MIN_DELTA a number from 0)"
        ) from None
    return value


MAX_WORKERS = 1000
if TYPE_CHECKING:
    Algorithm = str
else:  # the --algorithm choices: the registered rules
    Algorithm = Literal[tuple(ALGORITHMS)]
Objective = Literal["time", "cost"]
MixedPrecision = Literal["mixed_float16", "mixed_bfloat16"]


class TrainingSpec(BaseModel):
    """The knobs of a training run that a user sets (CLI flags, API arguments)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] | Literal["auto"] = Field(
        default=4,
        description="data-parallel workers; auto: the tuner sets them each round, between min_workers and"
        " max_workers (starting at min_workers), toward the objective",
    )
    reducers: int = Field(default=2, ge=1, le=256, description="model-parallel reducers (shards of the weights)")
    global_batch: int = Field(default=128, ge=1, description="global mini-batch: samples per iteration")
    iterations: int = Field(default=150, ge=1, le=999_999, description="iteration budget")  # model keys: six digits
    quorum: float = Field(default=1.0, gt=0, le=1, description="fraction of workers a reduce waits for")
    seed: int = Field(
        default=0,
        ge=0,
        description="data order seed (one permutation per epoch), and the seed of the random layers built without one"
        " (slsml.training.generators)",
    )
    shuffle: Literal["global", "blocks"] = Field(
        default="global",
        description="the data order. global: each epoch a seeded permutation of the whole training set, the batches"
        " of single-process training, read sample by sample (ranged GETs) past the workers' cache; blocks: each"
        " epoch a seeded permutation of blocks of shuffle_block consecutive samples, each block one read: for data"
        " far past the workers' memory",
    )
    shuffle_block: int = Field(
        default=16, ge=1, le=65536, description="shuffle blocks: consecutive samples read (and trained) together"
    )
    eval_every: int = Field(default=10, ge=0, description="test-set evaluation period; 0: only at the end")
    checkpoint_every: int = Field(
        default=0,
        ge=0,
        description="save the model (models/<iteration>.keras) every this many iterations, after the next one is"
        " launched; 0: only where the run may end (the final model, and each one a watched split is evaluated on)",
    )
    epochs: int | None = Field(
        default=None,
        ge=1,
        description="the run's length in epochs (Keras's fit): iterations are epochs × the"
        " training samples // the global batch (the last partial batch of an epoch is left out), in place of"
        " iterations",
    )
    validation_split: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="a fraction of the training samples held out of training and evaluated at each epoch's end"
        " (val_ figures): the last ones, as Keras's fit holds them out (validation_samples)",
    )
    validation_samples: Literal["last", "seeded"] = Field(
        default="last",
        description="which samples validation_split holds out. last: the last fraction of the training samples in"
        " their stored order, before any shuffling, as Keras's fit does; seeded: that many drawn by the seed",
    )
    class_weight: Annotated[str | None, BeforeValidator(_class_weight_text)] = Field(
        default=None,
        description="Keras's class_weight: balanced (each class weighted by samples / (classes ×"
        ' its samples)) or a JSON mapping of class to weight, e.g. \'{"0": 1, "1": 3}\' (a class left out: 1);'
        " each sample's loss is weighted by its class's weight, as fit weights it",
    )
    early_stopping: Annotated[str | None, AfterValidator(_early_stopping)] = Field(
        default=None,
        description="Keras's EarlyStopping as MONITOR[:PATIENCE[:MIN_DELTA]], e.g. val_loss:3: the run"
        " ends COMPLETED once the monitored figure (val_… of the validation split, evaluated at each epoch's end;"
        " test_… of the test split) has not improved by more than MIN_DELTA (default 0) for PATIENCE evaluations"
        " (default 0); minimized or maximized as Keras decides from the metric",
    )
    keep_best: str | None = Field(
        default=None,
        description="Keras's ModelCheckpoint(save_best_only): the final model is the evaluated model"
        " best by this figure (val_… or test_…, e.g. val_auc), not the last",
    )
    optimizer: OptimizerConfig | None = Field(
        default=None, description="None: take the optimizer the model was compiled with"
    )
    loss: str | None = Field(default=None, description="Keras loss name; None: the model's compiled loss")
    budget_usd: float | None = Field(
        default=None,
        gt=0,
        description="dollars: a run the plan predicts above this is refused before it starts, and the run is"
        " stopped (STOPPED, reason budget) at the first iteration it would launch once its functions have spent"
        " this much",
    )
    heartbeat_s: int = Field(default=900, ge=1, description="seconds: the run fails if an iteration takes longer")
    time_budget_s: int = Field(default=7 * 24 * 3600, ge=1, description="seconds: the run fails if it takes longer")
    deadline_s: float = Field(
        default=120.0,
        gt=0,
        le=24 * 3600,
        description="seconds a stage (the workers, then the reducers) of an iteration may take before the"
        " watchdog acts on what is missing",
    )
    deadline_floor: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="at a deadline, the fraction of workers that lets the reduce fire without the others"
        " (at most the quorum)",
    )
    deadline_retries: int = Field(
        default=2,
        ge=0,
        le=20,
        description="how often missing workers or reducers are re-launched before the run fails"
        " (workers) or a shard keeps its weights (reducers)",
    )

    algorithm: Algorithm = Field(
        default="gradient", description="; ".join(f"{rule.name}: {rule.about}" for rule in ALGORITHMS.values())
    )
    micro_batch: int | None = Field(
        default=None,
        ge=1,
        description="samples a worker computes at once: it computes its share of each batch in micro-batches of at"
        " most this many, adding up their gradients (gradient accumulation); default: the most that fit its"
        " function's memory",
    )
    pipeline_stages: int = Field(
        default=1,
        ge=1,
        le=64,
        description="pipeline stages a worker's model is split into at layer boundaries, each a function of its own"
        " that micro-batches flow through (GPipe), for a model whose step does not fit one function: `slsml plan`"
        " models them (there, default the fewest that fit); a run splits its model where the stages' compute is most"
        " even and each stage's step fits the worker's memory",
    )
    mixed_precision: MixedPrecision | None = Field(
        default=None,
        description="Keras's mixed-precision policy for a model saved in float32: the workers compute under it, as"
        " if the model were built under it (its weights, updates and optimizer state stay float32); mixed_float16"
        " scales the loss dynamically, as compile's LossScaleOptimizer does",
    )
    local_steps: int = Field(
        default=1,
        ge=1,
        le=1000,
        description=f"{algorithms.titles('local_steps')}: local steps per round, one per batch the size of the"
        " worker's share of the global batch (a round takes this many)",
    )
    local_optimizer: OptimizerName = Field(
        default="sgd", description=f"{algorithms.titles('local_optimizer')}: the workers' local optimizer"
    )
    local_learning_rate: float = Field(
        default=0.1, gt=0, description=f"{algorithms.titles('local_learning_rate')}: its constant learning rate"
    )
    local_momentum: float = Field(
        default=0.0, ge=0, lt=1, description=f"{algorithms.titles('local_momentum')}: its momentum (sgd, rmsprop)"
    )
    admm_rho: float = Field(
        default=0.1,
        gt=0,
        description=f"{algorithms.titles('admm_rho')}: the weight ρ of the proximal term (ρ/2)·‖x − z + u‖² of local"
        " steps",
    )
    local_state: Literal["reset", "keep"] = Field(
        default="reset",
        description=f"{algorithms.titles('local_state')}: the local optimizer's state (e.g. momentum) starts fresh"
        " every round, or is kept per worker slot in S3",
    )
    server: Literal["average", "optimizer"] = Field(
        default="average",
        description=f"{algorithms.titles('server')}: the reducers apply the average of the weight changes (FedAvg), or"
        " step the run's optimizer with it as the gradient (FedOpt)",
    )

    staleness: Annotated[int, Field(ge=0, le=100)] | Literal["unbounded"] = Field(
        default=0,
        description="bounded staleness (SSP): a worker's update that comes after its round's reduce fired is"
        " folded into a later round's reduce, at most this many rounds later; 0: it is left out. unbounded: fully"
        " asynchronous training (ASP): each worker's update is applied to the newest model with the others waiting"
        " then, with no barrier, and the worker goes on from the model it went into; an iteration is one worker's"
        " update (its slice of a global batch)",
    )
    staleness_decay: float = Field(
        default=1.0, gt=0, le=1, description="a folded update's weight: its samples × this to the power of its age"
    )
    stale_weights: int = Field(
        default=0,
        ge=0,
        le=1,
        description="1: a round's reduce, as it fires, launches the next round's workers, which train from the"
        " weights predicted from the last two models (one round stale), so that workers compute while the reducers"
        " and the Merger run; that round's reduce fires once the model it steps is merged (gradient averaging only);"
        " 0: each round starts on the model the round before merged",
    )
    min_workers: int | None = Field(
        default=None, ge=1, description="the fewest workers `run scale` may set while the run trains (default 1)"
    )
    max_workers: int | None = Field(
        default=None,
        ge=1,
        le=MAX_WORKERS,
        description=f"the most workers `run scale` may set while the run trains (default: the global batch, at"
        f" most {MAX_WORKERS})",
    )

    objective: Objective = Field(
        default="time", description="--workers auto: what the tuner minimizes, seconds or dollars per round"
    )
    compress: str = Field(
        default="none",
        description="what workers send: none (float32), sparse (exact: the nonzero entries, e.g. the embedding rows a"
        " round touched), fp16, topk:F (each part's fraction F of largest entries) or significance:V (the entries"
        " whose change relative to their weight exceeds V); what a lossy one leaves out is kept per worker slot and"
        " added to its next update (error feedback)",
    )

    compress_warmup: int | None = Field(
        default=None,
        ge=0,
        description="with a sparse compression (topk, significance) and reducers stepping an adaptive optimizer"
        " (Adam, AdamW, Nadam, RMSprop): the first iterations, whose updates go dense, before the optimizer's second"
        " moments are frozen and the compression starts (1-bit Adam's warm-up; default: one epoch; 0: compress from"
        " the first iteration, the second moments adapting throughout)",
    )

    @field_validator("compress")
    @classmethod
    def _compressor(cls, text: str) -> str:
        Compression.parse(text)
        return text

    @model_validator(mode="after")
    def _warmup_compresses(self) -> TrainingSpec:
        if self.compress_warmup is not None and not self.compression.sparse:
            raise ValueError(
                f"compress_warmup {self.compress_warmup}: a warm-up precedes a sparse compression (topk:F or"
                f" significance:V), and compress is {self.compress}: leave compress_warmup out"
            )
        return self

    @property
    def class_weights(self) -> dict[int, float] | Literal["balanced"] | None:
        """``class_weight`` read: "balanced", or the weight of each class named."""
        if self.class_weight is None or self.class_weight == "balanced":
            return self.class_weight  # type: ignore[return-value]
        return {int(c): float(w) for c, w in json.loads(self.class_weight).items()}

    @property
    def stopping(self) -> tuple[str, int, float] | None:
        """``early_stopping`` read: its monitor, patience and min_delta."""
        if self.early_stopping is None:
            return None
        monitor, *rest = self.early_stopping.split(":")
        return monitor, int(rest[0]) if rest else 0, float(rest[1]) if len(rest) > 1 else 0.0

    @property
    def monitors(self) -> tuple[str, ...]:
        """The figures the run watches (early_stopping's, keep_best's)."""
        stopping = self.stopping
        return tuple(m for m in (stopping[0] if stopping else None, self.keep_best) if m is not None)

    @model_validator(mode="after")
    def _monitored(self) -> TrainingSpec:
        for monitor in self.monitors:
            if not monitor.startswith(("val_", "test_")) or monitor in ("val_", "test_"):
                raise ValueError(
                    f"{monitor!r} is not a figure of an evaluation: monitor val_<metric> (the"
                    " validation split) or test_<metric> (the test split), e.g. val_loss"
                )
            if monitor.startswith("val_") and self.validation_split is None:
                raise ValueError(f"{monitor} is evaluated on a validation split: give validation_split")
            if monitor.startswith("test_") and not self.eval_every:
                raise ValueError(f"{monitor} is evaluated every eval_every iterations: give eval_every above 0")
        return self

    @property
    def compression(self) -> Compression:
        """The ``compress`` option, parsed."""
        return Compression.parse(self.compress)

    @property
    def worker_bounds(self) -> tuple[int, int]:
        """The fewest and the most workers the run may train with."""
        return self.min_workers or 1, self.max_workers or min(self.global_batch, MAX_WORKERS)

    @property
    def initial_workers(self) -> int:
        """The workers of the first round (with auto: the fewest)."""
        return self.worker_bounds[0] if self.workers == "auto" else self.workers

    def on_gpu_workers(self) -> TrainingSpec:
        """The run as GPU workers train it: in the block order (``shuffle blocks``, blocks of ``shuffle_block``)
        where it keeps the default exact order and can be read in blocks (no seeded ``validation_split``). A GPU
        computes a worker's share in about a second, so its samples' ranged GETs of one sample each would bound the
        round; a block is one GET. The trade-off: a block's samples are consecutive in the stored order and trained
        together (an exact sample-level order on GPU workers: ``shuffle blocks`` with ``shuffle_block`` 1, a GET a
        sample)."""
        if self.shuffle == "blocks" or self.held_out_by_seed:
            return self
        return self.model_copy(update={"shuffle": "blocks"})

    def asked_workers(self, workers: int | None = None) -> int:
        """The most workers a run asks for: its ``max_workers`` (the bound of ``run scale`` and ``--workers
        auto``), else ``workers`` (those it is scaled to), else those it trains with."""
        return max(self.max_workers or 0, workers or self.initial_workers)

    @model_validator(mode="after")
    def _workers_within_bounds(self) -> TrainingSpec:
        if self.global_batch < self.initial_workers:  # first: the default max_workers is the global batch
            raise ValueError(
                f"global_batch ({self.global_batch}) must be at least the number of workers ({self.initial_workers})"
            )
        if self.workers == "auto" and (self.min_workers is None or self.max_workers is None):
            raise ValueError(
                "workers auto needs min_workers and max_workers, the bounds the tuner moves within (e.g. min_workers 1"
                " and max_workers 16)"
            )
        if self.workers != "auto" and self.objective != type(self).model_fields["objective"].default:
            raise ValueError("objective applies to workers auto only")
        low, high = self.worker_bounds
        if low > high:
            raise ValueError(f"min_workers ({low}) must be at most max_workers ({high})")
        if not low <= self.initial_workers <= high:
            raise ValueError(f"workers ({self.workers}) must lie within min_workers and max_workers ({low}-{high})")
        if high > self.global_batch:
            raise ValueError(f"max_workers ({high}) must be at most the global batch ({self.global_batch})")
        return self

    @model_validator(mode="after")
    def _shuffle_options(self) -> TrainingSpec:
        if self.shuffle_block != type(self).model_fields["shuffle_block"].default and self.shuffle != "blocks":
            raise ValueError("shuffle_block applies to shuffle blocks only")
        if self.held_out_by_seed and self.shuffle == "blocks":
            raise ValueError(
                "validation_samples seeded holds samples out of the global order: it needs shuffle global (or"
                " validation_samples last)"
            )
        if self.validation_split is None and self.validation_samples != "last":
            raise ValueError("validation_samples applies to a validation_split: give validation_split too")
        return self

    @property
    def held_out_by_seed(self) -> bool:
        """Whether the run holds out validation samples drawn by the seed (``validation_samples`` seeded)."""
        return self.validation_split is not None and self.validation_samples == "seeded"

    @model_validator(mode="after")
    def _heartbeat_within_budget(self) -> TrainingSpec:
        if self.heartbeat_s >= self.time_budget_s:  # Step Functions refuses a heartbeat not below the timeout
            raise ValueError(
                f"heartbeat ({self.heartbeat_s} s) must be shorter than the time budget ({self.time_budget_s} s)"
            )
        return self

    @property
    def asynchronous(self) -> bool:
        """Whether the run trains fully asynchronously (ASP: ``staleness unbounded``)."""
        return self.staleness == "unbounded"

    @property
    def staleness_bound(self) -> int:
        """The iterations a late update may be folded into under SSP (0: none; ASP folds none, it applies every
        update as it comes)."""
        return 0 if self.staleness == "unbounded" else self.staleness

    @model_validator(mode="after")
    def _staleness_options(self) -> TrainingSpec:
        if self.asynchronous:
            self._asynchronous_options()
        elif self.staleness_decay != 1 and not self.staleness:
            raise ValueError("staleness_decay needs a staleness above 0")
        if (self.staleness_bound + 1) * self.heartbeat_s > TRANSIENT_USE_MAX_S:
            raise ValueError(
                f"(staleness + 1) × heartbeat ({self.staleness_bound + 1} × {self.heartbeat_s} s) exceeds the"
                f" {TRANSIENT_USE_MAX_S} s a run may read an iteration's updates, which then expire"
            )
        return self

    def _asynchronous_options(self) -> None:
        """ValueError naming what ``staleness unbounded`` (ASP) does not take."""
        fields = type(self).model_fields
        if self.workers == "auto" or self.min_workers is not None or self.max_workers is not None:
            raise ValueError("staleness unbounded trains a fixed fleet: give workers a number (no auto, min or max)")
        if ALGORITHMS[self.algorithm].partitioned:
            raise ValueError(
                f"staleness unbounded applies updates as they come: algorithm {self.algorithm} needs rounds"
            )
        taken = {
            "quorum": "each update is applied as it arrives",
            "staleness_decay": "each update is applied in full, whatever its age",
            "early_stopping": "the model is evaluated at the end only",
            "keep_best": "the model is evaluated at the end only",
            "validation_split": "the model is evaluated at the end only",
            "stale_weights": "each worker goes on at once from the newest model",
        }
        for name, why in taken.items():
            if getattr(self, name) != fields[name].default:
                raise ValueError(f"{name} does not apply with staleness unbounded ({why}): leave it out")
        if self.compression.lossy:
            raise ValueError(
                f"compress {self.compress} does not apply with staleness unbounded (its error feedback follows a"
                " worker's synchronous slot): leave it out, or compress sparse (exact: the update's nonzero entries)"
            )

    @model_validator(mode="after")
    def _algorithm_options(self) -> TrainingSpec:
        fields = type(self).model_fields
        foreign = [
            f
            for f in algorithms.OPTIONS
            if f not in ALGORITHMS[self.algorithm].taken and getattr(self, f) != fields[f].default
        ]
        if foreign:
            raise ValueError(
                "; ".join(f"{f} is an option of algorithm {' or '.join(algorithms.taking(f))} only" for f in foreign)
            )
        rule = ALGORITHMS[self.algorithm]
        if rule.local:
            self.local_optimizer_config()  # the local optimizer must take its options
            if self.mixed_precision == "mixed_float16":
                raise ValueError(
                    f"mixed_precision mixed_float16 needs loss scaling, which algorithm {rule.name}'s local steps do"
                    " not apply: use mixed_bfloat16, or algorithm gradient"
                )
        if rule.partitioned:
            if self.workers == "auto" or self.min_workers is not None or self.max_workers is not None:
                raise ValueError(
                    f"algorithm {rule.name} trains a fixed fleet: each worker keeps its data partition"
                    " and its state, which another count would cut anew (no workers auto, min_workers"
                    " or max_workers)"
                )
            if self.staleness:
                raise ValueError(
                    f"algorithm {rule.name} folds no late updates: a late worker's state is kept with"
                    " its slot and enters the slot's next round (no staleness)"
                )
        if self.stale_weights and rule.local:
            raise ValueError(
                f"stale_weights steps the model with gradients of the weights one round before; algorithm"
                f" {rule.name}'s workers send what their local steps moved the weights they started from: use"
                " algorithm gradient, or stale_weights 0"
            )
        return self

    @property
    def local_batches(self) -> int:
        """Batches a worker takes per round: its local steps under a rule that takes them, else one."""
        return self.local_steps if ALGORITHMS[self.algorithm].local else 1

    @property
    def elastic(self) -> bool:
        """Whether the run's workers may change while it trains (not under a partitioned rule)."""
        return not ALGORITHMS[self.algorithm].partitioned

    def local_optimizer_config(self) -> OptimizerConfig:
        """The workers' local optimizer (under a rule that takes local steps)."""
        fields: dict[str, Any] = {"name": self.local_optimizer, "learning_rate": self.local_learning_rate}
        if self.local_momentum:
            fields["momentum"] = self.local_momentum
        try:
            return OptimizerConfig(**fields)
        except ValidationError as error:
            problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())
            raise ValueError(f"local_optimizer {self.local_optimizer}: {problems}") from None


class RunConfig(BaseModel):
    """Everything the functions need to know about a run; immutable once written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    run_id: str
    dataset: str
    dataset_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="the SHA-256 of the dataset's manifest as the run started: every read of the dataset is checked"
        " against it (slsml.data.datasets.pinned_manifest); None: a run started before datasets were pinned",
    )
    initial_shards: list[str] | None = Field(
        default=None,
        description="the ETags of the shards entering iteration 0 (weights and optimizer state), as the run's start"
        " stored them: their readers take no other object (None: a run started before they were named)",
    )
    source_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="the SHA-256 of the model the run was started with (source.keras), which the steps build their"
        " models from: checked as they read it (None: a run started before it was named)",
    )
    training: TrainingSpec
    optimizer: OptimizerConfig
    loss: str
    classification: bool = Field(description="labels are classes: workers report accuracy")
    metrics: str = Field(
        default="[]",
        description="the metrics the workers evaluate (JSON: Keras names and serialized"
        " metrics, as compile takes them; slsml.training.evaluation)",
    )
    modes: dict[str, Literal["min", "max"]] = Field(
        default_factory=dict,
        description="whether each monitored figure (training.monitors) improves by falling"
        " or rising, as Keras decides it from the metric",
    )
    class_weights: tuple[float, ...] | None = Field(
        default=None,
        description="the weight of each class id 0 … n−1 (training.class_weight resolved; a class"
        " beyond: 1, as Keras); None: none",
    )
    plan: ShardPlan
    sample_bytes: int = Field(
        default=0,
        ge=0,
        description="what one sample adds to a training step of the model (slsml.rounds.sizing.sample_bytes), which"
        " sizes the workers' micro-batches; 0: not known (a run started before it was kept), each share in one",
    )
    stage_blocks: tuple[int, ...] | None = Field(
        default=None,
        description="pipeline_stages > 1: the blocks (layers between neighbouring cut points,"
        " slsml.training.stages.cut_points) each stage holds, in order, as the run's start split the model; None: one"
        " stage",
    )
    architecture: str | None = Field(
        default=None,
        description="digest of what the model computes (modelio.architecture): a warm worker serves "
        "the runs of one architecture with one model (None: with the run's own)",
    )
    update_format: Literal[1] = 1

    @field_validator("run_id")
    @classmethod
    def _valid_run_id(cls, value: str) -> str:
        if not RUN_ID_PATTERN.match(value):
            raise ValueError(f"run id {value!r} must be 1-63 lowercase letters, digits or '-'")
        return value

    @property
    def dense_warmup(self) -> int:
        """Iterations whose updates go dense before the run's sparse compression starts (``compress_warmup``); from
        the first compressed one, the reducers' optimizer keeps the second moments it had (0: no warm-up)."""
        return self.training.compress_warmup or 0

    def compression_at(self, iteration: int) -> Compression:
        """What workers send in ``iteration``: dense float32 in the warm-up, else the run's compression."""
        return Compression() if iteration < self.dense_warmup else self.training.compression

    def moments_frozen(self, iteration: int) -> bool:
        """Whether the reducers' adaptive optimizer steps ``iteration`` on the second moments it had when the warm-up
        ended (``slsml.training.optimizers.apply``'s ``frozen``)."""
        return 0 < self.dense_warmup <= iteration

    @property
    def workers(self) -> int:
        """The workers of the first round (later rounds: their counters, ``Counter.workers``)."""
        return self.training.initial_workers

    def stored(self) -> bytes:
        """``run.json`` as its run's start stores it, and registers its digest (``config_digest``)."""
        return json.dumps(self.model_dump(mode="json"), indent=1).encode()

    @property
    def reducers(self) -> int:
        return self.training.reducers


def config_digest(body: bytes) -> str:
    """The SHA-256 (hex) of a ``run.json``'s bytes: what its run registers (``RunRecord.config_sha256``) and every step
    that reads it checks."""
    return hashlib.sha256(body).hexdigest()


class DropInRequest(BaseModel):
    """How a model dropped under ``incoming/`` trains: the deployment's defaults, overridden field by
    field by an optional ``incoming/<name>.json`` of the same shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str | None = None
    training: dict[str, object] = Field(default_factory=dict, description="TrainingSpec fields")

    def over(self, defaults: DropInRequest) -> DropInRequest:
        return DropInRequest(dataset=self.dataset or defaults.dataset, training={**defaults.training, **self.training})
