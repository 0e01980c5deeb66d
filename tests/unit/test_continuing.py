"""A round handed on to a fresh invocation (``slsml.training.progress``), as the run table and the watchdog see it
(against moto): the record that it goes on lasts until its attempt reports or is superseded, and refuses an attempt
that was; a deadline waits for a round that goes on in time, and acts on one whose fresh invocation is past its
time as on any missing worker."""

from __future__ import annotations

import time

from slsml.pipeline.services import Services
from slsml.pipeline.steps import watchdog
from slsml.pipeline.steps.watchdog import Action
from slsml.spec.messages import Deadline

from .test_reduce_steps import _arrive, _deadline, _done, _due, _register, sent, services  # noqa: F401


def test_a_round_that_goes_on_is_recorded_until_its_attempt_reports_or_is_superseded(
    services: Services,  # noqa: F811
) -> None:
    _register(services, "goes-on", workers=2)
    table = services.table
    assert table.record_continuation("goes-on", 0, 1, 0, 0, 100.0)
    assert table.get_iteration("goes-on", 0).continuing == {1: 100.0}
    assert table.record_continuation("goes-on", 0, 1, 0, 0, 200.0)  # its next hand-on moves the time on
    assert table.get_iteration("goes-on", 0).continuing == {1: 200.0}
    table.relaunch_workers("goes-on", 0, 0, {1: 1})
    assert table.get_iteration("goes-on", 0).continuing == {}
    assert not table.record_continuation("goes-on", 0, 1, 0, 0, 300.0)  # the superseded attempt is not handed on
    assert table.record_continuation("goes-on", 0, 1, 1, 0, 300.0)  # the re-launched one may be
    assert not table.record_continuation("goes-on", 0, 1, 1, 1, 300.0)  # not of a generation the run is not at
    assert table.record_worker(_done("goes-on", 1, attempt=1)) is not None
    record = table.get_iteration("goes-on", 0)
    assert (record.continuing, record.done) == ({}, {1})
    assert not table.record_continuation("goes-on", 0, 1, 1, 0, 400.0)  # reported: nothing goes on


def test_a_deadline_waits_for_a_round_that_goes_on_in_time(
    services: Services,  # noqa: F811
    sent: list[Deadline],  # noqa: F811
) -> None:
    _register(services, "waits", workers=4, deadline_floor=0.5)
    assert _arrive(services, "waits", 0) == [] and _arrive(services, "waits", 1) == []  # at the floor
    assert services.table.record_continuation("waits", 0, 2, 0, 0, time.time() + 60)
    assert watchdog.on_deadline(_deadline("waits"), services) == Action.CONTINUING
    record = services.table.get_iteration("waits", 0)
    assert (record.reduce_fired_by, record.relaunched) == (None, {})  # neither left out nor re-launched
    assert [(d.stage, d.round, d.link) for d in sent] == [("work", 0, 1)]
    # its fresh invocation is past its time (it crashed, or its message was lost): the deadline acts on it
    assert services.table.record_continuation("waits", 0, 2, 0, 0, time.time() - 1)
    assert watchdog.on_deadline(_due(sent[-1], services), services) == Action.FIRED
    assert [p.worker for p in services.table.get_iteration("waits", 0).participants] == [0, 1]
