"""Fault injection: the spec's text form, reproducible decisions, and the hooks inside a function process."""

from __future__ import annotations

import json
import threading
import time

import boto3
import pytest
from moto import mock_aws

from slsml.aws.storage import etag_of
from slsml.local import faults
from slsml.local.faults import Delay, Faults, InjectedFault, InvocationFaults, SlowWorker, chance, message_identity
from slsml.spec import keys
from slsml.spec.messages import WorkDone


def test_parse_and_text_form_round_trip() -> None:
    spec = Faults.parse("duplicate=0.5, worker_crash=0.25,s3_get_delay=0.2:1.5,seed=3,merger_crash_once")
    delay = Delay(probability=0.2, seconds=1.5)
    assert spec == Faults(seed=3, duplicate=0.5, worker_crash=0.25, merger_crash_once=True, s3_get_delay=delay)
    assert Faults.parse(str(spec)) == spec
    assert str(spec) == "seed=3,duplicate=0.5,worker_crash=0.25,merger_crash_once,s3_get_delay=0.2:1.5"
    assert Faults.parse("") == Faults() and str(Faults()) == "" and not Faults().active
    assert Faults.parse("sns_delay=1:0.5,s3_get_delay=1:2,s3_get_delay_match=/updates/00001").active


def test_hangs_persistent_crashes_and_a_slow_worker_round_trip() -> None:
    spec = Faults.parse("slow_worker=7:4.0,crash_every_receive,worker_hang=0.5,hang_s=3,seed=2")
    slow = SlowWorker(worker=7, seconds=4)
    assert spec == Faults(seed=2, worker_hang=0.5, hang_s=3, crash_every_receive=True, slow_worker=slow)
    assert str(spec) == "seed=2,worker_hang=0.5,hang_s=3.0,crash_every_receive,slow_worker=7:4"
    assert Faults.parse(str(spec)) == spec
    assert Faults(slow_worker=slow).active and Faults(worker_hang=0.1).active
    # settings of how faults act inject nothing by themselves
    assert not Faults(hang_s=3, crash_every_receive=True).active


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dup=0.5", "unknown fault 'dup'"),
        ("duplicate=1.5", "duplicate: Input should be less than or equal to 1"),
        ("s3_get_delay=0.5", "probability:seconds"),
        ("worker_crash", "needs a value"),
        ("seed=1,seed=2", "given twice"),
        ("sns_delay=0.5:-1", "sns_delay.seconds"),
        ("s3_get_delay_match=([", "not a regular expression"),
        ("slow_worker=7", "worker:seconds, e.g. slow_worker=7:4"),
        ("slow_worker=-1:2", "slow_worker.worker: Input should be greater than or equal to 0"),
        ("worker_hang", "needs a value"),
        ("hang_s=0", "hang_s: Input should be greater than 0"),
        ("crash_every_receive=maybe", "crash_every_receive: Input should be a valid boolean"),
    ],
)
def test_parse_names_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Faults.parse(text)


def _body(topic: str, message: dict | str) -> dict:
    text = message if isinstance(message, str) else json.dumps(message)
    return {"TopicArn": f"arn:aws:sns:us-east-1:123456789012:slsml-{topic}", "MessageId": "m-1", "Message": text}


def test_identity_names_the_message_not_its_measurements() -> None:
    done = WorkDone(run_id="r", iteration=3, worker=1, samples=32, loss=0.5, compute_s=0.1, etag=etag_of(b""))
    slower = done.model_copy(update={"compute_s": 9.0, "loss": 0.7})
    assert message_identity(_body("WorkDone", done.model_dump())) == message_identity(
        _body("WorkDone", slower.model_dump())
    )
    identity = message_identity(_body("WorkDone", done.model_dump()))
    assert identity == "slsml-WorkDone|run_id=r,iteration=3,worker=1,attempt=0"
    assert message_identity(_body("Work", done.model_dump())) != message_identity(_body("WorkDone", done.model_dump()))
    event = {"Records": [{"eventName": "ObjectCreated:Put", "eventTime": "now", "s3": {"object": {"key": "k"}}}]}
    later = {"Records": [{"eventName": "ObjectCreated:Put", "eventTime": "later", "s3": {"object": {"key": "k"}}}]}
    assert message_identity(_body("ModelUpdated", event)) == message_identity(_body("ModelUpdated", later))
    assert message_identity(_body("Work", "not json")) == "slsml-Work|m-1"


