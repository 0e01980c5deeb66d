"""The plan of a round that outlasts the Worker's timeout (``slsml.cost.model.continuations``): it says in how many
invocations the round goes on, handed on between micro-batches as the worker's pacer (``slsml.training.progress``)
decides, and what handing on adds to an iteration; a round that fits one invocation, or of a single micro-batch,
adds nothing."""

from __future__ import annotations

import math

import pytest

from slsml.aws.storage import upload_parts
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.verdict import continuation_sentence
from slsml.cost.workload import Workload, function_timeouts
from slsml.spec.config import TrainingSpec
from slsml.training import progress

from .test_costmodel import plan_json, predict, workload

PARAMS, LOCAL_STEPS = 2_560_000, 100
LONG = TrainingSpec(algorithm="average", local_steps=LOCAL_STEPS)


def _long(**changes) -> Workload:
    """Rounds of 100 local steps of about 4 s each, each step in micro-batches: 400 s, past the Worker's default
    timeout."""
    fields = {"global_batch": 1024, "compute_per_sample_s": 0.05, "training": LONG} | changes
    return workload(PARAMS, workers=8, reducers=4, **fields)


def test_a_round_past_the_workers_timeout_goes_on_in_as_many_invocations_as_the_pacer_takes() -> None:
    plan = predict(_long())
    handing, w = plan.continuations, plan.workload
    compute = float(next(s for s in plan.stages if s.name == "Worker").detail.split("samples ")[1].split(" s")[0])
    assert plan.micro_batches > 1  # a step's share is over the memory at once
    micro_batches = LOCAL_STEPS * plan.micro_batches
    micro = compute / micro_batches
    assert handing.timeout_s == w.timeout_s["worker"] < compute
    # each invocation computes micro-batches until the pacer's reserve is left (after its reads, under a second here)
    reserve = progress.reserve_s(handing.progress_bytes, micro, Parameters().s3_write_mb_s)
    room = handing.timeout_s - reserve
    per = handing.micro_batches_per_invocation
    assert (per - 1) * micro <= room < per * micro + 1.0
    assert handing.invocations == math.ceil(micro_batches / per) >= 2
    # the local weights and optimizer state, and the micro-batches of a step under way added up
    assert handing.progress_bytes == progress.stored_bytes(
        PARAMS, PARAMS, LONG.local_optimizer_config(), LOCAL_STEPS, w.metric_values, partial=True
    )
    # against the same round in one invocation (a timeout it fits): the requests, bytes and time handing on adds
    whole = predict(_long(timeout_s={**w.timeout_s, "worker": 10**6}), quotas=Quotas(lambda_timeout_s=10**6))
    assert whole.continuations.invocations == 1 and not whole.continuations.calls
    more = {op: n - whole.requests_per_iteration.get(op, 0) for op, n in plan.requests_per_iteration.items()}
    handed = w.workers * handing.handed_on
    parts = upload_parts(handing.progress_bytes)  # the progress, stored as a multipart upload
    assert parts > 1
    assert {op: n for op, n in more.items() if n} == {
        "s3:CreateMultipartUpload": handed,
        "s3:UploadPart": parts * handed,
        "s3:CompleteMultipartUpload": handed,
        "s3:GetObject": (2 + w.reducers) * handed,  # the progress, the manifest and the R shards
        "sns:PublishBatch": handed,
        "dynamodb:PutItem": handed,
        "dynamodb:UpdateItem": 2 * handed,
    }
    assert sum(call.count for call in handing.calls) == sum(more.values())
    assert plan.iteration_s == pytest.approx(whole.iteration_s + handing.seconds)
    worker, alone = (next(f for f in p.functions if f.function == "worker") for p in (plan, whole))
    assert worker.invocations == w.workers * handing.invocations
    assert worker.bytes_written_total - alone.bytes_written_total == handed * handing.progress_bytes
    assert plan.run_dollars > whole.run_dollars


def test_a_round_that_fits_or_of_one_micro_batch_adds_nothing() -> None:
    short = predict(_long(training=TrainingSpec(algorithm="average", local_steps=10)))
    assert short.continuations.invocations == 1 and not short.continuations.calls
    # a gradient round whose share fits at once is one micro-batch: it cannot go on elsewhere, and runs over
    whole = predict(_long(compute_per_sample_s=5.0, activation_bytes_per_sample=0, training=TrainingSpec()))
    assert (whole.micro_batches, whole.continuations.invocations) == (1, 1)
    assert any(q.name == "duration: worker" and not q.ok for q in whole.quotas)


def test_the_plan_says_when_rounds_go_on_and_what_it_costs(capsys: pytest.CaptureFixture) -> None:
    argv = ["--params", str(PARAMS), "--compute-per-sample", "0.05", "--workers", "8", "--batch", "1024"]
    out = plan_json(capsys, *argv, "--iterations", "10", "--algorithm", "average", "--local-steps", str(LOCAL_STEPS))
    handing = out["continuations"]
    timeout = function_timeouts()["worker"]
    (warning,) = [w for w in out["verdict"]["warnings"] if "outlasts the Worker's" in w]
    assert warning.startswith(
        f"each worker's round outlasts the Worker's {timeout} s timeout: it goes on in {handing['invocations']}"
        f" invocations of {handing['micro_batches_per_invocation']} micro-batches of ≤ {out['micro_batch']} samples"
    )
    assert f"adds {sum(c['count'] for c in handing['calls']):,} requests" in warning
    steps = predict(_long(activation_bytes_per_sample=0))  # a step's share at once: handed on between local steps
    per = steps.continuations.micro_batches_per_invocation
    assert f"invocations of {per} local steps, each handing on" in (continuation_sentence(steps) or "")
    assert "--heartbeat" not in warning  # the iteration is within the default heartbeat
    short = predict(_long(training=LONG.model_copy(update={"heartbeat_s": 60})))
    sentence = continuation_sentence(short) or ""
    assert sentence.endswith(f"; raise --heartbeat above {math.ceil(short.iteration_s)} s (it is 60 s)")
    assert continuation_sentence(predict(_long(training=TrainingSpec(algorithm="average")))) is None
