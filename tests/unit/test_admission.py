"""Every message's proof of origin is checked, then what it says against the run it names (against moto): what the
pipeline sends is admitted; a message it did not send (unsigned, forged, changed, another run's) is refused before
anything else, and one that does not fit its run is not admitted, whatever step would take it (a forged task token:
moto's mock answers every heartbeat, its server does not, so ``tests/e2e/test_attacks.py`` shows that one); and a
deadline that SQS moved to its dead-letter queue without the watchdog's error fails its run only if the watchdog
would have acted on it."""

from __future__ import annotations

import json
import re
import time

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_der_private_key,
)

from slsml.aws import cache as warm_cache
from slsml.aws.storage import etag_of
from slsml.pipeline import admission, envelope, proof
from slsml.pipeline.proof import RunKeys
from slsml.pipeline.services import Services
from slsml.pipeline.steps import dead_letters
from slsml.pipeline.steps.dead_letters import on_dead_letter
from slsml.spec import keys, wiring
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import KeyForged, KeyLost, MessageRejected
from slsml.spec.messages import Deadline, ModelMerged, ReduceDone, ReduceMessage, WorkMessage
from slsml.state.runtable import RunKeyItem, SealedKey

from .test_dead_letters import DEADLINES_DLQ, SOURCES, parsed, sqs_record
from .test_reduce_steps import _arrive, _done, _register, services  # noqa: F401

ETAG = etag_of(b"")  # an update's ETag, as a report names it
RUN = "checked"


@pytest.fixture
def fired(services: Services) -> list[ReduceMessage]:  # noqa: F811
    """A run of 2 workers whose iteration 0 reduce fired: the Reduce messages it sent."""
    _register(services, RUN, workers=2)
    assert _arrive(services, RUN, 0) == []
    return _arrive(services, RUN, 1)


def test_what_the_pipeline_sends_is_admitted(services: Services, fired: list[ReduceMessage]) -> None:  # noqa: F811
    sent = [
        WorkMessage(run_id=RUN, iteration=0, worker=1, workers=2),
        _done(RUN, 1),
        fired[0],
        ReduceDone(run_id=RUN, iteration=0, shard=fired[0].shard),
        Deadline(run_id=RUN, iteration=0, stage="work", round=0, due_at=time.time() + 60),
        ModelMerged(run_id=RUN, iteration=1),
        # a round past its last deadline retry whose update a reducer refused: re-launched once more, and its report
        WorkMessage(run_id=RUN, iteration=0, worker=1, workers=2, attempt=TrainingSpec().deadline_retries + 1),
        _done(RUN, 1, attempt=TrainingSpec().deadline_retries + 1),
    ]
    for message in sent:  # as a step receives it: signed by the step that sent it
        envelope.admit(services.keys.sign(message), services)
    assert [admission.problem(message, services) for message in sent] == [None] * len(sent)


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (WorkMessage(run_id="nobody", iteration=0, worker=0, workers=2), "run 'nobody' has no run.json"),
        (ModelMerged(run_id=RUN, iteration=10**6), "iteration 1000000 is past the run's"),
        (WorkMessage(run_id=RUN, iteration=10**6, worker=0, workers=2), "iteration 1000000 is past the run's"),
        (WorkMessage(run_id=RUN, iteration=0, worker=2, workers=2), "worker 2 of an iteration of 2 workers"),
        (WorkMessage(run_id=RUN, iteration=0, worker=0, workers=17), "17 workers, outside the run's bounds 1..16"),
        (WorkMessage(run_id=RUN, iteration=0, worker=0, workers=2, attempt=7), "attempt 7 is past the run's"),
        (WorkMessage(run_id=RUN, iteration=0, worker=0, workers=2, resume=10**5), "a continuation after 100000 micro"),
        (_done(RUN, 0).model_copy(update={"samples": 10**12}), "1000000000000 samples, more than a worker's 16 of"),
        (
            ReduceMessage(run_id=RUN, iteration=0, shard=99, participants=({"worker": 0, "samples": 4, "etag": ETAG},)),
            "shard 99 of",
        ),
        (
            ReduceMessage(run_id=RUN, iteration=0, shard=0, participants=({"worker": 40, "samples": 4, "etag": ETAG},)),
            "participants [40] beyond the run's 16 workers at most",
        ),
        (ReduceDone(run_id=RUN, iteration=0, shard=7), "shard 7 of a run of 2 reducers"),
        (Deadline(run_id=RUN, iteration=0, stage="work", round=0, due_at=1e15), "more than two deadline periods"),
        (Deadline(run_id=RUN, iteration=0, stage="work", round=9, due_at=0), "attempt 9 is past the run's"),
    ],
)
def test_a_message_that_does_not_fit_its_run_is_not_admitted(
    services: Services,  # noqa: F811
    fired: list[ReduceMessage],
    message: object,
    problem: str,
) -> None:
    assert problem in (admission.problem(message, services) or "admitted")


