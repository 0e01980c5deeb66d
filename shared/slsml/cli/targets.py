"""Where a run command acts: a deployed stack, the local service, or the records local runs left under runs/."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

RUNS_DIR = Path("runs")  # a local run's record: runs/<run>/summary.json and its final model


def record(services: Any, summary: Any, out: Path | None = None) -> None:
    """Keep a run's summary under runs/<run>/, with its final model (at ``out`` if given, else beside it):
    what ``run list``, ``run status`` and ``run fetch`` read once the run's cloud is gone."""
    from slsml.local.private import private_folder, write_private

    record_dir = RUNS_DIR / summary.run_id
    private_folder(RUNS_DIR, "slsml run start")  # its user's alone, as the local cloud the run had
    private_folder(record_dir, "slsml run start")
    if summary.final_model:  # its key in the run's bucket
        out = out or record_dir / "final.keras"
        out.parent.mkdir(parents=True, exist_ok=True)
        from slsml.client import runs

        write_private(out, runs.final_model(services, services.table.get_run(summary.run_id)))
        summary.final_model = str(out)
    write_private(record_dir / "summary.json", summary.model_dump_json(indent=1).encode())


def recorded(run_id: str | None = None) -> list[Any]:
    """The summaries of the runs recorded under runs/ (``run_id``'s alone, if given and recorded)."""
    from slsml.client.runs import RunSummary

    paths = [RUNS_DIR / run_id / "summary.json"] if run_id else RUNS_DIR.glob("*/summary.json")
    return [RunSummary.model_validate_json(path.read_text()) for path in paths if path.is_file()]


def local_service() -> Any:
    """The local service's state, None if none is up."""
    from slsml.local import service

    return service.status()


def _stack_services(name: str) -> Any:
    from slsml.client.stack import services_for_stack

    return services_for_stack(name)


def _stack_usage(stack: str, run: Any) -> list[Any]:
    from slsml.client.stack import usage_records

    return usage_records(stack, run.run_id, run.created_at - 60)


def target(args: argparse.Namespace) -> tuple[Any, Callable[[Any], list[Any]]] | None:
    """Where a run command acts, with how to read a run's usage records: the deployed stack ``--stack``
    names, else the local service if one is up, else None (the one-shot local runs recorded under runs/)."""
    if getattr(args, "stack", None):
        return _stack_services(args.stack), partial(_stack_usage, args.stack)
    from slsml.local import service

    if service.status() is None:
        return None
    state, services = service.connect()
    return services, partial(service_usage, Path(state.log_dir))


def service_usage(log_dir: Path, run: Any) -> list[Any]:
    from slsml.accounting import usage

    return usage.read_local(log_dir, run.run_id)


def required_target(args: argparse.Namespace) -> tuple[Any, Callable[[Any], list[Any]]]:
    """``target(args)``, NotFoundError if there is none."""
    return required(target(args))


def required(found: tuple[Any, Callable[[Any], list[Any]]] | None) -> tuple[Any, Callable[[Any], list[Any]]]:
    """A ``target`` found, NotFoundError if there is none."""
    from slsml.spec.errors import NotFoundError

    if found is None:
        raise NotFoundError("no local service is up (start one with `slsml local up`) and no --stack given")
    return found
