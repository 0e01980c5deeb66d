"""The search's parts that need no cloud: a KerasTuner space as Optuna draws it, the engine's pruning and its
rebuilding from recorded trials, the records' summary, a trial's progress line, the command's refusals and the
report page."""

from __future__ import annotations

import math
from pathlib import Path

import keras
import pytest

from slsml.cli import tune as cli_tune
from slsml.cli import tune_report
from slsml.cli.display_tune import print_search
from slsml.cli.main import main
from slsml.client.tune import measured_price, progress_line
from slsml.search import space
from slsml.search.engine import Engine, trial_number
from slsml.search.records import TrialRecord, TrialStatus, summarize
from slsml.spec.errors import BadInputError

from .searches import search_settings


def build_model(hp) -> keras.Model:
    model = keras.Sequential([keras.Input((4,))])
    if hp.Boolean("hidden"):
        with hp.conditional_scope("hidden", [True]):
            model.add(keras.layers.Dense(hp.Int("units", 4, 64, step=4), activation=hp.Choice("act", ["relu", "tanh"])))
    model.add(keras.layers.Dense(1, activation="sigmoid"))
    rate = hp.Float("learning_rate", 1e-4, 1e-1, sampling="log")
    hp.Fixed("epsilon", 1e-7)
    model.compile(optimizer=keras.optimizers.Adam(rate), loss="binary_crossentropy")
    return model


def _trial(number: int, status: TrialStatus, values: list[float], **changes) -> TrialRecord:
    fields = dict(
        number=number,
        run_id=f"cancer-t{number}",
        hyperparameters={"learning_rate": 0.01 * number, "hidden": False},
        params={"learning_rate": 0.1 * number, "hidden": False},
        status=status,
        history={"val_auc": values},
        value=(max(values) if status == TrialStatus.COMPLETED else values[-1]) if values else None,
        started_at=100.0 + number,
        ended_at=110.0 + 2 * number,
        wall_s=10.0 + number,
        cost_usd=0.001,
    )
    return TrialRecord(**(fields | changes))


def test_a_kerastuner_space_is_drawn_as_kerastuner_would_draw_it() -> None:
    hp = space.hyperparameters()
    space.build(build_model, hp)
    declared = space.declared(hp)
    drawn = space.distributions(declared)
    assert set(drawn) == {"hidden", "learning_rate"}  # the defaults leave the scope inactive; Fixed is not drawn
    assert drawn["hidden"].choices == (False, True)
    assert (drawn["learning_rate"].low, drawn["learning_rate"].high) == (0.0, 1.0)
    # a probability in KerasTuner's log space: the middle of 1e-4..1e-1 is their geometric mean
    assert space.values(declared, {"learning_rate": 0.5})["learning_rate"] == pytest.approx(10**-2.5)
    trial = space.hyperparameters({"hidden": True, "units": 33, "act": "tanh", "learning_rate": 0.01})
    model = space.build(build_model, trial)
    assert model.layers[0].units == 33 and model.layers[0].activation.__name__ == "tanh"
    declared |= space.declared(trial)  # the scope's hyperparameters join the space once a trial opens it
    assert set(space.distributions(declared)) == {"hidden", "learning_rate", "units", "act"}
    assert (
        space.values(declared, {"units": 1.0})["units"] == 64 and space.values(declared, {"units": 0.0})["units"] == 4
    )
    assert space.chosen(space.hyperparameters({"hidden": False, "units": 8})) == {}  # nothing declared yet
    shut = space.hyperparameters({"hidden": False, "units": 8})
    space.build(build_model, shut)
    assert set(space.chosen(shut)) == {"hidden", "learning_rate", "epsilon"}  # units: its scope is shut


def test_a_build_function_that_returns_no_model_is_refused() -> None:
    with pytest.raises(BadInputError, match="not a Keras model"):
        space.build(lambda hp: hp.Int("units", 1, 4), space.hyperparameters())


@pytest.mark.parametrize("pruner", ["asha", "hyperband"])
def test_the_pruner_stops_trials_that_fall_behind_at_a_rung(pruner: str) -> None:
    settings = search_settings(pruner=pruner)
    engine = Engine(settings)
    hp = space.hyperparameters()
    space.build(build_model, hp)
    distributions = space.distributions(space.declared(hp))
    stopped = []
    for number, level in enumerate([0.9, 0.5, 0.95, 0.4, 0.3, 0.97, 0.2, 0.1], start=1):
        trial = engine.ask(distributions)
        assert trial_number(trial) == number  # counted from 1
        for epoch in range(1, settings.epochs + 1):
            if engine.report(trial, epoch, level + 0.001 * epoch):
                stopped.append(number)
                engine.tell(trial, TrialStatus.PRUNED, None)
                break
        else:
            engine.tell(trial, TrialStatus.COMPLETED, level + 0.006)
    assert stopped and 1 not in stopped and 6 not in stopped  # the first and the best go on; weaker ones stop
    assert set(stopped) <= {2, 4, 5, 7, 8}