def test_a_message_the_pipeline_did_not_send_is_refused_before_anything_else(
    services: Services,  # noqa: F811
    fired: list[ReduceMessage],
) -> None:
    """Unsigned, forged, changed on its way, replayed from another run: each is refused by its proof of origin, also
    where what it says fits the run (a deadline due now, a report of the run's own worker)."""
    _register(services, "other", workers=2)
    services.keys.sign(WorkMessage(run_id="other", iteration=0, worker=0, workers=2))  # the other run's keys are made
    deadline = Deadline(run_id=RUN, iteration=0, stage="work", round=2, due_at=time.time())
    signed = services.keys.sign(_done(RUN, 1))
    of_other = services.keys.sign(_done("other", 1))
    refused = {
        "unsigned": (deadline, "carries no proof of origin"),
        "forged": (deadline.model_copy(update={"proof": "watchdog:" + "A" * 96}), "proof of origin does not hold"),
        "changed": (signed.model_copy(update={"finite": False}), "proof of origin does not hold"),
        "replayed": (of_other.model_copy(update={"run_id": RUN}), "proof of origin does not hold"),
        "keyless": (services.keys.sign(deadline).model_copy(update={"run_id": "nobody"}), "no signing keys"),
    }
    envelope.admit(signed, services)
    for name, (message, problem) in refused.items():
        with pytest.raises(MessageRejected, match=problem):
            envelope.admit(message, services)
        assert admission.problem(message, services) is None or name == "keyless"  # refused for its proof alone


def _as(services: Services, kind: str) -> RunKeys:  # noqa: F811
    """The run keys of step ``kind`` of the deployment ``services`` reach."""
    return RunKeys(services.table, services.keys.kms, services.keys.sealing_key, kind)


def test_a_run_has_one_key_pair_per_signing_kind_made_at_its_launch(services: Services) -> None:  # noqa: F811
    """Only the step that launches runs makes a run's keys, one pair per kind that signs, once; another run has
    others; a step of another kind finds them."""
    with pytest.raises(RuntimeError, match="the step that launches it makes them"):
        _as(services, "worker").sign(_done("one", 1))
    assert services.table.run_keys("one") is None
    launcher = _as(services, "work_launcher")
    launcher.sign(WorkMessage(run_id="one", iteration=0, worker=0, workers=2))
    made = services.table.run_keys("one")
    assert made is not None and sorted(made.keys) == sorted(wiring.SIGNERS) and made.vouched is not None
    assert len({key.public for key in made.keys.values()}) == len(wiring.SIGNERS)
    assert services.table.make_run_keys("one", RunKeyItem({}, None)) == made  # create-once
    launcher.sign(WorkMessage(run_id="two", iteration=0, worker=0, workers=2))
    other = services.table.run_keys("two")
    assert other is not None
    assert not {key.public for key in other.keys.values()} & {key.public for key in made.keys.values()}
    done = _as(services, "worker").sign(_done("one", 1))
    assert done.proof.startswith("worker:") and services.keys.problem(done) is None


def test_a_kind_proves_only_the_messages_it_sends(services: Services) -> None:  # noqa: F811
    """A message signed by a kind that does not send it (a Worker's ReduceDone, a Reducer's WorkDone) is refused,
    naming who sends it; its own kind's signature of the same message holds."""
    _as(services, "work_launcher").sign(WorkMessage(run_id=RUN, iteration=0, worker=0, workers=2))
    reduced = ReduceDone(run_id=RUN, iteration=0, shard=0)
    by_worker = _as(services, "worker").sign(reduced)
    assert services.keys.problem(by_worker) == (
        "its proof of origin names 'worker', which does not send ReduceDone: reducer, watchdog do"
    )
    by_reducer = _as(services, "reducer").sign(reduced)
    assert services.keys.problem(by_reducer) is None
    # the Reducer's signature, named as the Watchdog's (a sender of ReduceDone): it does not hold under its key
    named = by_reducer.model_copy(update={"proof": by_reducer.proof.replace("reducer:", "watchdog:", 1)})
    assert "does not hold under run" in (services.keys.problem(named) or "")
    worker_done = _as(services, "reducer").sign(_done(RUN, 1))
    assert "which does not send WorkDone: worker do" in (services.keys.problem(worker_done) or "")


