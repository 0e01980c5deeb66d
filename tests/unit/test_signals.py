"""A step Ctrl-C must not cut in two runs whole; the signal is handled as it ends, a second at once: a search's
trial that ended is recorded whole."""

from __future__ import annotations

import os
import signal
import time
import types

import pytest

from slsml.client import tune
from slsml.client.signals import held_until_done
from slsml.search import records
from slsml.search.engine import Engine, trial_number
from slsml.search.records import TrialStatus
from slsml.spec.config import RunConfig

from .searches import search_settings


@pytest.fixture(autouse=True)
def python_s_own_handlers():
    """Python's own Ctrl-C handler and the default SIGTERM action for each test, whatever an earlier test of the
    process installed (the CLI's ``main`` ends the process a few seconds after a Ctrl-C), restored after it."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_ctrl_c_during_a_held_step_is_handled_once_the_step_ends() -> None:
    done, handler = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), held_until_done():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("the rest of the step")
    assert done == ["the rest of the step"]
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_second_ctrl_c_during_a_held_step_is_handled_at_once() -> None:
    done, handler = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), held_until_done():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("after the first")
        os.kill(os.getpid(), signal.SIGINT)
        done.append("after the second")
    assert done == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_step_no_signal_reached_leaves_the_handlers_as_they_were() -> None:
    handler = signal.getsignal(signal.SIGTERM)
    with held_until_done():
        pass
    assert signal.getsignal(signal.SIGTERM) is handler


def test_ctrl_c_while_a_trial_is_recorded_leaves_it_recorded_and_no_longer_followed(services) -> None:
    """A search's trial that ended is recorded whole: Ctrl-C as its cost is read is handled once its record is kept
    (a trial popped from those followed and never recorded would be lost to the search and to its resume)."""
    settings = search_settings(name="held", dataset="d", max_trials=2, parallel=2, epochs=1, batch_size=8)
    search = tune._Search.__new__(tune._Search)  # the parts of a search that recording a trial uses
    search.services, search.settings, search.records, search.say = services, settings, [], lambda line: None
    search.engine = Engine(settings)
    trial = search.engine.ask({})
    running = tune._Running(trial, trial_number(trial), settings.run_id(trial_number(trial)), {}, time.time(), 1, None)
    search.running = {running.number: running}

    def cost_as_ctrl_c_comes(run_id: str, status: TrialStatus) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        return None

    search._cost = cost_as_ctrl_c_comes
    with pytest.raises(KeyboardInterrupt):
        search._end(running, TrialStatus.COMPLETED, None)
    assert [t.number for t in records.load_trials(services.store, "held")] == [running.number]
    assert search.running == {}


def test_ctrl_c_while_a_trial_launches_leaves_its_run_launched_and_followed(services, monkeypatch) -> None:
    """A trial's launch is whole: Ctrl-C as its execution starts is handled once its run is registered and the search
    follows it, so that the interruption stops it (a launch cut in two left a run starting that the search did not
    stop)."""
    import keras

    def build(hp: object) -> keras.Model:
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return model

    settings = search_settings(
        name="launched", dataset="d", objective="val_loss", direction="min", max_trials=1, parallel=1, epochs=1
    )
    search = tune._Search(types.SimpleNamespace(services=services), build, settings, lambda line: None, None)
    launched = []

    def launch_as_ctrl_c_comes(services: object, config: RunConfig, stored: bytes | None = None) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the execution starts and registers the run
        launched.append(config.run_id)

    monkeypatch.setattr(tune.launch, "launch_run", launch_as_ctrl_c_comes)
    with pytest.raises(KeyboardInterrupt):
        search._start()
    assert launched == [settings.run_id(1)]
    assert [running.run_id for running in search.running.values()] == launched
