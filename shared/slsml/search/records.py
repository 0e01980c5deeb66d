"""What a search keeps beside its runs, in the bucket: its settings (``searches/<name>/search.json``, written once
as it starts) and each trial as it ends (``searches/<name>/trials/<number>.json``, written once), from which
``--resume`` goes on without running a finished trial again; and the summary of a search, as ``slsml tune --json``
prints it."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from slsml.aws.storage import ObjectStore
from slsml.spec.errors import BadInputError

PREFIX = "searches/"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")  # its trials' run ids, <name>-t<number>, stay run ids
Pruner = Literal["hyperband", "asha", "median", "none"]
Direction = Literal["min", "max"]
Validation = Literal[
    "split", "test"
]  # the val_ figures: of a split held out of the training samples, or the test split


class TrialStatus(StrEnum):
    COMPLETED = "completed"  # trained every epoch
    PRUNED = "pruned"  # stopped early by the pruner (its run stopped, as `slsml run stop` stops it)
    FAILED = "failed"  # its model or run failed (or its run's share of the budget was spent)
    INTERRUPTED = "interrupted"  # stopped as the search was interrupted; --resume tries its hyperparameters again


ENDED = (TrialStatus.COMPLETED, TrialStatus.PRUNED, TrialStatus.FAILED)  # what counts toward max_trials


class SearchSettings(BaseModel):
    """A search as it was started: what ``--resume`` goes on with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the search's name; its trials' runs are <name>-t<number>")
    dataset: str = Field(description="the stored dataset every trial trains on")
    validation: Validation = Field(
        description="where the val_ figures come from: the validation_split held out of the training samples, or"
        " the dataset's test split (validation_data)"
    )
    objective: str = Field(description="the val_ figure the search optimizes, e.g. val_auc")
    direction: Direction = Field(description="whether the objective improves by falling or rising, as Keras tells")
    max_trials: int = Field(default=10, ge=1, le=9999, description="trials to run")
    parallel: int = Field(default=2, ge=1, le=256, description="trials running at once")
    epochs: int = Field(default=10, ge=1, description="each trial's epochs")
    batch_size: int = Field(default=32, ge=1, description="each trial's global batch (Keras's default)")
    budget_usd: float | None = Field(default=None, gt=0, description="dollars for the whole search")
    pruner: Pruner = "hyperband"
    seed: int = Field(default=0, ge=0, description="the sampler's seed")
    training: dict[str, Any] = Field(default_factory=dict, description="the trials' other training options")
    compiled: dict[str, Any] = Field(
        default_factory=dict,
        description="what compile takes (loss, optimizer, metrics, loss_weights) that each trial's model is compiled"
        " with in place of what the build function gave, as Keras serializes it (slsml.tune's)",
    )
    build: str | None = Field(default=None, description="FILE.py:FUNCTION, the build function of `slsml tune`")
    started_at: float

    @field_validator("name")
    @classmethod
    def _run_id_stem(cls, name: str) -> str:
        if not NAME.match(name):
            raise ValueError(
                f"search name {name!r}: lowercase letters, digits and dashes, up to 40, starting with a letter or"
                " digit (its trials' run ids are <name>-t<number>)"
            )
        return name

    @field_validator("objective")
    @classmethod
    def _validation_figure(cls, objective: str) -> str:
        if not objective.startswith("val_"):
            raise ValueError(
                f"objective {objective!r}: a search ranks its trials by a validation figure, val_loss or val_<metric>"
            )
        return objective

    def run_id(self, number: int) -> str:
        return f"{self.name}-t{number}"

    @property
    def monitor(self) -> str:
        """The objective as the trials' runs name it: ``val_…`` of the held-out split, ``test_…`` of the test split."""
        return self.objective if self.validation == "split" else "test_" + self.objective.removeprefix("val_")

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` is better than ``b``."""
        return a > b if self.direction == "max" else a < b


class TrialRecord(BaseModel):
    """One trial: its hyperparameters, how it ended, its objective per epoch, its time and dollars."""

    model_config = ConfigDict(extra="forbid")

    number: int = Field(
        ge=1, description="counted from 1, as its line, the table and its run id <name>-t<number> count it"
    )
    run_id: str
    hyperparameters: dict[str, Any] = Field(description="the values the build function took")
    params: dict[str, Any] = Field(description="the engine's draw (numbers in KerasTuner's probability space)")
    status: TrialStatus
    reason: str | None = None
    history: dict[str, list[float]] = Field(
        default_factory=dict, description="the val_ figures at the end of each epoch it trained"
    )
    value: float | None = Field(
        default=None, description="the objective: its best epoch's (a completed trial), its last (a pruned one)"
    )
    started_at: float
    ended_at: float
    wall_s: float = Field(description="from its model's build to its run's end, as the search saw them")
    cost_usd: float | None = Field(default=None, description="what its run's functions spent")
    predicted_usd: float | None = Field(
        default=None,
        description="its price as the search set it before it started: the mean cost of the trials completed by"
        " then, else the plan's",
    )
    engine: dict[str, Any] = Field(default_factory=dict, description="the pruner's state of the trial (its rungs)")

    def epochs(self, objective: str) -> int:
        """The epochs whose figures it recorded."""
        return len(self.history.get(objective, []))

    @property
    def score(self) -> float | None:
        """The objective (``value``), as KerasTuner's trials name it."""
        return self.value


class SearchSummary(BaseModel):
    """A search's trials, its best, its time and spend, and why it started fewer trials than asked (if it did)."""

    settings: SearchSettings
    trials: list[TrialRecord] = Field(description="the trials that ended (completed, pruned or failed), by number")
    interrupted: list[TrialRecord] = Field(default_factory=list, description="those an interruption stopped")
    best_trial: TrialRecord | None = Field(default=None, description="the completed trial best by the objective")
    best_hyperparameters: dict[str, Any] | None = None
    best_value: float | None = None
    wall_s: float = Field(default=0.0, description="the whole call's, from its start (a local runtime's too)")
    spent_usd: float | None = Field(default=None, description="every trial's cost, the interrupted ones' too")
    stopped_starting: str | None = Field(default=None, description="why it started no more trials (the budget)")


def settings_key(name: str) -> str:
    return f"{PREFIX}{name}/search.json"


def trial_key(name: str, number: int) -> str:
    return f"{PREFIX}{name}/trials/{number:05d}.json"


def check_new(store: ObjectStore, name: str) -> None:
    """BadInputError if a search named ``name`` exists."""
    if store.exists(settings_key(name)):
        raise BadInputError(
            f"a search named {name!r} exists: resume it (`slsml tune --resume {name}`, slsml.tune(…,"
            " resume=True)) or give another name"
        )


def save_settings(store: ObjectStore, settings: SearchSettings) -> None:
    """Keep a new search's settings; BadInputError if a search of its name exists."""
    if not store.put_json_new(settings_key(settings.name), settings.model_dump(mode="json")):
        raise BadInputError(
            f"a search named {settings.name!r} exists: resume it (`slsml tune --resume {settings.name}`,"
            " slsml.tune(…, resume=True)) or give another name"
        )


def load_settings(store: ObjectStore, name: str) -> SearchSettings | None:
    """The settings of search ``name`` (None: no such search)."""
    key = settings_key(name)
    return SearchSettings.model_validate(store.get_json(key)) if store.exists(key) else None


def save_trial(store: ObjectStore, name: str, trial: TrialRecord) -> None:
    store.put_json_new(trial_key(name, trial.number), trial.model_dump(mode="json"))


def load_trials(store: ObjectStore, name: str) -> list[TrialRecord]:
    """The trials of search ``name`` that ended, by number."""
    found = [
        TrialRecord.model_validate(store.get_json(key))
        for key in store.list_keys(f"{PREFIX}{name}/trials/")
        if key.endswith(".json")
    ]
    return sorted(found, key=lambda trial: trial.number)


def summarize(
    settings: SearchSettings, trials: list[TrialRecord], wall_s: float, stopped_starting: str | None
) -> SearchSummary:
    """The summary of a search's recorded ``trials``: the best completed trial by the objective."""
    ended = [t for t in trials if t.status in ENDED]
    best: TrialRecord | None = None
    for trial in ended:
        if trial.status != TrialStatus.COMPLETED or trial.value is None:
            continue
        if best is None or best.value is None or settings.better(trial.value, best.value):
            best = trial
    costs = [t.cost_usd for t in trials if t.cost_usd is not None]
    return SearchSummary(
        settings=settings,
        trials=ended,
        interrupted=[t for t in trials if t.status == TrialStatus.INTERRUPTED],
        best_trial=best,
        best_hyperparameters=None if best is None else best.hyperparameters,
        best_value=None if best is None else best.value,
        wall_s=round(wall_s, 3),
        spent_usd=sum(costs) if costs else None,
        stopped_starting=stopped_starting,
    )