def test_an_object_is_proven_only_by_a_kind_that_writes_it(services: Services) -> None:  # noqa: F811
    """A manifest signed by the Merger holds, for its own key and bytes only; the same manifest signed by a Worker
    (which writes no models/) does not, nor does the Merger's proof of one run under another."""
    _as(services, "work_launcher").sign(WorkMessage(run_id=RUN, iteration=0, worker=0, workers=2))
    _as(services, "work_launcher").sign(WorkMessage(run_id="other", iteration=0, worker=0, workers=2))
    key, body = keys.manifest(RUN, 1), b'{"iteration": 1, "shards": []}'
    merged = _as(services, "merger").sign_object(RUN, key, body)
    assert merged == _as(services, "merger").sign_object(RUN, key, body)  # deterministic: a retry stores the same
    assert services.keys.object_problem(RUN, key, body, merged) is None
    refused = {
        "by a worker": (RUN, key, body, _as(services, "worker").sign_object(RUN, key, body)),
        "other bytes": (RUN, key, body + b" ", merged),
        "another key": (RUN, keys.manifest(RUN, 2), body, merged),
        "another run": ("other", keys.manifest("other", 1), body, merged),
        "no proof": (RUN, key, body, {}),
    }
    for name, (run, at, stored, metadata) in refused.items():
        assert "replaced behind the pipeline's back" in (
            services.keys.object_problem(run, at, stored, metadata) or ""
        ), name


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
        ({"due_at": 1.0, "round": 9}, False),  # past the run's deadline retries
    ],
)
def test_a_deadline_sqs_moved_fails_its_run_only_if_the_watchdog_would_have_acted(
    services: Services,  # noqa: F811
    fired: list[ReduceMessage],
    fields: dict,
    fails: bool,
) -> None:
    deadline = {"run_id": RUN, "iteration": 0, "stage": "work", "round": 0} | fields
    if "forged" not in fields:  # sent by the pipeline: signed
        deadline = json.loads(services.keys.sign(Deadline.model_validate(deadline)).model_dump_json())
    (letter,) = parsed(sqs_record(json.dumps(deadline), DEADLINES_DLQ))
    assert on_dead_letter(letter, services) == ([RUN] if fails else [])
    run = services.table.get_run(RUN)
    assert run.status == ("FAILED" if fails else "RUNNING")
    if fails:
        assert run.reason == "watchdog failed three times on one message (its error is in watchdog's log)"


def test_a_message_of_a_run_whose_run_json_is_not_slsmls_is_refused_naming_what_is_wrong(
    services: Services,  # noqa: F811
) -> None:
    services.store.put_new(keys.run_config("mangled"), b'{"run_id": "mangled"}')
    problem = admission.problem(WorkMessage(run_id="mangled", iteration=0, worker=0, workers=2), services) or ""
    assert problem.startswith("run 'mangled' has a run.json that is not slsml's: ") and "Field required" in problem


def test_a_message_the_pipeline_sent_to_a_run_whose_run_json_is_not_the_one_it_registered_fails_the_run(
    services: Services,  # noqa: F811
) -> None:
    """run.json is checked against the SHA-256 its run registered as it is first read: a mismatch fails the run,
    naming it, whichever step reads it; the message is not acted on, but the watchdog's end of the run's execution."""
    _register(services, "swapped", workers=2)
    services.table.table.update_item(
        Key={"pk": "RUN#swapped", "sk": "META"},
        UpdateExpression="SET config_sha256 = :other",
        ExpressionAttributeValues={":other": "0" * 64},  # what the run registered: not what run.json is now
    )
    named = "runs/swapped/run.json is not the run.json run 'swapped' registered: it was replaced"
    with pytest.raises(MessageRejected, match=named):
        envelope.admit(services.keys.sign(WorkMessage(run_id="swapped", iteration=0, worker=1, workers=2)), services)
    run = services.table.get_run("swapped")
    assert run.status == "FAILED" and run.reason is not None and run.reason.startswith(named), run.reason
    ending = Deadline(run_id="swapped", iteration=0, stage="end", round=0, due_at=time.time())
    envelope.admit(services.keys.sign(ending), services)  # admitted: it ends the failed run's execution


