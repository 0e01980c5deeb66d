"""The limits an operator sets on every run of a deployment: a run beyond one is refused naming it, by the client
before anything is stored and by the pipeline whatever started the run (against moto)."""

from __future__ import annotations

import dataclasses

import pytest

from slsml.pipeline import launch
from slsml.pipeline.services import Services
from slsml.pipeline.steps import work_launcher
from slsml.pipeline.steps.work_launcher import Outcome
from slsml.spec import keys
from slsml.spec.config import DropInRequest, RunConfig, TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.spec.limits import RunLimits
from slsml.spec.messages import ModelLanded

from .test_reduce_steps import PLAN, SGD, _put_run, services  # noqa: F401

LIMITS = RunLimits(
    workers=4, reducers=2, iterations=100, time_budget_s=3600, function_timeouts_s={"worker": 90, "reducer": 60}
)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        (TrainingSpec(workers=8, global_batch=64), "8 workers, over the deployment's limit workers=4"),
        (
            TrainingSpec(workers=2, max_workers=6),
            "6 workers, over the deployment's limit workers=4",
        ),  # run scale's bound
        (TrainingSpec(workers=2, reducers=3), "3 reducers, over the deployment's limit reducers=2"),
        (TrainingSpec(workers=2, iterations=101), "101 iterations, over the deployment's limit iterations=100"),
        (
            TrainingSpec(workers=2, time_budget_s=3601),
            "3601 s of time budget, over the deployment's limit time_budget_s=3600",
        ),
        (
            TrainingSpec(workers=2, deadline_s=89.5),
            "a deadline of 89.5 s (deadline_s, --deadline) is shorter than the worker function's 90 s timeout",
        ),
    ],
)
def test_a_run_beyond_a_limit_is_refused_naming_it(spec: TrainingSpec, named: str) -> None:
    assert named in (LIMITS.refusal(spec) or "")


def test_a_run_within_every_limit_is_not_refused() -> None:
    within = TrainingSpec(workers=4, max_workers=4, reducers=2, iterations=100, time_budget_s=3600, deadline_s=90)
    assert LIMITS.refusal(within) is None
    # the global batch bounds run scale when max_workers is not given: not a request for that many workers
    assert LIMITS.refusal(within.model_copy(update={"max_workers": None, "global_batch": 1024})) is None
    assert "5 workers" in (LIMITS.refusal(within, workers=5) or "")  # the workers it trains with now


def test_the_pipeline_fails_a_run_beyond_a_limit_before_it_launches_work(services: Services) -> None:  # noqa: F811
    limited = dataclasses.replace(services, limits=LIMITS)
    spec = TrainingSpec(workers=2, reducers=2, global_batch=16, iterations=500, time_budget_s=3600)
    _register(services, "greedy", spec)
    landed = ModelLanded(key=keys.model("greedy", 0), sequencer="1")
    assert work_launcher.on_model(landed, limited) == Outcome.REFUSED
    run = services.table.get_run("greedy")
    assert (run.status, run.reason) == (
        "FAILED",
        "the run asks for 500 iterations, over the deployment's limit iterations=100",
    )
    assert services.table.get_counter("greedy", 0).workers is None  # no worker was launched
    _register(services, "modest", spec.model_copy(update={"iterations": 100}))
    assert work_launcher.on_model(ModelLanded(key=keys.model("modest", 0), sequencer="1"), limited) == Outcome.LAUNCHED


def _register(services: Services, run_id: str, spec: TrainingSpec) -> None:  # noqa: F811
    """A run as the RunStarter leaves it: its run.json and its item, no iteration launched."""
    config = RunConfig(
        run_id=run_id, dataset="d", training=spec, optimizer=SGD, loss="mse", classification=False, plan=PLAN
    )
    services.store.put_new(keys.run_config(run_id), config.stored())
    _put_run(services, config, launched=False)


def test_the_client_refuses_a_run_beyond_a_limit_before_it_stores_anything(services: Services) -> None:  # noqa: F811
    limited = dataclasses.replace(services, limits=LIMITS)
    from slsml.client import demo
    from slsml.data import datasets as data
    from slsml.training import modelio

    data.put_dataset(services.store, "digits", *demo.digits())
    model = modelio.save_model(demo.digits_cnn(seed=1))
    with pytest.raises(BadInputError, match="3 reducers, over the deployment's limit reducers=2"):
        launch.prepare_run(limited, model, "digits", TrainingSpec(workers=2, reducers=3), run_id="refused")
    assert services.store.list_keys(keys.run_prefix("refused")) == []


def test_the_default_deadline_outlasts_the_default_deployment_s_stage_function_timeouts() -> None:
    assert RunLimits().refusal(TrainingSpec()) is None
    slow_reducers = RunLimits(function_timeouts_s={"worker": 10, "reducer": 50})
    assert "the reducer function's 50 s timeout" in (slow_reducers.deadline_refusal(30) or "")  # each stage counts


def test_a_dropped_model_trains_with_a_deadline_that_fits_the_stage_function_timeouts() -> None:
    assert RunLimits().drop_in_defaults() == DropInRequest()  # the default deadline fits the default timeouts
    slow_workers = RunLimits(function_timeouts_s={"worker": 300, "reducer": 200})
    defaults = slow_workers.drop_in_defaults()
    assert defaults.training == {"deadline_s": 300}
    assert slow_workers.refusal(TrainingSpec.model_validate(defaults.training)) is None
