"""``slsml.tune``: a hyperparameter search as KerasTuner users write one, each trial a run of its own.

``build_model(hp)`` declares the search space with KerasTuner's ``HyperParameters`` and returns a compiled model. The
data is stored once, as one dataset every trial trains on; up to ``parallel`` trials run at once, each a run with its
own workers, record and cost, on the local service (``slsml local up``), a deployed stack, or else a local runtime of
the call's own. Optuna's TPE sampler draws each trial's hyperparameters and its pruner (Hyperband by default) is told
each trial's objective at each epoch's end as the run's evaluation lands; a trial it stops is stopped as ``slsml run
stop`` stops a run. With a dollar budget the plan prices each trial before it starts: the search starts none that
would take its spend past the budget, and stops its trials once their spend reaches it. Each trial is recorded in the
bucket as it ends (``slsml.search.records``), so that an interrupted search goes on from there (``resume``).
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from slsml.accounting import prices
from slsml.accounting import usage as accounting
from slsml.client import runs, signals
from slsml.client.arguments import check_keywords, said_as_keywords, training_spec
from slsml.data import datasets as data
from slsml.data.manifest import DatasetManifest
from slsml.pipeline import launch
from slsml.pipeline.services import Services
from slsml.search import records, space
from slsml.search.engine import Engine, trial_number
from slsml.search.records import Pruner, SearchSettings, SearchSummary, TrialRecord, TrialStatus, Validation
from slsml.spec import keys, samples
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError, SlsmlError
from slsml.spec.samples import Arrays
from slsml.state.records import RunRecord, RunStatus

POLL_S = 0.2  # how often the running trials' records are read
LOGS_DIR = Path(".slsml/logs")  # a search on a local runtime of its own: its functions' logs, .slsml/logs/<name>
# how a build function of `slsml tune` (which has no --loss or --optimizer) gives what its model is not compiled with
BUILD_MISSING = {piece: f"compile({piece}=…) in the build function" for piece in ("loss", "optimizer")}
TRIAL_DEFAULTS = {"workers": 2, "reducers": 1}  # a trial's run, unless the search's options say otherwise
SEARCH_DEFAULTS = SearchSettings.model_fields  # a search's trials, parallel, epochs and batch, as `slsml tune`'s


class TuneResult(SearchSummary):
    """A search's summary (``trials``, ``best_hyperparameters``, ``best_value``…) and its best trial's model,
    loaded with its trained weights (``best_model``: None where no trial completed)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    best_model: Any = Field(default=None, exclude=True)