def test_a_run_whose_signing_keys_were_deleted_fails_naming_them_at_the_next_step_that_needs_them(
    services: Services,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run's KEY item deleted once its chain of deadlines started: a step of a fresh container (no key kept) fails
    the run naming the item, whether it signs a message (no keys are made anew, not even by the launcher) or checks
    one. The failed run's steps sign nothing: what they send is refused, but for the watchdog's end of its execution
    (which a Worker asks for), admitted without proof both where no key is kept and where the lost keys still are."""
    _register(services, "keyless", workers=2)  # watched: its launch's first message made its keys
    message = _as(services, "work_launcher").sign(WorkMessage(run_id="keyless", iteration=0, worker=1, workers=2))
    _as(services, "worker").sign(_done("keyless", 1))  # a container that keeps the Worker's key and the public keys
    keeping = warm_cache.warm()
    services.table.table.delete_item(Key={"pk": "RUN#keyless", "sk": "KEY"})
    monkeypatch.setattr(warm_cache, "_warm", None)  # a fresh container
    named = "run 'keyless' lost its signing keys (its KEY item was deleted behind the pipeline's back)"
    for kind in ("work_launcher", "worker"):
        with pytest.raises(KeyLost, match=re.escape(named)):
            _as(services, kind).sign(message)
    assert services.table.run_keys("keyless") is None
    with pytest.raises(MessageRejected, match=re.escape(named)):
        envelope.admit(message, services)
    run = services.table.get_run("keyless")
    assert run.status == "FAILED" and (run.reason or "").startswith(named), run.reason
    ending = _as(services, "worker").sign(Deadline(run_id="keyless", iteration=0, stage="end", round=0, due_at=0.0))
    assert ending.proof == "" and services.table.run_keys("keyless") is None
    envelope.admit(ending, services)  # admitted: it ends the failed run's execution
    with pytest.raises(MessageRejected, match="lost its signing keys: no message of the run can be proven"):
        envelope.admit(message, services)
    monkeypatch.setattr(warm_cache, "_warm", keeping)  # the container that keeps the lost keys
    envelope.admit(ending, services)
    envelope.admit(_as(services, "worker").sign(ending), services)  # signed under the Worker's kept key
    with pytest.raises(MessageRejected, match="carries no proof of origin"):
        envelope.admit(message.model_copy(update={"proof": ""}), services)


def _own_keys() -> dict[str, SealedKey]:
    """A key pair per signing kind of a hand's own making (its private keys in the clear: it can seal none)."""
    made = {}
    for kind in wiring.SIGNERS:
        private = ec.generate_private_key(ec.SECP256R1())
        public = private.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        made[kind] = SealedKey(public, private.private_bytes(Encoding.DER, PrivateFormat.PKCS8, NoEncryption()))
    return made


def test_keys_put_in_a_runs_item_behind_the_launch_are_refused_by_every_reader(
    services: Services,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A KEY item put before the launch by a role that writes the table, with keys of its own making and another run's
    vouch, or none: the launch refuses it, naming it, and makes no keys in its place. An item the launch made, put
    again with the Worker's public key swapped for a hand's own: a fresh container's step refuses it as it reads it,
    and a message that key signed is not admitted."""
    monkeypatch.setattr(warm_cache, "_warm", None)  # a fresh container: no keys kept from another test
    item = {"pk": "RUN#planted", "sk": "KEY"}
    _as(services, "work_launcher").sign(WorkMessage(run_id="other", iteration=0, worker=0, workers=2))
    other = services.table.run_keys("other")
    assert other is not None and other.vouched is not None
    own = _own_keys()
    named = "run 'planted''s signing keys (its KEY item) are not the ones its launch made"
    for vouched in ({"vouched": other.vouched}, {}):
        services.table.table.put_item(
            Item={
                **item,
                "public": {kind: key.public for kind, key in own.items()},
                "sealed": {kind: key.sealed for kind, key in own.items()},
                **vouched,
            }
        )
        with pytest.raises(KeyForged, match=re.escape(named)):
            _as(services, "work_launcher").sign(WorkMessage(run_id="planted", iteration=0, worker=0, workers=2))
        found = services.table.run_keys("planted")
        assert found is not None and found.keys["worker"].public == own["worker"].public  # none made in its place

    _register(services, "key-swapped", workers=2)  # its launch made its keys
    made = services.table.run_keys("key-swapped")
    assert made is not None and made.vouched is not None
    swapped = {**made.keys, "worker": own["worker"]}
    services.table.table.put_item(
        Item={
            "pk": "RUN#key-swapped",
            "sk": "KEY",
            "public": {kind: key.public for kind, key in swapped.items()},
            "sealed": {kind: key.sealed for kind, key in swapped.items()},
            "vouched": made.vouched,
        }
    )
    monkeypatch.setattr(warm_cache, "_warm", None)  # a fresh container
    private = load_der_private_key(own["worker"].sealed, password=None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    done = _done("key-swapped", 1)
    signature = private.sign(proof.message_body(done), ec.ECDSA(hashes.SHA256()))
    forged = done.model_copy(update={"proof": proof.proof("worker", signature)})
    with pytest.raises(MessageRejected, match=re.escape("run 'key-swapped''s signing keys (its KEY item) are not")):
        envelope.admit(forged, services)
    assert services.table.get_run("key-swapped").status == "FAILED"
