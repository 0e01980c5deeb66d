"""A run's spend, counted as it goes: each pipeline function adds what its work on a message cost (its usage
scope so far, priced as its usage line is: ``slsml.accounting.usage``) to the run's spend item, for a run
started with a budget. The launch of each iteration compares the spend with the budget (``exhausted``) and
keeps the spend it saw on the iteration's counter.

Only a message that belongs to its run is counted (one that passed its admission check): a forged message,
which a run cannot be charged for, is not. A duplicate or a retry is, for it was spent.
"""

from __future__ import annotations

from pydantic import ValidationError

from slsml.accounting import prices, usage
from slsml.pipeline.services import Services, run_config
from slsml.spec.errors import RunFailed
from slsml.state.records import RunRecord

BUDGET_REASON = "budget"  # how the reason of a run stopped by its budget begins


def count(services: Services) -> None:
    """Add the open usage scope's dollars so far to its run's spend, if the run was started with a budget (its
    config, from the warm cache: read once per container and run where the message's check did not read it)."""
    run_id = usage.scope_run()
    if run_id is None:
        return
    try:
        config = run_config(services, run_id)
    except (RunFailed, ValidationError):  # refused at its start, or its config is unreadable: nothing to charge
        return
    if config.training.budget_usd is not None:
        services.table.add_spend(run_id, usage.so_far(prices.load()))


def spent(services: Services, run: RunRecord) -> float | None:
    """The dollars the run's functions spent so far, as they counted them (None: a run without a budget, whose
    spend is not counted)."""
    return None if run.training.budget_usd is None else services.table.spent(run.run_id)


def exhausted(run: RunRecord, spent: float | None) -> str | None:
    """Why ``run``, which ``spent`` so far, may not launch another iteration: the reason its spend reached its
    budget; None if it has no budget or has not reached it."""
    budget = run.training.budget_usd
    if budget is None or spent is None or spent < budget:
        return None
    return (
        f"{BUDGET_REASON}: {prices.usd(spent)} spent of the {prices.usd(budget)} budget (resume with a higher"
        " --budget-usd)"
    )
