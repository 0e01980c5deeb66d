"""The search engine: an Optuna study in memory (its TPE sampler seeded by the search, its pruner one of
Hyperband, successive halving (ASHA) or the median rule, over epochs), asked for each trial's draw, told each epoch's
objective as it lands and each trial's end; rebuilt from the recorded trials when a search resumes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slsml.search.records import ENDED, SearchSettings, TrialRecord, TrialStatus
from slsml.spec.errors import BadInputError


def _pruner(settings: SearchSettings) -> Any:
    import optuna

    if settings.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=settings.epochs, reduction_factor=3)
    if settings.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=settings.parallel, n_warmup_steps=1)
    return optuna.pruners.NopPruner()


def trial_number(trial: Any) -> int:
    """A trial's number as the search counts it, from 1 (Optuna's count from 0)."""
    return int(trial.number) + 1


class Engine:
    """The study of one search: which hyperparameters each trial tries, and whether a running one goes on."""

    def __init__(self, settings: SearchSettings) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.objective = settings.objective  # the figure told each epoch
        self.seed = settings.seed
        self.study = optuna.create_study(
            study_name=settings.name,
            direction="maximize" if settings.direction == "max" else "minimize",
            sampler=optuna.samplers.TPESampler(seed=settings.seed),
            pruner=_pruner(settings),
        )

    def retell(self, trials: Sequence[TrialRecord], distributions: Mapping[str, Any], taken: int = 0) -> None:
        """Tell a new study the recorded ``trials``, each under its own number (a number up to ``taken`` left
        without a record is told as failed: the next trial is numbered past it), and queue the hyperparameters of
        the interrupted ones to be tried again."""
        import optuna
        from optuna.trial import TrialState

        by_number = {t.number: t for t in trials}
        for number in range(1, max(max(by_number, default=0), taken) + 1):  # the study numbers them from 0, in turn
            trial = by_number.get(number)
            if trial is None or trial.status not in ENDED:
                self.study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
                continue
            unknown = set(trial.params) - set(distributions)
            if unknown:
                raise BadInputError(
                    f"trial {number} of the search drew {', '.join(sorted(unknown))}, which the build function no"
                    " longer declares: resume with the build function the search started with"
                )
            state = {
                TrialStatus.COMPLETED: TrialState.COMPLETE,
                TrialStatus.PRUNED: TrialState.PRUNED,
                TrialStatus.FAILED: TrialState.FAIL,
            }[trial.status]
            self.study.add_trial(
                optuna.trial.create_trial(
                    state=state,
                    value=trial.value if state == TrialState.COMPLETE else None,
                    params=trial.params,
                    distributions={name: distributions[name] for name in trial.params},
                    system_attrs=trial.engine,
                    intermediate_values={
                        epoch + 1: value for epoch, value in enumerate(trial.history.get(self.objective, []))
                    },
                )
            )
        told = len(self.study.trials)
        if told:  # draws that go on from those told, not the first session's over again
            self.study.sampler = optuna.samplers.TPESampler(seed=self.seed + told)
        for trial in trials:
            if trial.status == TrialStatus.INTERRUPTED:
                self.study.enqueue_trial(trial.params, skip_if_exists=True)

    def ask(self, distributions: Mapping[str, Any]) -> Any:
        """A new trial, its draw over ``distributions`` made (``trial.params``; its number: ``trial_number(trial)``)."""
        return self.study.ask(dict(distributions))

    def report(self, trial: Any, epoch: int, value: float) -> bool:
        """Tell the objective at the end of ``epoch`` (1 on); whether the pruner stops the trial there."""
        trial.report(value, epoch)
        return bool(trial.should_prune())

    def tell(self, trial: Any, status: TrialStatus, value: float | None) -> dict[str, Any]:
        """Tell how a trial ended; the pruner's state of it, to record."""
        from optuna.trial import TrialState

        if status == TrialStatus.COMPLETED and value is not None:
            frozen = self.study.tell(trial, value)
        elif status == TrialStatus.PRUNED:
            frozen = self.study.tell(trial, state=TrialState.PRUNED)
        else:
            frozen = self.study.tell(trial, state=TrialState.FAIL)
        return dict(frozen.system_attrs)
