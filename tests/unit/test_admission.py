"""Every message is checked against the run it names (against moto): what the pipeline sends is admitted;
a message that does not belong to its run is not, whatever step would take it (a forged task token: moto's
mock answers every heartbeat, its server does not, so ``tests/e2e/test_attacks.py`` shows that one); and a
deadline that SQS moved to its dead-letter queue without the watchdog's error fails its run only if the
watchdog would have acted on it."""

from __future__ import annotations

import json
import time

import pytest

from slsml.pipeline import admission
from slsml.pipeline.services import Services
from slsml.pipeline.steps import dead_letters
from slsml.pipeline.steps.dead_letters import on_dead_letter
from slsml.spec import keys
from slsml.spec.messages import Deadline, ReduceDone, ReduceMessage, WorkMessage

from .test_dead_letters import DEADLINES_DLQ, SOURCES, parsed, sqs_record
from .test_reduce_steps import _arrive, _done, _register, services  # noqa: F401

RUN = "checked"


@pytest.fixture
def fired(services: Services) -> list[ReduceMessage]:  # noqa: F811
    """A run of 2 workers whose iteration 0 reduce fired: the Reduce messages it sent."""
    _register(services, RUN, workers=2)
    assert _arrive(services, RUN, 0) == []
    return _arrive(services, RUN, 1)


def test_what_the_pipeline_sends_is_admitted(services: Services, fired: list[ReduceMessage]) -> None:  # noqa: F811
    reduce_ = fired[0]
    services.store.put_new(keys.shard(RUN, 1, reduce_.shard), b"shard")
    sent = [
        WorkMessage(run_id=RUN, iteration=0, worker=1, workers=2),
        _done(RUN, 1),
        reduce_,
        ReduceDone(run_id=RUN, iteration=0, shard=reduce_.shard),
        Deadline(run_id=RUN, iteration=0, stage="work", round=0, due_at=time.time() + 60),
    ]
    assert [admission.problem(message, services) for message in sent] == [None] * len(sent)


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (WorkMessage(run_id="nobody", iteration=0, worker=0, workers=2), "no run named 'nobody'"),
        (WorkMessage(run_id=RUN, iteration=1, worker=0, workers=2), "iteration 1 was not launched"),
        (WorkMessage(run_id=RUN, iteration=10**6, worker=0, workers=2), "iteration 1000000 is past the run's"),
        (WorkMessage(run_id=RUN, iteration=0, worker=0, workers=3), "3 workers, but iteration 0 was launched with 2"),
        (WorkMessage(run_id=RUN, iteration=0, worker=0, workers=2, generation=1), "generation 1 is ahead"),
        (WorkMessage(run_id=RUN, iteration=0, worker=0, workers=2, attempt=7), "attempt 7 is past the run's"),
        (WorkMessage(run_id=RUN, iteration=0, worker=0, workers=2, resume=1), "no progress is stored at"),
        (WorkMessage(run_id=RUN, iteration=0, worker=0, workers=2, resume=10**5), "a continuation after 100000 micro"),
        (_done(RUN, 0).model_copy(update={"samples": 10**12}), "1000000000000 samples, more than a worker's 16 of"),
        (_done(RUN, 0).model_copy(update={"samples": 3}), "3 samples, but the update at"),
        (_done(RUN, 0).model_copy(update={"attempt": 1}), "no update is stored at runs/checked/iters/000000/updates/"),
        (_done(RUN, 2), "no update is stored at runs/checked/iters/000000/updates/00002"),
        (ReduceMessage(run_id=RUN, iteration=0, shard=99, participants=({"worker": 0, "samples": 4},)), "shard 99 of"),
        (
            ReduceMessage(run_id=RUN, iteration=0, shard=0, participants=({"worker": 0, "samples": 4},)),
            "participants other than those the reduce of iteration 0 was fired with",
        ),
        (ReduceDone(run_id=RUN, iteration=0, shard=1), "no shard is stored at runs/checked/iters/000001/shards/"),
        (Deadline(run_id=RUN, iteration=0, stage="work", round=0, due_at=1e15), "more than two deadline periods"),
        (Deadline(run_id=RUN, iteration=1, stage="work", round=0, due_at=0), "iteration 1 is ahead of the run (at 0)"),
    ],
)
def test_a_message_that_does_not_belong_to_its_run_is_not_admitted(
    services: Services,  # noqa: F811
    fired: list[ReduceMessage],
    message: object,
    problem: str,
) -> None:
    assert problem in (admission.problem(message, services) or "admitted")


def test_a_continuation_is_admitted_only_with_the_progress_it_names(services: Services) -> None:  # noqa: F811
    """A round of 3 local steps handed on after 2 micro-batches (``slsml.training.progress``): its continuation is
    admitted once that progress is stored, and one naming progress no invocation stored, or past the round's
    micro-batches (of one sample at least), is not."""
    _register(services, "continued", workers=2, algorithm="average", local_steps=3)
    continuation = WorkMessage(run_id="continued", iteration=0, worker=1, workers=2, resume=2)
    key = keys.progress("continued", 0, 1, 0, 2)
    assert admission.problem(continuation, services) == f"no progress is stored at {key}"
    services.store.put_new(key, b"progress")
    assert admission.problem(continuation, services) is None
    samples = 3 * services.store.get_json(keys.run_config("continued"))["training"]["global_batch"]
    assert admission.problem(continuation.model_copy(update={"resume": samples - 1}), services) is not None
    past = continuation.model_copy(update={"resume": samples})
    expected = f"a continuation after {samples} micro-batches of a round of at most {samples} samples"
    assert admission.problem(past, services) == expected
    forged = continuation.model_copy(update={"attempt": 1})  # of an attempt that stored none
    assert "no progress is stored at" in (admission.problem(forged, services) or "admitted")


@pytest.fixture
def _sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dead_letters, "deployed_sources", lambda: SOURCES)


@pytest.mark.usefixtures("_sources")
@pytest.mark.parametrize(
    ("fields", "fails"),
    [
        ({"due_at": 1.0}, True),  # the watchdog failed on a deadline of the run three times: the run fails
        ({"due_at": 1.0, "forged": True}, False),  # not a Deadline
        ({"due_at": 1e15}, False),  # due in 30 million years
        ({"due_at": 1.0, "iteration": 5}, False),  # of an iteration to come
        ({"due_at": 1.0, "generation": 4}, False),  # of a generation to come
    ],
)
def test_a_deadline_sqs_moved_fails_its_run_only_if_the_watchdog_would_have_acted(
    services: Services,  # noqa: F811
    fired: list[ReduceMessage],
    fields: dict,
    fails: bool,
) -> None:
    deadline = {"run_id": RUN, "iteration": 0, "stage": "work", "round": 0} | fields
    (letter,) = parsed(sqs_record(json.dumps(deadline), DEADLINES_DLQ))
    assert on_dead_letter(letter, services) == ([RUN] if fails else [])
    run = services.table.get_run(RUN)
    assert run.status == ("FAILED" if fails else "RUNNING")
    if fails:
        assert run.reason == "watchdog failed three times on one message (its error is in watchdog's log)"
