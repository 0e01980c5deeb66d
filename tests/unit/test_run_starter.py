"""The RunStarter refuses a run request it cannot use with a reason, however it is malformed (against moto)."""

from __future__ import annotations

import logging

import pytest

from slsml.pipeline.services import Services
from slsml.pipeline.steps import run_starter
from slsml.spec import keys
from slsml.spec.config import DropInRequest
from slsml.spec.messages import ModelLanded

from .test_reduce_steps import services  # noqa: F401


@pytest.mark.parametrize(("request_body", "reason"), [
    (b'{"dataset": "d", "training": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "recursion limit exceeded"),
    (b"not json", "Invalid JSON"),
])
def test_a_request_it_cannot_use_is_refused_with_a_reason(
    services: Services, request_body: bytes, reason: str, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    services.store.put_new(keys.incoming_request("deep"), request_body)
    services.store.put_new("incoming/deep.keras", b"a model")
    caplog.set_level(logging.ERROR)
    assert run_starter.on_dropped(ModelLanded(key="incoming/deep.keras", sequencer="1"), services,
                                  DropInRequest()) is None
    (refused,) = [r for r in caplog.records if r.getMessage() == "dropped model not started"]
    assert "incoming/deep.json is not a valid run request" in refused.reason and reason in refused.reason