def test_a_rebuilt_engine_keeps_the_trials_numbers_and_tries_an_interrupted_trials_draw_again() -> None:
    settings = search_settings(pruner="asha")
    hp = space.hyperparameters()
    space.build(build_model, hp)
    distributions = space.distributions(space.declared(hp))
    recorded = [
        _trial(1, TrialStatus.COMPLETED, [0.9, 0.95]),
        _trial(2, TrialStatus.PRUNED, [0.5], engine={"completed_rung_0": 0.5}),
        _trial(4, TrialStatus.INTERRUPTED, [0.7], params={"learning_rate": 0.25, "hidden": True}),
        _trial(5, TrialStatus.FAILED, []),
    ]
    engine = Engine(settings)
    engine.retell(recorded, distributions)
    told = engine.study.get_trials(deepcopy=False)
    assert [t.number for t in told] == [0, 1, 2, 3, 4, 5]
    assert [t.state.name for t in told] == ["COMPLETE", "PRUNED", "FAIL", "FAIL", "FAIL", "WAITING"]
    assert told[0].value == 0.95 and told[0].intermediate_values == {1: 0.9, 2: 0.95}
    assert told[1].system_attrs["completed_rung_0"] == 0.5  # the pruner's rung, as it was
    again = engine.ask(distributions)
    assert trial_number(again) == 6 and again.params == {"learning_rate": 0.25, "hidden": True}
    cut = Engine(settings)  # trial 7's run prepared, its record never written: the next is trial 8
    cut.retell(recorded, distributions, taken=7)
    assert trial_number(cut.ask(distributions)) == 8
    with pytest.raises(BadInputError, match="no longer declares"):
        Engine(settings).retell([_trial(1, TrialStatus.COMPLETED, [0.9], params={"depth": 0.3})], distributions)


def test_the_summary_names_the_best_completed_trial_by_the_objectives_direction() -> None:
    trials = [
        _trial(1, TrialStatus.COMPLETED, [0.90, 0.93]),
        _trial(2, TrialStatus.PRUNED, [0.99]),  # better, but stopped: it has no trained model
        _trial(3, TrialStatus.COMPLETED, [0.91, 0.96, 0.95]),
        _trial(4, TrialStatus.INTERRUPTED, [0.97], cost_usd=0.004),
    ]
    summary = summarize(search_settings(), trials, 12.5, None)
    best = summary.best_trial
    assert best is not None  # the trial, as KerasTuner's oracle gives it
    assert (best.number, best.run_id, best.score, summary.best_value) == (3, "cancer-t3", 0.96, 0.96)
    assert summary.best_hyperparameters == best.hyperparameters == trials[2].hyperparameters
    assert [t.number for t in summary.trials] == [1, 2, 3] and [t.number for t in summary.interrupted] == [4]
    assert summary.spent_usd == pytest.approx(0.007)  # the interrupted trial's spend counts
    lowest = summarize(search_settings(objective="val_loss", direction="min"), trials, 1.0, None)
    assert (
        lowest.best_trial is not None and lowest.best_trial.number == 1
    )  # val_loss: the lower the better (its "val_auc" history aside, value 0.93)


def test_settings_refuse_a_name_that_makes_no_run_id_and_an_objective_that_is_not_a_validation_figure() -> None:
    with pytest.raises(ValueError, match="lowercase letters"):
        search_settings(name="Cancer_Search")
    with pytest.raises(ValueError, match="validation figure"):
        search_settings(objective="auc")
    assert search_settings().monitor == "test_auc" and search_settings(validation="split").monitor == "val_auc"


def test_a_trials_line_says_how_it_ended_its_time_dollars_objective_and_hyperparameters() -> None:
    settings = search_settings()
    best = _trial(3, TrialStatus.COMPLETED, [0.91, 0.96])
    assert progress_line(best, settings, best, 2) == (
        "Trial 3 (2/8) - completed - 2 epochs - 13.0s - $0.001 - val_auc: 0.9600 (best) - learning_rate: 0.03"
        " - hidden: False"
    )
    pruned = _trial(2, TrialStatus.PRUNED, [0.5])
    assert progress_line(pruned, settings, best, 3).startswith("Trial 2 (3/8) - pruned at epoch 1 - 12.0s")