def test_decisions_are_reproducible_and_follow_the_probability() -> None:
    assert chance(1, "x", "y") == chance(1, "x", "y") != chance(2, "x", "y")
    spec = Faults(seed=7, worker_crash=0.25, duplicate=0.5)
    identities = [f"slsml-Work|run_id=r,iteration={i},worker={w}" for i in range(100) for w in range(8)]
    crashes = [spec.for_invocation("worker", i, 1, True).crash for i in identities]
    assert crashes == [spec.for_invocation("worker", i, 1, True).crash for i in identities]
    assert 0.2 < sum(c is not None for c in crashes) / len(crashes) < 0.3
    assert {c for c in crashes if c} == {"start", "publish"}
    assert 0.45 < sum(map(spec.duplicates, identities)) / len(identities) < 0.55
    # only the first receive crashes; other functions are untouched
    assert all(spec.for_invocation("worker", i, 2, True).crash is None for i in identities)
    assert all(spec.for_invocation("reducer", i, 1, True).crash is None for i in identities)


def test_hangs_hit_workers_on_their_first_receive() -> None:
    spec = Faults(seed=3, worker_hang=0.3, hang_s=2)
    identities = [f"slsml-Work|run_id=r,iteration={i},worker={w},attempt=0" for i in range(100) for w in range(8)]
    plans = [spec.for_invocation("worker", i, 1, True) for i in identities]
    assert {p.crash for p in plans} == {None, "hang"} and {p.hang_s for p in plans} == {2}
    assert 0.25 < sum(p.crash == "hang" for p in plans) / len(plans) < 0.35
    assert all(spec.for_invocation("worker", i, 2, True).crash is None for i in identities)
    assert all(spec.for_invocation("reducer", i, 1, True).crash is None for i in identities)
    # a crash wins over a hang that the same message draws
    both = Faults(seed=3, worker_hang=1, worker_crash=1)
    assert {both.for_invocation("worker", i, 1, True).crash for i in identities} == {"start", "publish"}


def test_crash_every_receive_hits_the_same_messages_on_every_receive() -> None:
    spec = Faults(seed=5, worker_crash=0.2, reducer_crash=0.2, worker_hang=0.2, crash_every_receive=True)
    works = [f"slsml-Work|run_id=r,iteration={i},worker={w},attempt=0" for i in range(50) for w in range(8)]
    reduces = [f"slsml-Reduce|run_id=r,iteration={i},shard={s}" for i in range(50) for s in range(4)]
    for function, identities in (("worker", works), ("reducer", reduces)):
        first = [spec.for_invocation(function, i, 1, True).crash for i in identities]
        assert 0.1 < sum(c is not None for c in first) / len(first) < 0.5
        for receives in (2, 3):
            assert [spec.for_invocation(function, i, receives, True).crash for i in identities] == first
    assert "hang" in {spec.for_invocation("worker", i, 3, True).crash for i in works}
    # a message launched again (its next attempt) draws anew
    again = [spec.for_invocation("worker", i.replace("attempt=0", "attempt=1"), 1, True).crash for i in works]
    assert again != [spec.for_invocation("worker", i, 1, True).crash for i in works]


def test_the_slow_worker_sleeps_on_every_invocation_and_no_one_else_does() -> None:
    spec = Faults(slow_worker=SlowWorker(worker=7, seconds=4))
    for iteration in range(5):
        for receives in (1, 2):
            slow = spec.for_invocation("worker", f"slsml-Work|run_id=r,iteration={iteration},worker=7", receives, True)
            assert slow.slow_s == 4 and slow.crash is None
            other = spec.for_invocation("worker", f"slsml-Work|run_id=r,iteration={iteration},worker=1", receives, True)
            assert other.slow_s == 0
    assert spec.for_invocation("worker", "slsml-Work|run_id=r,iteration=0,worker=17,attempt=0", 1, True).slow_s == 0
    done = "slsml-WorkDone|run_id=r,iteration=0,worker=7,attempt=0"  # worker 7's announcement, not its work
    assert spec.for_invocation("reduce_launcher", done, 1, True).slow_s == 0


def test_the_merger_crashes_only_while_the_host_says_it_has_not() -> None:
    spec = Faults(merger_crash_once=True)
    assert spec.for_invocation("merger", "m", 1, merge_crash=True).crash == "model_put"
    assert spec.for_invocation("merger", "m", 1, merge_crash=False).crash is None
    assert spec.for_invocation("merger", "m", 2, merge_crash=True).crash is None


