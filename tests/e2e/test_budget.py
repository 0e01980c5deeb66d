"""A run's dollar budget through the real pipeline: a run the plan predicts above its budget is refused before
anything is stored, naming both figures; a run whose counted spend reaches its budget ends STOPPED at the next
iteration it would launch, and resumed with a higher budget ends with the weights of a run never stopped."""

from __future__ import annotations

import itertools
import json
import re
import statistics
import time

import numpy as np
import pytest

from slsml.accounting import prices, usage
from slsml.cli import display, targets
from slsml.cli.main import main
from slsml.client import demo, runs
from slsml.cost.modelinfo import from_keras
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.predict import predict
from slsml.cost.workload import run_workload
from slsml.data import datasets as data
from slsml.local.runtime import LocalRuntime
from slsml.pipeline import launch, spend
from slsml.pipeline.services import Services
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError
from slsml.training import modelio

from .conftest import DIGITS, final_weights, finish, train

ITERATIONS = 8
GENEROUS = 1.0  # dollars: far above what a run of this size spends


def _spec(budget: float) -> TrainingSpec:
    return TrainingSpec(workers=2, reducers=2, global_batch=64, iterations=ITERATIONS, eval_every=0, budget_usd=budget)


def test_a_run_predicted_above_its_budget_is_refused_before_anything_is_stored(services: Services, digits) -> None:
    budget = 1e-6
    model_bytes = modelio.save_model(demo.digits_cnn(seed=1))
    with pytest.raises(BadInputError) as refused:
        train(services, _spec(budget), "budget-refused", model_bytes)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"--budget-usd {budget:g}: the plan predicts $")
    predicted, named_budget = re.findall(r"\$([\d.,]+\d)", message)
    assert f"${named_budget}" == prices.usd(budget)
    # the plan's figure: at least its dollars for the run's requests alone (its compute not timed)
    manifest = data.load_manifest(services.store, DIGITS)
    untimed = from_keras(model_bytes, "m", "m", 32, measure=False, parameters=Parameters())
    work = run_workload(
        {**untimed, "compute_per_sample_s": 0.0, "compute_source": "none"},
        launch.with_epochs(_spec(budget), manifest.train.count),
        manifest=manifest,
    )
    floor = predict(work, Parameters(), Quotas(), prices.load()).run_dollars
    assert float(predicted.replace(",", "")) >= float(prices.usd(floor).strip("$").replace(",", "")) > budget
    assert services.store.list_keys("runs/budget-refused/") == []
    with pytest.raises(NotFoundError):
        services.table.get_run("budget-refused")


def _launched_spend(services: Services, run_id: str) -> dict[int, float]:
    """Iteration → the run's spend its launch saw, for the iterations of the run's current generation."""
    run = services.table.get_run(run_id)
    return {
        r.iteration: r.spent_usd
        for r in services.table.list_iterations(run_id)
        if r.launched_by is not None and r.spent_usd is not None and r.generation == run.generation
    }


def test_a_run_whose_spend_reaches_its_budget_stops_and_resumes_to_the_weights_of_an_undisturbed_one(
    local: LocalRuntime,
    services: Services,
    digits,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    train(services, _spec(GENEROUS), "budget-whole")
    train(services, _spec(GENEROUS), "budget-spent")
    while services.table.get_run("budget-spent").iteration < 2:
        time.sleep(0.05)
    assert services.stop_run("budget-spent")  # a pause, to give it a budget it will spend while it trains
    time.sleep(2)  # in-flight work drains
    before = services.table.spent("budget-spent")
    whole = finish(services, "budget-whole")
    assert whole.status == "COMPLETED", whole.reason
    seen = [spent for _, spent in sorted(_launched_spend(services, "budget-whole").items())]
    steps = [b - a for a, b in itertools.pairwise(seen)]
    assert before > 0 and len(steps) == ITERATIONS - 1 and min(steps) > 0, (before, seen)
    # a budget that runs out within the next two iterations of the many it has left (what the run that was not
    # stopped spent between two launches: its median iteration)
    budget = before + statistics.median(steps)
    resumed_from = runs.resume_run(services, "budget-spent", budget).iteration
    assert ITERATIONS - resumed_from >= 4, "too few iterations left to run out of budget mid-run"

    stopped = finish(services, "budget-spent")
    spent = services.table.spent("budget-spent")
    launched = _launched_spend(services, "budget-spent")
    assert (stopped.status, stopped.generation) == ("STOPPED", 1), (
        stopped.reason,
        before,
        budget,
        spent,
        seen,
        launched,
        stopped.training.budget_usd,
    )
    assert stopped.reason is not None and stopped.reason.startswith(spend.BUDGET_REASON), stopped.reason
    assert resumed_from < stopped.iteration < ITERATIONS and spent >= budget, (before, budget, seen, launched)
    # within one iteration of reaching it: every iteration it launched saw the spend below the budget, and the
    # launch of the next one stopped it
    assert max(launched) == stopped.iteration - 1 and all(seen < budget for seen in launched.values()), launched
    assert services.table.get_counter("budget-spent", stopped.iteration).launched_by is None
    summary = runs.summarize(stopped, services.table.list_iterations("budget-spent"), 1.0, None, spent)
    assert (summary.budget_usd, summary.spent_usd, summary.status) == (budget, spent, "STOPPED")

    # as a user resumes it: its budget is spent, so a higher one is needed
    monkeypatch.setattr(targets, "target", lambda args: (services, lambda run: []))
    assert main(["run", "resume", "budget-spent"]) == 2
    assert "higher --budget-usd" in capsys.readouterr().err
    assert main(["run", "resume", "budget-spent", "--budget-usd", str(GENEROUS), "--json"]) == 0
    out, err = capsys.readouterr()
    said = json.loads(out)
    assert said["spent_usd"] >= spent  # a late message of the stopped generation may still add to it
    assert said == {
        "run_id": "budget-spent",
        "status": "RUNNING",
        "iteration": stopped.iteration,
        "iterations": ITERATIONS,
        "generation": 2,
        "budget_usd": GENEROUS,
        "spent_usd": said["spent_usd"],
    }
    assert err.strip().endswith(display.spend(said["spent_usd"], GENEROUS))
    resumed = finish(services, "budget-spent")
    assert (resumed.status, resumed.iteration) == ("COMPLETED", ITERATIONS), resumed.reason
    expected, got = final_weights(services, "budget-whole")[0], final_weights(services, "budget-spent")[0]
    assert np.array_equal(got, expected), f"max|Δw| = {np.abs(got - expected).max():.3g}"
    assert services.store.exists(keys.final_model("budget-spent"))

    # what the functions counted as they ran is what their usage lines price, but for the counting's own write
    assert local.host.wait_idle("budget-whole", 60)
    logged = sum(usage.cost(usage.read_local(local.log_dir, "budget-whole"), prices.load()).values())
    counted = services.table.spent("budget-whole")
    print(
        f"\nbudget-whole: counted ${counted:.6f}, usage lines ${logged:.6f}; budget-spent stopped at iteration"
        f" {stopped.iteration} with ${spent:.6f} of ${budget:.6f}"
    )
    assert 0.5 * logged < counted <= logged