def test_the_next_trials_price_is_the_completed_trials_mean_cost_once_one_completed() -> None:
    assert measured_price([_trial(1, TrialStatus.PRUNED, [0.5], cost_usd=0.0004)]) is None  # the plan's, then
    price, why = measured_price(
        [
            _trial(1, TrialStatus.COMPLETED, [0.9], cost_usd=0.0014),
            _trial(2, TrialStatus.PRUNED, [0.5], cost_usd=0.0004),  # stopped short of a whole trial
            _trial(3, TrialStatus.COMPLETED, [0.9], cost_usd=0.0017),
        ]
    ) or (None, "")
    assert price == pytest.approx(0.00155) and why == "as the mean of 2 completed trials"
    assert measured_price([_trial(1, TrialStatus.COMPLETED, [0.9], cost_usd=0.0014)]) == (
        pytest.approx(0.0014),
        "as the mean of 1 completed trial",
    )


def test_the_table_counts_the_trials_from_one_and_names_the_best(capsys: pytest.CaptureFixture) -> None:
    print_search(summarize(search_settings(), [_trial(1, TrialStatus.COMPLETED, [0.9, 0.93])], 3.0, None), False)
    out = capsys.readouterr().out
    assert "1 trial in 3.0 s" in out and "best: trial 1, val_auc 0.9300" in out and "run cancer-t1" in out
    two = [_trial(1, TrialStatus.COMPLETED, [0.9]), _trial(2, TrialStatus.COMPLETED, [0.95])]
    print_search(summarize(search_settings(), two, 4.0, None), False)
    assert "2 trials in 4.0 s" in capsys.readouterr().out


def test_the_build_flag_names_what_is_wrong_with_it(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("import math\n\ndef build_model(hp):\n    return math.pi\n")
    with pytest.raises(BadInputError, match=r"FILE\.py:FUNCTION"):
        cli_tune.load_build(str(tmp_path / "model.py"))
    with pytest.raises(BadInputError, match="no file"):
        cli_tune.load_build(f"{tmp_path / 'absent.py'}:build_model")
    with pytest.raises(BadInputError, match="no function 'build'"):
        cli_tune.load_build(f"{tmp_path / 'model.py'}:build")
    assert cli_tune.load_build(f"{tmp_path / 'model.py'}:build_model")(None) == math.pi


def test_tune_without_a_service_or_stack_says_how_to_start_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--build", "model.py:build_model", "--data", "cancer"]) == 2
    assert "slsml local up" in capsys.readouterr().err


def test_the_report_shows_each_trial_how_it_ended_and_the_best(tmp_path: Path) -> None:
    trials = [
        _trial(1, TrialStatus.COMPLETED, [0.90, 0.93]),
        _trial(2, TrialStatus.PRUNED, [0.5], reason="stopped at epoch 1 of 6"),
        _trial(3, TrialStatus.FAILED, [], reason="its run ended FAILED: out of memory"),
    ]
    summary = summarize(search_settings(budget_usd=0.01), trials, 20.0, "the next trial would pass the budget")
    page = tune_report.write_report(summary, tmp_path / "report")
    text = page.read_text()
    assert (tmp_path / "report" / tune_report.TRIALS).stat().st_size > 0
    assert (tmp_path / "report" / tune_report.OBJECTIVE).stat().st_size > 0
    assert "1 ★" in text and "epoch 1, " in text and "out of memory" in text
    assert "the next trial would pass the budget" in text and "$0.003 of $0.01" in text


def test_a_resumed_search_draws_hyperparameters_it_has_not_tried() -> None:
    settings = search_settings(pruner="none")
    hp = space.hyperparameters()
    space.build(build_model, hp)
    distributions = space.distributions(space.declared(hp))
    first = Engine(settings)
    tried = []
    for number in range(1, 4):
        trial = first.ask(distributions)
        first.tell(trial, TrialStatus.COMPLETED, 0.9)
        tried.append(_trial(number, TrialStatus.COMPLETED, [0.9], params=trial.params))
    resumed = Engine(settings)
    resumed.retell(tried, distributions)
    drawn = resumed.ask(distributions)
    assert trial_number(drawn) == 4 and drawn.params not in [t.params for t in tried]


def test_keras_tuners_own_random_search_runs_with_the_installed_dependencies(tmp_path: Path) -> None:
    """A build function written for slsml.tune runs under KerasTuner's own tuner too (which needs tensorboard)."""
    import keras_tuner
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = (x.sum(1) > 0).astype("float32")
    tuner = keras_tuner.RandomSearch(
        build_model, objective="val_loss", max_trials=2, directory=tmp_path, project_name="search", seed=0
    )
    tuner.search(x, y, epochs=2, validation_split=0.25, verbose=0)
    trials = tuner.oracle.get_best_trials(num_trials=2)
    assert len(trials) == 2
    assert all(trial.status == "COMPLETED" and math.isfinite(trial.score) for trial in trials)
    assert tuner.get_best_models(1)[0].predict(x, verbose=0).shape == (64, 1)
