"""The attack matrix: messages that are well-formed but do not belong to the run they name, sent with boto3
to the local cloud's topics and queues while a healthy run trains. Each is rejected (logged, dead-lettered,
counted) and the run completes with weights bit-identical to an undisturbed run's."""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
import numpy as np

from slsml.local.cloud import REGION
from slsml.local.faults import Delay, Faults
from slsml.spec.config import TrainingSpec

from .conftest import dead_letters, final_weights, finish, train

RUN, REFERENCE = "attacked", "attacked-reference"
SPEC = TrainingSpec(workers=2, reducers=2, global_batch=64, iterations=4, eval_every=0)
AT = 2  # the iteration the run is in when the messages come
# reads of the weights entering iteration AT take 6 s (workers', then reducers'): the run is still in it
# while the messages are retried and dead-lettered
HOLD = Faults(s3_get_delay=Delay(probability=1, seconds=6),
              s3_get_delay_match=rf"^runs/{RUN}/iters/{AT:06d}/(weights\.npy|shards/)")
PARTICIPANTS = [{"worker": 0, "samples": 32}, {"worker": 1, "samples": 32}]


def _message(**fields: Any) -> str:
    return json.dumps({"run_id": RUN, "iteration": AT, **fields})


# (topic, or "deadlines" for the watchdog's queue), body, the function it reaches, what its rejection says
ROWS: list[tuple[str, str, str, str]] = [
    ("Reduce", _message(shard=99, participants=PARTICIPANTS), "reducer", "shard 99 of a run of 2 reducers"),
    ("Reduce", _message(shard=0, participants=[{"worker": 0, "samples": 64}]), "reducer", "reduce of iteration 2"),
    ("Work", _message(iteration=AT + 1, worker=0, workers=2), "worker", "iteration 3 was not launched"),
    ("Work", _message(worker=5, workers=2), "worker", "worker 5 of an iteration of 2 workers"),
    ("Work", _message(worker=0, workers=4), "worker", "4 workers, but iteration 2 was launched with 2"),
    ("WorkDone", _message(worker=0, samples=10**12, loss=0.1, compute_s=1), "reduce_launcher",
     "1000000000000 samples, more than a worker's 64 of a round"),
    # "no update is stored at" its key, or "1 samples, but the update at" its key "holds 32", by when it comes
    ("WorkDone", _message(worker=1, samples=1, loss=0.1, compute_s=1), "reduce_launcher",
     f"runs/{RUN}/iters/{AT:06d}/updates/00001.bin"),
    ("ReduceDone", _message(shard=7), "merger", "shard 7 of a run of 2 reducers"),
    ("RunControl", json.dumps({"run_id": RUN, "task_token": "forged"}), "work_launcher",
     "no execution of run 'attacked' waits on its task token"),
    ("deadlines", _message(stage="work", round=0, due_at=1e15), "watchdog", "more than two deadline periods"),
    ("deadlines", _message(stage="work", round=0, due_at=1.0, forged=True), "watchdog", "Extra inputs"),
]


def test_messages_that_do_not_belong_to_a_run_are_rejected_and_change_nothing(local, services, digits):
    sns = boto3.client("sns", endpoint_url=local.deployment.endpoint, region_name=REGION)
    sqs = boto3.client("sqs", endpoint_url=local.deployment.endpoint, region_name=REGION)
    train(services, SPEC, REFERENCE)
    local.host.faults = HOLD
    try:
        train(services, SPEC, RUN)
        deadline = time.monotonic() + 120
        while services.table.get_run(RUN).iteration < AT:
            assert time.monotonic() < deadline, "the run never reached the iteration the messages are sent in"
            time.sleep(0.05)
        token = services.table.get_run(RUN).task_token
        for topic, body, *_ in ROWS:
            if topic == "deadlines":
                sqs.send_message(QueueUrl=local.deployment.deadline_queue_url, MessageBody=body)
            else:
                sns.publish(TopicArn=local.deployment.topic_arns[topic], Message=body)
        bodies = {body: (function, problem) for _, body, function, problem in ROWS}
        letters = dead_letters(local, bodies, deadline + 60 - time.monotonic())
        during = services.table.get_run(RUN)
    finally:
        local.host.faults = None
    assert during.status == "RUNNING", f"the run was {during.status} meanwhile: {during.reason}"
    assert during.task_token == token  # a forged start did not replace the execution's token
    missing = [bodies[b] for b in set(bodies) - set(letters)]
    assert not missing, f"not dead-lettered: {missing}"
    wrong = [(letters[body], function, problem) for body, (function, problem) in bodies.items()
             if not (letters[body]["function"] == function and letters[body]["rejected"]
                     and problem in letters[body]["error"])]
    assert not wrong, wrong

    run, reference = finish(services, RUN), finish(services, REFERENCE)
    assert (run.status, reference.status) == ("COMPLETED", "COMPLETED"), (run.reason, reference.reason)
    assert run.iteration == SPEC.iterations
    attacked, _ = final_weights(services, RUN)
    undisturbed, _ = final_weights(services, REFERENCE)
    assert np.array_equal(attacked, undisturbed)