INTERRUPTED = "the search was interrupted"


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a search: every trial it had running is stopped; ``result`` holds what it had."""

    def __init__(self, message: str, result: TuneResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class Target:
    """Where a search runs: its services, how to read a run's usage lines, and whether its bucket outlives the
    search (a local runtime of the call's own does not: such a search cannot be resumed)."""

    services: Services
    usage: Callable[[RunRecord], list[accounting.UsageRecord]]
    kept: bool = True


@said_as_keywords
def tune(
    build_model: space.BuildModel,
    x: Arrays | None,
    y: Arrays | None,
    *,
    max_trials: int = SEARCH_DEFAULTS["max_trials"].default,
    parallel: int = SEARCH_DEFAULTS["parallel"].default,
    epochs: int = SEARCH_DEFAULTS["epochs"].default,
    batch_size: int = SEARCH_DEFAULTS["batch_size"].default,
    validation_data: tuple[Arrays, Arrays] | None = None,
    validation_split: float | None = None,
    objective: str = "val_loss",
    workers: int = TRIAL_DEFAULTS["workers"],
    budget_usd: float | None = None,
    stack: str | None = None,
    name: str | None = None,
    resume: bool = False,
    pruner: Pruner = "hyperband",
    seed: int = 0,
    verbose: int = 1,
    loss: Any = None,
    optimizer: Any = None,
    metrics: Any = None,
    loss_weights: Any = None,
    **options: Any,
) -> TuneResult:
    """Search ``build_model``'s space for the hyperparameters best by ``objective`` (a ``val_`` figure), training
    each trial on ``x``, ``y`` for ``epochs`` epochs of ``batch_size`` samples with ``workers`` workers, validated on
    ``validation_data`` or the ``validation_split`` held out. ``max_trials`` trials, ``parallel`` at once, within
    ``budget_usd`` dollars if given (left out, as ``slsml tune`` leaves them: 10 trials, 2 at once, 10 epochs of
    Keras's 32 samples); ``loss``, ``optimizer`` (a name or a ``keras.optimizers`` instance), ``metrics``,
    ``loss_weights``: as ``compile`` takes them, each trial's model compiled with them in place of what the build
    function gave (as ``slsml.fit`` takes them); ``options``: the trials' other training options (``reducers=2``…;
    another keyword is a TypeError naming the closest one). ``stack``:
    run on the deployed stack of this name (else the local service if one is up, else a local runtime of the call's
    own). ``name``: the search's (its trials' runs are ``<name>-t<number>``); ``resume=True`` goes on with the search
    of that name, its data and settings as it started (``x`` and ``y`` may be None). ``verbose``: one line per trial
    on stderr (0: none). Ctrl-C stops every trial, says which and how to resume, and raises ``SearchInterrupted``
    with what the search had."""
    began = time.time()  # the result's wall_s: the whole call's, a local runtime's start too
    check_keywords("tune", options, TUNE_ARGUMENTS)
    say = _stderr if verbose else None
    if resume:
        if name is None:
            raise BadInputError("resume=True goes on with a search of a name: give name=")
        with _target(stack, None, name) as target:
            settings = records.load_settings(target.services.store, name)
            if settings is None:
                raise NotFoundError(f"no search named {name!r} where it runs ({_where(stack)})")
            return run_search(target, build_model, settings, say, began)
    if x is None or y is None:
        raise BadInputError("a new search takes the training data: x and y")
    if validation_data is None and validation_split is None:
        raise BadInputError(
            f"objective {objective}: a search ranks its trials on validation figures; give validation_data=(x_val,"
            " y_val) or validation_split=0.2"
        )
    if validation_data is not None and validation_split is not None:
        raise BadInputError("give validation_data or validation_split, not both")
    name = name or launch.new_run_id("tune")
    training = TRIAL_DEFAULTS | options | {"workers": workers}
    from slsml.training import modelio

    compiled = {"loss": loss, "optimizer": optimizer, "metrics": metrics, "loss_weights": loss_weights}
    if validation_split is not None:
        training["validation_split"] = validation_split
    x, y = samples.as_arrays(x, "x"), samples.as_arrays(y, "y")
    first = slice(1)  # the test split of a search validated on a held-out split: not evaluated
    test = validation_data or (samples.take(x, first), samples.take(y, first))
    pair = slice(2)
    settings = search_settings(
        build_model,
        (samples.take(x, pair), samples.take(y, pair)),
        name=name,
        dataset=name,
        validation="split" if validation_split is not None else "test",
        objective=objective,
        max_trials=max_trials,
        parallel=parallel,
        epochs=epochs,
        batch_size=batch_size,
        budget_usd=budget_usd,
        pruner=pruner,
        seed=seed,
        training=training,
        compiled=modelio.stored_arguments(compiled),
    )
    with _target(stack, settings, name) as target:
        records.check_new(target.services.store, name)
        data.put_dataset(target.services.store, name, x, y, *test)
        records.save_settings(target.services.store, settings)
        return run_search(target, build_model, settings, say, began)


TUNE_ARGUMENTS = tuple(inspect.signature(tune).parameters)[:-1]  # its own keywords (not ``options``)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _where(stack: str | None) -> str:
    return f"stack {stack}" if stack else "the local service"


@contextmanager
def _target(stack: str | None, settings: SearchSettings | None, name: str) -> Iterator[Target]:
    """The deployed stack ``stack``, else the local service if one is up, else (for a new search, of ``settings``)
    a local runtime of the call's own, with warm processes for its parallel trials, ended as the call ends."""
    if stack is not None:
        from slsml.client.stack import services_for_stack, usage_records

        yield Target(services_for_stack(stack), lambda run: usage_records(stack, run.run_id, run.created_at - 60))
        return
    from slsml.local import service

    state = service.status()
    if state is not None:
        with service.connected(state) as services:
            yield Target(services, lambda run: accounting.read_local(Path(state.log_dir), run.run_id))
        return
    if settings is None:
        raise NotFoundError(f"no local service is up and no stack given: search {name!r} is kept in one of them")
    from slsml.local.runtime import LocalRuntime, sized_for

    spec = TrainingSpec(**settings.training)
    with LocalRuntime(
        **sized_for(spec, settings.parallel),
        log_dir=LOGS_DIR / name,
    ) as local:
        yield Target(local.services, lambda run: accounting.read_local(local.log_dir, run.run_id), kept=False)


def search_settings(
    build_model: space.BuildModel,
    sample: tuple[Arrays, Arrays],
    *,
    name: str,
    dataset: str,
    validation: Validation,
    objective: str,
    max_trials: int,
    parallel: int,
    epochs: int,
    batch_size: int,
    budget_usd: float | None = None,
    pruner: Pruner = "hyperband",
    seed: int = 0,
    training: Mapping[str, Any] | None = None,
    build: str | None = None,
    compiled: Mapping[str, Any] | None = None,
) -> SearchSettings:
    """A new search's settings, checked: its training options, and the model ``build_model`` builds of the space's
    defaults (compiled with ``compiled``: ``modelio.stored_arguments``), which must compute the objective on
    ``sample`` (two training samples), its direction as Keras tells it."""
    training = dict(training or TRIAL_DEFAULTS)
    if validation == "split" and "validation_split" not in training:
        raise BadInputError(f"objective {objective}: validated on a held-out split, the search needs its fraction")
    training_spec({**training, "global_batch": batch_size, "epochs": epochs})  # the options, checked
    settings = SearchSettings(
        name=name,
        dataset=dataset,
        validation=validation,
        objective=objective,
        direction="min",
        max_trials=max_trials,
        parallel=parallel,
        epochs=epochs,
        batch_size=batch_size,
        budget_usd=budget_usd,
        pruner=pruner,
        seed=seed,
        training=training,
        build=build,
        compiled=dict(compiled or {}),
        started_at=time.time(),
    )
    model = trial_model(build_model, space.hyperparameters(), settings)
    return settings.model_copy(update={"direction": _direction(model, settings, sample)})


def trial_model(build_model: space.BuildModel, hp: Any, settings: SearchSettings) -> Any:
    """The model ``build_model`` builds of ``hp``, compiled with what the search was given in place of what it
    gave (``SearchSettings.compiled``); BadInputError naming what ``compile`` or the reducers refuse, or code of the
    caller's own it carries."""
    from slsml.training import modelio

    model = space.build(build_model, hp)
    if settings.compiled:
        modelio.compile_with(model, modelio.revived_arguments(settings.compiled))
        modelio.optimizer_config(model)  # one the reducers apply
    modelio.check_model_portable(model)  # code of its own the functions cannot run: refused, not every trial failed
    return model


def _direction(model: Any, settings: SearchSettings, sample: tuple[Arrays, Arrays]) -> str:
    """Whether the objective improves by falling ("min") or rising ("max"), as Keras's callbacks tell it;
    BadInputError if the model does not compute it."""
    from slsml.training import evaluation, modelio

    training = settings.training
    missing = modelio.ARGUMENTS_MISSING if settings.build is None else BUILD_MISSING
    modelio.check_compiled(
        model, loss=training.get("loss") is not None, optimizer=training.get("optimizer") is not None, missing=missing
    )
    loss = modelio.loss_config(model, settings.training.get("loss"))
    metrics = modelio.metrics_config(model, modelio.classifies(loss))
    figures = evaluation.figure_modes(model, loss, metrics, sample)
    figure = settings.objective.removeprefix("val_")
    if figure not in figures:
        computed = ", ".join(f"val_{name}" for name in figures)
        raise BadInputError(
            f"objective {settings.objective}: the model does not compute {figure!r} (it computes {computed});"
            " compile it with that metric, or name one of those"
        )
    mode = figures[figure]
    if mode is None:
        raise BadInputError(f"objective {settings.objective}: Keras cannot tell whether {figure} should fall or rise")
    return mode


def trial_spec(settings: SearchSettings, manifest: DatasetManifest, budget_usd: float | None) -> TrainingSpec:
    """A trial's run: the search's epochs, batch and training options, its final model the epoch best by the
    objective (as KerasTuner keeps a trial's best epoch), its validation figures at each epoch's end, and its share
    of the search's budget (``budget_usd``: its functions count their spend)."""
    spec = TrainingSpec(
        **settings.training,
        global_batch=settings.batch_size,
        epochs=settings.epochs,
        keep_best=settings.monitor,
        budget_usd=budget_usd,
    )
    per_epoch = launch.with_epochs(spec, manifest.train.count).iterations // settings.epochs
    return spec.model_copy(update={"eval_every": per_epoch if settings.validation == "test" else 0})


def measured_price(trials: Sequence[TrialRecord]) -> tuple[float, str] | None:
    """What a whole trial costs as the search measured it, the mean cost of its completed ``trials`` (a pruned or
    failed one stopped short of a whole trial), and how it was set; None before any completed."""
    costs = [t.cost_usd for t in trials if t.status == TrialStatus.COMPLETED and t.cost_usd is not None]
    if not costs:
        return None
    return sum(costs) / len(costs), f"as the mean of {counted(len(costs), 'completed trial')}"


@dataclass
class _Running:
    """A trial whose run is running, and what the search has read of it."""

    trial: Any  # Optuna's
    number: int  # the search's, from 1
    run_id: str
    hyperparameters: dict[str, Any]
    started_at: float
    per_epoch: int
    predicted_usd: float | None
    history: dict[str, list[float]] = field(default_factory=dict)


def run_search(
    target: Target,
    build_model: space.BuildModel,
    settings: SearchSettings,
    say: Callable[[str], None] | None,
    began: float | None = None,
) -> TuneResult:
    """Run (or go on with) the search ``settings`` describes until it has ``max_trials`` trials ended, or its budget
    stops it; ``say``: its progress lines (and, on Ctrl-C, what it stopped and how it goes on); ``began``: when the
    call started, which its ``wall_s`` counts from (default now)."""
    return _Search(target, build_model, settings, say or (lambda line: None), began).run()


class _Search:
    """A search under way: its engine, its running trials and its recorded ones."""

    def __init__(
        self,
        target: Target,
        build_model: space.BuildModel,
        settings: SearchSettings,
        say: Callable[[str], None],
        began: float | None,
    ) -> None:
        self.target, self.services, self.settings = target, target.services, settings
        self.build_model, self.say = build_model, say
        self.manifest = data.load_manifest(self.services.store, settings.dataset)
        defaults = space.hyperparameters()
        space.build(build_model, defaults)
        self.space = space.declared(defaults)
        self.records = records.load_trials(self.services.store, settings.name)
        self.engine = Engine(settings)
        taken = max((t.number for t in self.records), default=0)
        while self.services.store.exists(keys.run_config(settings.run_id(taken + 1))):  # prepared, cut short unstarted
            taken += 1
        self.engine.retell(self.records, space.distributions(self.space), taken)
        self.running: dict[int, _Running] = {}
        self.stopped_starting: str | None = None
        self.began = time.time() if began is None else began

    def run(self) -> TuneResult:
        """Start trials while fewer than ``parallel`` run, follow them, until the search is done; on Ctrl-C (or any
        error) stop every trial it started and record them as interrupted."""
        try:
            while self.running or (self.stopped_starting is None and self._ended() < self.settings.max_trials):
                while (
                    self.stopped_starting is None
                    and len(self.running) < self.settings.parallel
                    and self._ended() + len(self.running) < self.settings.max_trials
                ):
                    self._start()
                for number in list(self.running):
                    self._follow(number)
                self._hold_budget()
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            raise SearchInterrupted(self._interrupt(), self._result(best_model=False)) from None
        except BaseException:
            self._interrupt()
            raise
        return self._result(best_model=True)

    def _ended(self) -> int:
        return sum(1 for t in self.records if t.status in records.ENDED)

    def _start(self) -> None:
        """Start the next trial: its draw, its model, its price against the budget, its run."""
        started_at = time.time()
        trial = self.engine.ask(space.distributions(self.space))
        hp = space.hyperparameters(space.values(self.space, trial.params))
        model = trial_model(self.build_model, hp, self.settings)
        self.space |= space.declared(hp)  # hyperparameters of a conditional scope join the space as they appear
        number = trial_number(trial)
        running = _Running(trial, number, self.settings.run_id(number), space.chosen(hp), started_at, 1, None)
        from slsml.training import modelio

        model_bytes = modelio.save_model(model)
        share = None
        try:
            # a trial the search follows has a registered run, which Ctrl-C stops: the launch is not cut in two (a
            # second Ctrl-C ends the command at once)
            with signals.held_until_done(), _retraced_quietly():
                if self.settings.budget_usd is not None:
                    share = self._priced(running, model_bytes)
                    if share is None:
                        return
                spec = trial_spec(self.settings, self.manifest, share)
                per_epoch = launch.with_epochs(spec, self.manifest.train.count).iterations // self.settings.epochs
                running.per_epoch = per_epoch
                config = launch.prepare_run(self.services, model_bytes, self.settings.dataset, spec, running.run_id)
                self.running[number] = running
                launch.launch_run(self.services, config)
        except SlsmlError as error:
            self.running.pop(number, None)
            self._end(running, TrialStatus.FAILED, str(error))

    def _priced(self, running: _Running, model_bytes: bytes) -> float | None:
        """The trial's share of the budget (what is left of it), or None where its price would take the search past
        its budget: the search then starts no more trials."""
        assert self.settings.budget_usd is not None
        running.predicted_usd, priced_by = self._price(model_bytes)
        committed = self._committed()
        if committed + running.predicted_usd <= self.settings.budget_usd:
            return self.settings.budget_usd - committed
        self.stopped_starting = (
            f"the next trial, priced {prices.usd(running.predicted_usd)} {priced_by}, would take the search past"
            f" its budget: {prices.usd(committed)} of {prices.usd(self.settings.budget_usd)} spent or committed"
        )
        self.engine.tell(running.trial, TrialStatus.FAILED, None)
        self.say(f"no more trials: {self.stopped_starting}")
        return None

    def _price(self, model_bytes: bytes) -> tuple[float, str]:
        """The next trial's price, and what set it: what a whole trial costs as measured (``measured_price``),
        else, before any trial completed, the plan's prediction of the trial."""
        measured = measured_price(self.records)
        if measured is not None:
            return measured
        from slsml.cost import budget

        spec = launch.with_epochs(trial_spec(self.settings, self.manifest, None), self.manifest.train.count)
        return budget.predict(model_bytes, self.manifest, spec, self.services.limits), "by the plan"

    def _committed(self) -> float:
        """The ended trials' cost and, of each running one, the most of its price and its spend so far."""
        ended = sum(t.cost_usd or 0.0 for t in self.records)
        return ended + sum(
            max(r.predicted_usd or 0.0, self.services.table.spent(r.run_id)) for r in self.running.values()
        )

    def _hold_budget(self) -> None:
        """Stop the running trials once the search's spend reaches its budget (each trial's run also stops at its
        share of it)."""
        budget = self.settings.budget_usd
        if budget is None or not self.running:
            return
        spent = sum(t.cost_usd or 0.0 for t in self.records)
        spent += sum(self.services.table.spent(r.run_id) for r in self.running.values())
        if spent < budget:
            return
        self.stopped_starting = f"the search spent {prices.usd(spent)} of its {prices.usd(budget)} budget"
        for number in list(self.running):
            running = self.running[number]
            self.services.stop_run(running.run_id, f"budget: {self.stopped_starting}")
            self._end(running, TrialStatus.FAILED, f"budget: {self.stopped_starting}")

    def _follow(self, number: int) -> None:
        """Read a running trial's new epochs (telling the pruner each), and end it if its run ended or the pruner
        stops it."""
        running = self.running[number]
        run = self.services.table.get_run(running.run_id)
        for epoch, value in self._new_epochs(running):
            stop = self.engine.report(running.trial, epoch, value)
            if stop and epoch < self.settings.epochs and run.status == RunStatus.RUNNING:  # done training: kept
                with signals.held_until_done():  # a run the pruner stopped is recorded pruned, Ctrl-C or not
                    stopped = self.services.stop_run(running.run_id, f"pruned at epoch {epoch} by the search")
                    if stopped:
                        self._end(running, TrialStatus.PRUNED, f"stopped at epoch {epoch} of {self.settings.epochs}")
                if stopped:
                    return
        if run.status == RunStatus.COMPLETED:
            self._end(running, TrialStatus.COMPLETED, None)
        elif run.status in runs.TERMINAL:
            self._end(running, TrialStatus.FAILED, f"its run ended {run.status.value}: {run.reason}")

    def _new_epochs(self, running: _Running) -> Iterator[tuple[int, float]]:
        """The epochs (1 on) whose objective has landed since the last read, with it: the figures the run's
        evaluation at the epoch's end recorded on its last iteration's counter."""
        objective = self.settings.objective
        while (done := len(running.history.get(objective, []))) < self.settings.epochs:
            counter = self.services.table.get_counter(running.run_id, (done + 1) * running.per_epoch - 1)
            figures = counter.val if self.settings.validation == "split" else counter.test
            if not figures or objective.removeprefix("val_") not in figures:
                return
            for name, value in figures.items():
                running.history.setdefault(f"val_{name}", []).append(value)
            yield done + 1, running.history[objective][-1]

    def _end(self, running: _Running, status: TrialStatus, reason: str | None) -> None:
        """Record a trial that ended (told to the engine, kept in the bucket), and say so: whole, as Ctrl-C comes (a
        trial is followed until its record is kept, so that an interruption never loses one)."""
        with signals.held_until_done():
            values = running.history.get(self.settings.objective, [])
            value = None
            if status == TrialStatus.COMPLETED and values:
                value = max(values) if self.settings.direction == "max" else min(values)
            elif status == TrialStatus.PRUNED and values:
                value = values[-1]
            engine = self.engine.tell(running.trial, status, value)
            ended_at = time.time()
            record = TrialRecord(
                number=running.number,
                run_id=running.run_id,
                hyperparameters=running.hyperparameters,
                params=dict(running.trial.params),
                status=status,
                reason=reason,
                history=running.history,
                value=value,
                started_at=running.started_at,
                ended_at=ended_at,
                wall_s=round(ended_at - running.started_at, 3),
                cost_usd=self._cost(running.run_id, status),
                predicted_usd=running.predicted_usd,
                engine=engine,
            )
            records.save_trial(self.services.store, self.settings.name, record)
            self.records.append(record)
            self.running.pop(running.number, None)
            self.say(progress_line(record, self.settings, self._best(), self._ended()))

    def _cost(self, run_id: str, status: TrialStatus) -> float | None:
        """What the trial's run spent: as its functions counted it (a run with a share of a budget), else its usage
        lines priced (not read as a search is interrupted: they take a while); None where it has no run."""
        try:
            run = self.services.table.get_run(run_id)
        except NotFoundError:
            return None
        if run.training.budget_usd is not None:
            return self.services.table.spent(run_id)
        if status == TrialStatus.INTERRUPTED:
            return None
        used = self.target.usage(run)
        return sum(accounting.cost(used, prices.load()).values()) if used else None

    def _best(self) -> TrialRecord | None:
        return records.summarize(self.settings, self.records, 0.0, None).best_trial

    def _interrupt(self) -> str:
        """Stop every trial the search started (each run as `slsml run stop` stops it), say which and how the search
        goes on, then record them; that line. Said before the records are written (they read the runs' spend): a
        command ends a few seconds after Ctrl-C, or at once on a second, whatever it is doing."""
        unstopped = [n for n, r in self.running.items() if not self.services.stop_run(r.run_id, INTERRUPTED)]
        ended = [n for n in unstopped if self._ended_before_the_stop(self.running[n].run_id)]
        for run in self.services.table.list_runs():  # one whose launch a second Ctrl-C cut short
            if run.run_id.startswith(f"{self.settings.name}-t") and run.status == RunStatus.RUNNING:
                self.services.stop_run(run.run_id, INTERRUPTED)
        stopped = sorted(set(self.running) - set(ended))
        goes_on = (
            f"`slsml tune --resume {self.settings.name}` or slsml.tune(…, name={self.settings.name!r}, resume=True)"
            " goes on"
            if self.target.kept
            else "its local runtime ended with it"
        )
        which = f" ({', '.join(map(str, stopped))})" if stopped else ""
        line = (
            f"interrupted: search {self.settings.name} stopped {counted(len(stopped), 'running trial')}{which} after"
            f" {self._ended() + len(ended)} of {self.settings.max_trials} ended; {goes_on}"
        )
        self.say(line)
        for number in ended:  # its run ended before the stop: recorded as it ended
            self._follow(number)
        for running in list(self.running.values()):
            self._end(running, TrialStatus.INTERRUPTED, "stopped as the search was interrupted")
        return line

    def _ended_before_the_stop(self, run_id: str) -> bool:
        """Whether a trial's run, which Ctrl-C could not stop, had ended on its own (not: its launch was cut short
        before the run was registered)."""
        try:
            return self.services.table.get_run(run_id).status in runs.TERMINAL
        except NotFoundError:
            return False

    def _result(self, best_model: bool) -> TuneResult:
        summary = records.summarize(self.settings, self.records, time.time() - self.began, self.stopped_starting)
        model = None
        if best_model and summary.best_trial is not None:
            from slsml.training import modelio

            best = summary.best_trial
            run = self.services.table.get_run(best.run_id)
            model = modelio.load_model(runs.final_model(self.services, run), where=f"trial {best.number}'s model")
        return TuneResult(**dict(summary), best_model=model)


@contextmanager
def _retraced_quietly() -> Iterator[None]:
    """TensorFlow's warning that a function was traced again kept off the terminal while the block runs: pricing
    and preparing each trial time a gradient step of a model of its own, traced once each, as they should be."""
    import logging

    logger = logging.getLogger("tensorflow")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def progress_line(trial: TrialRecord, settings: SearchSettings, best: TrialRecord | None, ended: int) -> str:
    """A trial's line, as Keras prints an epoch's, with how many of the search's trials have ended (``ended``):
    ``Trial 3 (2/8) - completed - 6 epochs - 12.4s - $0.000213 - val_auc: 0.9931 (best) - learning_rate: 0.0031 -
    units: 48``."""
    epochs = trial.epochs(settings.objective)
    how = {
        TrialStatus.COMPLETED: f"completed - {epochs} epochs",
        TrialStatus.PRUNED: f"pruned at epoch {epochs}",
        TrialStatus.FAILED: "failed",
        TrialStatus.INTERRUPTED: f"interrupted at epoch {epochs}",
    }[trial.status]
    parts = [f"Trial {trial.number} ({ended}/{settings.max_trials})", how, f"{trial.wall_s:.1f}s"]
    if trial.cost_usd is not None:
        parts.append(prices.usd(trial.cost_usd))
    if trial.value is not None:
        parts.append(
            f"{settings.objective}: {trial.value:.4f}"
            + (" (best)" if best is not None and best.number == trial.number else "")
        )
    parts += [f"{name}: {_value(value)}" for name, value in trial.hyperparameters.items()]
    if trial.status == TrialStatus.FAILED and trial.reason:
        parts.append(trial.reason)
    return " - ".join(parts)


def _value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def counted(n: int, noun: str) -> str:
    """``n`` ``noun``s, the noun singular for one: "1 trial", "3 trials"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