def test_sns_delay_holds_back_a_share_of_the_messages() -> None:
    spec = Faults(seed=1, sns_delay=Delay(probability=0.5, seconds=0.25))
    held = [spec.held_back(f"id-{i}", 1) for i in range(400)]
    assert set(held) == {0.0, 0.25} and 0.4 < held.count(0.25) / 400 < 0.6


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        sns = boto3.client("sns", region_name="us-east-1")
        s3.create_bucket(Bucket="bucket")
        for key in ("runs/r/iters/000000/updates/00001.bin", "runs/r/iters/000000/updates/00002.bin"):
            s3.put_object(Bucket="bucket", Key=key, Body=b"x" * 64)
        faults.install(s3, sns)
        yield s3, sns, sns.create_topic(Name="t")["TopicArn"]


def _timed_get(s3, key: str) -> float:
    started = time.perf_counter()
    s3.get_object(Bucket="bucket", Key=key, Range="bytes=0-7")["Body"].read()
    return time.perf_counter() - started


def test_s3_delay_applies_inside_an_invocation_to_the_matching_keys(clients) -> None:
    s3, _, _ = clients
    slow, fast = "runs/r/iters/000000/updates/00001.bin", "runs/r/iters/000000/updates/00002.bin"
    plan = InvocationFaults(s3_get_delay=Delay(probability=1, seconds=0.3), s3_get_delay_match="/updates/00001")
    with faults.invocation(plan) as injected:
        assert _timed_get(s3, slow) >= 0.3
        assert _timed_get(s3, fast) < 0.3
    assert injected == {"s3_get_delay": 1}
    assert _timed_get(s3, slow) < 0.3  # outside an invocation: nothing injected


def test_a_held_read_goes_on_once_its_faults_are_lifted(clients, tmp_path) -> None:
    s3, _, _ = clients
    key, lifted = "runs/r/iters/000000/updates/00001.bin", tmp_path / "lifted"
    plan = InvocationFaults(s3_get_delay=Delay(probability=1, seconds=60), lifted=str(lifted))
    lift = threading.Timer(0.3, lifted.touch)
    lift.start()
    with faults.invocation(plan) as injected:
        waited = _timed_get(s3, key)
    assert injected == {"s3_get_delay": 1}
    assert 0.3 <= waited < 30  # held until lifted, not its 60 s
    with faults.invocation(plan):  # lifted before it was read: not held
        assert _timed_get(s3, key) < 30


def test_a_hang_runs_until_its_timeout_and_fails_as_lambda_reports_it() -> None:
    started = time.perf_counter()
    timed_out = r"^Task timed out after 0\.30 seconds \(injected hang\): w$"
    hang = InvocationFaults(crash="hang", hang_s=0.3, identity="w")
    with pytest.raises(InjectedFault, match=timed_out), faults.invocation(hang):
        pytest.fail("a hung invocation does not get to its work")
    assert time.perf_counter() - started >= 0.3


def test_a_slow_invocation_sleeps_before_its_work() -> None:
    started = time.perf_counter()
    with faults.invocation(InvocationFaults(slow_s=0.3)):
        waited = time.perf_counter() - started
    assert waited >= 0.3
    started = time.perf_counter()
    with faults.invocation(InvocationFaults()):
        assert time.perf_counter() - started < 0.3


def test_crash_points(clients) -> None:
    s3, sns, topic = clients
    start = InvocationFaults(crash="start")
    with pytest.raises(InjectedFault, match="before doing anything"), faults.invocation(start):
        pass
    with faults.invocation(InvocationFaults(crash="publish", identity="w")):
        s3.put_object(Bucket="bucket", Key="runs/r/iters/000000/updates/00003.bin", Body=b"stored first")
        with pytest.raises(InjectedFault, match="before announcing it: w"):
            sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[{"Id": "0", "Message": "{}"}])
    with faults.invocation(InvocationFaults(crash="model_put")):
        s3.put_object(Bucket="bucket", Key=keys.shard("r", 1, 0), Body=b"shard")  # not a trigger: written
        s3.put_object(Bucket="bucket", Key=keys.model("r", 1), Body=b"model")  # a saved model, no trigger: written
        with pytest.raises(InjectedFault, match=r"before writing runs/r/models/000001\.json"):
            s3.put_object(Bucket="bucket", Key=keys.manifest("r", 1), Body=b"manifest")
        sns.publish_batch(TopicArn=topic, PublishBatchRequestEntries=[{"Id": "0", "Message": "{}"}])
    s3.put_object(Bucket="bucket", Key=keys.manifest("r", 1), Body=b"manifest")  # outside an invocation: no crash
