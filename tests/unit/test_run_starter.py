"""The RunStarter refuses a run request it cannot use with a reason, however it is malformed, and every start it
cannot make leaves its run FAILED with the reason, never touching a run already there (against moto)."""

from __future__ import annotations

import hashlib
import logging

import pytest

from slsml.pipeline.services import Services
from slsml.pipeline.steps import run_starter
from slsml.spec import keys
from slsml.spec.config import DropInRequest, TrainingSpec
from slsml.spec.messages import ModelLanded
from slsml.state.records import RunStatus

from .test_reduce_steps import services  # noqa: F401


def _drop(services: Services, name: str, request: bytes | None) -> str:  # noqa: F811
    """Drop a (not loadable) model with ``request`` beside it; the id of its run."""
    if request is not None:
        services.store.put_new(keys.incoming_request(name), request)
    services.store.put_new(f"incoming/{name}.keras", b"a model")
    return f"{name}-{hashlib.sha256(b'a model' + (request or b'')).hexdigest()[:8]}"


def _start(services: Services, name: str) -> str | None:  # noqa: F811
    return run_starter.on_dropped(ModelLanded(key=f"incoming/{name}.keras", sequencer="1"), services, DropInRequest())


@pytest.mark.parametrize(
    ("request_body", "reason"),
    [
        (b'{"dataset": "d", "training": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", "recursion limit exceeded"),
        (b"not json", "Invalid JSON"),
    ],
)
def test_a_request_it_cannot_use_is_refused_with_a_reason(
    services: Services,  # noqa: F811
    request_body: bytes,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_id = _drop(services, "deep", request_body)
    caplog.set_level(logging.ERROR)
    assert _start(services, "deep") is None
    (refused,) = [r for r in caplog.records if r.getMessage() == "dropped model not started"]
    assert "incoming/deep.json is not a valid run request" in refused.reason and reason in refused.reason
    run = services.table.get_run(run_id)
    assert run.status == RunStatus.FAILED and run.reason is not None
    assert run.reason.startswith("incoming/deep.keras not started: ") and reason in run.reason


def test_a_start_that_fails_after_the_run_files_were_written_fails_its_run(services: Services) -> None:  # noqa: F811
    run_id = _drop(services, "torn", b'{"dataset": "d"}')
    services.store.put_json_new(keys.run_config(run_id), {})  # an earlier try wrote run.json, then was cut off
    assert _start(services, "torn") is None
    run = services.table.get_run(run_id)
    assert run.status == RunStatus.FAILED and run.reason is not None
    assert "was interrupted before its files were all written" in run.reason


def test_a_refused_start_leaves_a_run_of_the_same_id_as_it_is(services: Services) -> None:  # noqa: F811
    run_id = _drop(services, "taken", b"not json")
    assert services.table.register_refused(run_id, "d", TrainingSpec(), "the first")
    assert _start(services, "taken") == run_id  # a redelivered event: the run is there
    assert not services.table.register_refused(run_id, "e", TrainingSpec(), "the second")
    assert (services.table.get_run(run_id).reason, services.table.get_run(run_id).dataset) == ("the first", "d")


def test_a_request_with_typos_names_each_with_the_field_meant_on_one_line(services: Services) -> None:  # noqa: F811
    run_id = _drop(services, "typos", b'{"datset": "d", "training": {"iterationz": 3, "workers": 0}}')
    assert _start(services, "typos") is None
    reason = services.table.get_run(run_id).reason
    assert reason == (
        "incoming/typos.keras not started: incoming/typos.json is not a valid run request:"
        " datset: unknown field (did you mean 'dataset'?);"
        " training.workers: Input should be greater than or equal to 1 or 'auto';"
        " training.iterationz: unknown field (did you mean 'iterations'?)"
    )
