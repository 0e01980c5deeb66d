"""Messages that are too big, not JSON or not of the function's type, published straight to the
pipeline's topics while a run trains: each is rejected with a logged reason and dead-lettered, and
the run, though the messages name it, completes untouched."""

from __future__ import annotations

import json

import boto3
import numpy as np

from slsml.aws.storage import etag_of
from slsml.local.faults import Delay, Faults
from slsml.pipeline.envelope import MAX_MESSAGE_BYTES
from slsml.spec import keys
from slsml.spec.config import TrainingSpec

from .conftest import dead_letters, final_weights, finish, log_entries, train

RUN = "rejections"
SPEC = TrainingSpec(workers=2, reducers=2, global_batch=64, iterations=4, eval_every=0)
# while the messages are rejected, reads of the weights entering iteration 2 take 6 s (workers', then
# reducers'): the run is still running when they are dead-lettered (after 3 receives, about 8 s)
HOLD = Faults(
    s3_get_delay=Delay(probability=1, seconds=6), s3_get_delay_match=rf"^runs/{RUN}/iters/000002/(weights\.npy|shards/)"
)
FORGED = 999  # the iteration the forged messages name: a step that took one in would fail the run
REDUCE = {
    "run_id": RUN,
    "iteration": FORGED,
    "shard": 0,
    "participants": [{"worker": 0, "samples": 32, "etag": etag_of(b"")}],
}
# topic, body, the function that receives it, what its rejection says
CASES: list[tuple[str, str, str, str]] = [
    ("Work", "work for run rejections, please", "worker", "WorkMessage message {id} rejected: not JSON: "),
    (
        "ModelUpdated",
        "{'Records': []}",
        "work_launcher",
        "RunStarted | ModelMerged | S3Notification message {id} rejected: not JSON",
    ),
    (
        "WorkDone",
        json.dumps({"run_id": RUN, "iteration": FORGED, "worker": 0}),
        "reduce_launcher",
        "WorkDone message {id} rejected: samples: Field required; loss: Field required; compute_s: Field required",
    ),
    (
        "ReduceDone",
        json.dumps({"run_id": RUN, "iteration": FORGED, "shard": 0, "forged": True}),
        "merger",
        "ReduceDone message {id} rejected: forged: Extra inputs are not permitted",
    ),
    (  # a valid Reduce message, but for the blank space after it
        "Reduce",
        json.dumps(REDUCE).ljust(MAX_MESSAGE_BYTES + 1),
        "reducer",
        f"ReduceMessage message {{id}} rejected: {MAX_MESSAGE_BYTES + 1} bytes,"
        f" over the {MAX_MESSAGE_BYTES}-byte limit",
    ),
]


def test_malformed_messages_are_dead_lettered_with_a_reason_and_fail_no_run(local, services, digits):
    sns = boto3.client("sns", **local.deployment.client_arguments())
    local.host.faults = HOLD
    try:
        train(services, SPEC, RUN)
        config_before = services.store.get(keys.run_config(RUN))
        bodies = {body: (function, reason) for _, body, function, reason in CASES}
        for topic, body, *_ in CASES:
            sns.publish(TopicArn=local.deployment.topic_arns[topic], Message=body)
        letters = dead_letters(local, bodies, 120)
        run = services.table.get_run(RUN)
    finally:
        local.host.faults = None
    assert run.status == "RUNNING", f"the run was {run.status} when the messages were dead-lettered: {run.reason}"
    assert set(letters) == set(bodies)
    for body, (function, reason) in bodies.items():
        letter = letters[body]  # the id is the one the function was handed (locally: the queued message's)
        expected = reason.format(id=letter["message_id"])
        assert letter["function"] == function and letter["rejected"], letter
        assert letter["error"].startswith(f"MessageRejected: {expected}"), (letter["error"], expected)
        assert letter["run_id"] == (RUN if function in ("reduce_launcher", "merger", "reducer") else None)
        logged = log_entries(local.log_dir / f"{function}.log", level="ERROR", message_id=letter["message_id"])
        assert [e["message"] for e in logged] == [letter["error"].removeprefix("MessageRejected: ")] * 3
    recorded = [json.loads(line) for line in (local.log_dir / "dead-letters.jsonl").read_text().splitlines()]
    for letter in letters.values():
        assert any(r["rejected"] and r["message_id"] == letter["message_id"] for r in recorded)

    run = finish(services, RUN)
    assert run.status == "COMPLETED", run.reason
    assert run.iteration == SPEC.iterations
    assert services.store.get(keys.run_config(RUN)) == config_before
    weights, _ = final_weights(services, RUN)
    assert np.isfinite(weights).all()
    iterations = services.table.list_iterations(RUN)
    assert [i.iteration for i in iterations] == list(range(SPEC.iterations))  # nothing recorded for iteration 999
    for iteration in iterations:
        assert [p.worker for p in iteration.participants] == list(range(SPEC.workers))
