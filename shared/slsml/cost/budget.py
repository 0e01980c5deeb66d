"""A run's dollar budget against the plan, before the run starts: the dollars ``slsml plan`` predicts for the run
(``--model FILE --data DATASET`` and the run's training flags, its reducers as given) must not exceed
``budget_usd``. Once the run trains, its functions count what they spend (``slsml.pipeline.spend``)."""

from __future__ import annotations

from slsml.accounting import prices
from slsml.cost import gpuworker
from slsml.cost import predict as costmodel
from slsml.cost.modelinfo import from_keras
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.workload import measured_batch, run_workload
from slsml.data.manifest import DatasetManifest
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.spec.limits import RunLimits


def predict(
    model_bytes: bytes, manifest: DatasetManifest, spec: TrainingSpec, limits: RunLimits | None = None
) -> float:
    """The run's dollars as ``slsml plan`` predicts them: the model's figures with one gradient step timed here,
    the dataset's samples, the deployment's function memory, the timeouts and the workers (CPU or GPU) of its run
    ``limits``, the built-in
    quotas and parameters, and the price table (``--prices``'s default, ``$SLSML_PRICES``). BadInputError if the
    plan cannot model the run."""
    parameters = Parameters()
    figures = from_keras(
        model_bytes,
        "the model",
        "the model",
        measured_batch(spec),
        measure=True,
        parameters=parameters,
        loss=spec.loss,
        manifest=manifest,
    )
    table = prices.load()
    # the deployment's workers: GPU workers where its limits name an accelerator (``gpuworker.deployed``)
    work = gpuworker.deployed(run_workload(figures, spec, manifest=manifest, limits=limits), parameters, table, limits)
    costmodel.check(work, parameters, Quotas())
    return costmodel.predict(work, parameters, Quotas(), table).run_dollars


def check(
    model_bytes: bytes, manifest: DatasetManifest, spec: TrainingSpec, limits: RunLimits | None = None
) -> float | None:
    """The run's predicted dollars on the deployment of run ``limits`` if it has a budget (None without one).
    BadInputError, naming both figures, if the prediction is above the budget; naming why, if the run's cost cannot
    be predicted: a budget is a promise the plan checks before anything is stored."""
    budget = spec.budget_usd
    if budget is None:
        return None
    try:
        predicted = predict(model_bytes, manifest, spec, limits)
    except BadInputError as error:
        raise BadInputError(
            f"--budget-usd {budget:g}: the run's cost cannot be predicted, so its budget cannot be"
            f" checked ({error}); start it without --budget-usd"
        ) from None
    if predicted > budget:
        raise BadInputError(
            f"--budget-usd {budget:g}: the plan predicts {prices.usd(predicted)} for this run"
            f" ({spec.iterations} iterations), above its budget of {prices.usd(budget)}; raise the"
            " budget or make the run smaller (`slsml plan` shows where its dollars go)"
        )
    return predicted
