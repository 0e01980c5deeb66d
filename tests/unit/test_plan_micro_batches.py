"""The plan prices what runs: each worker computes its share of a batch in micro-batches that fit its memory
(``slsml.rounds.sizing``, the worker's own estimate), a gradient round past the Worker's timeout is handed on between
them as the worker's pacer decides, and a plan over memory answers with its figures and the memory to give."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from slsml import rules
from slsml.aws.cache import MEMORY_SHARE
from slsml.aws.storage import upload_parts
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.verdict import continuation_sentence
from slsml.cost.workload import MEMORY_CHOICES_MB, Workload, function_memory
from slsml.rounds import accumulate, sizing
from slsml.spec.config import TrainingSpec
from slsml.training import feedback, progress

from .test_costmodel import RESNET, function, plan_json, predict, workload

# slsML's workload: ResNet-50's weights on ImageNet's samples, a batch of 8K
SLSML = (
    *("--params", str(RESNET), "--compute-per-sample", "0.1", "--sample-bytes", "150528", "--batch", "8192"),
    *("--epochs", "1", "--samples", "1281167"),
)


def _quotas(out: dict) -> dict[str, dict]:
    return {q["name"]: q for q in out["quotas"]}


@pytest.mark.parametrize(
    ("memory_mb", "training"),
    [
        (4096, TrainingSpec()),
        (10240, TrainingSpec()),
        (10240, TrainingSpec(compress="topk:0.01")),  # the residual, twice
        (5307, TrainingSpec(algorithm="average", local_steps=2, local_state="keep", local_optimizer="adam")),
    ],
)
def test_the_plans_micro_batches_are_the_ones_the_worker_sizes(memory_mb: int, training: TrainingSpec) -> None:
    work = workload(workers=8, memory_mb=function_memory({"worker": memory_mb}), training=training)
    plan = predict(work)
    # what the worker keeps besides, as ``sizing.of_run`` counts it: twice its slot's state and residual
    slot = rules.of(training).slot_traffic(training, RESNET, RESNET).bytes
    residual = feedback.residual_bytes(RESNET) if training.compression.lossy else 0
    memory = sizing.WorkerMemory(
        memory_mb, MEMORY_SHARE * memory_mb, 4 * RESNET, work.activation_bytes_per_sample, 2 * slot + 2 * residual
    )
    share = 8192 // 8
    assert plan.micro_batch == memory.micro_batch() >= 1
    assert plan.micro_batches == memory.micro_batches(share) > 1
    needed = function(plan, "worker").memory_needed_mb
    assert needed == pytest.approx(memory.needed_mb(accumulate.sizes(share, plan.micro_batch)[0], plan.micro_batches))
    assert needed <= memory_mb < memory.needed_mb(share)  # within memory in micro-batches, over at once


def test_a_micro_batched_sweep_is_within_memory_at_every_workers_count(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """The acceptance sweep: no W over memory, each worker's share in micro-batches, and a round handed on where it
    outlasts the Worker's timeout."""
    out = plan_json(capsys, *SLSML, "--memory", "worker=10240", "--sweep", "1,8,32,256", "--png", str(tmp_path / "s"))
    points = out["sweep"]
    assert [point["workers"] for point in points] == [1, 8, 32, 256]
    for point in points:
        W = point["workers"]
        plan = predict(Workload(**out["workload"], workers=W, reducers=point["reducers"]))
        worker = function(plan, "worker")
        assert not point["violations"] and not plan.violations, W
        assert worker.memory_needed_mb <= 10240, W
        assert (
            (point["micro_batch"], point["micro_batches"]) == (plan.micro_batch, plan.micro_batches) != (8192 // W, 1)
        )
        assert point["micro_batches"] == math.ceil(8192 / W / point["micro_batch"])
        assert point["invocations"] == plan.continuations.invocations
        compute = float(re.search(r"samples ([\d.]+) s", next(s for s in plan.stages if s.name == "Worker").detail)[1])
        assert (point["invocations"] > 1) == (compute > 120), W  # handed on where the round outlasts the timeout
    assert points[0]["invocations"] > 1


def _paced(
    monkeypatch: pytest.MonkeyPatch, micro_batches: int, micro_s: float, timeout_s: float, setup_s: float, stored: int
) -> list[int]:
    """The micro-batches each invocation computes of a round of ``micro_batches`` micro-batches of ``micro_s`` each,
    each invocation of ``timeout_s`` first spending ``setup_s``, as the worker's ``progress.Pacer`` hands it on (on a
    clock of its own)."""
    clock = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    computed: list[int] = []
    while sum(computed) < micro_batches:
        deadline = clock[0] + timeout_s
        clock[0] += setup_s
        pacer = progress.Pacer(lambda deadline=deadline: deadline - clock[0], stored)
        computed.append(0)
        while sum(computed) < micro_batches and not pacer.pause():
            clock[0] += micro_s
            computed[-1] += 1
    return computed


def test_a_gradient_round_past_the_timeout_is_handed_on_between_micro_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    params, micro_batch = 2_560_000, 4
    training = TrainingSpec(micro_batch=micro_batch)
    work = workload(params, workers=8, global_batch=1024, compute_per_sample_s=5.0, training=training, samples=None)
    plan = predict(work)
    handing, W, R = plan.continuations, work.workers, work.reducers
    assert (plan.micro_batch, plan.micro_batches) == (micro_batch, 1024 // 8 // micro_batch)
    worker = next(s for s in plan.stages if s.name == "Worker").detail
    compute = float(re.search(r"samples ([\d.]+) s", worker)[1])
    setup = 0.005 + 0.005 + float(re.search(r"read weights \(\d+ shards\) ([\d.]+) s", worker)[1])  # handler, check
    # the micro-batches of its one step added up, in float64; no local weights
    assert handing.progress_bytes == progress.stored_bytes(
        params, params, training.local_optimizer_config(), 1, work.metric_values, local_weights=False, partial=True
    )
    micro_s = compute / plan.micro_batches
    paced = _paced(monkeypatch, plan.micro_batches, micro_s, 120, setup, handing.progress_bytes)
    assert handing.invocations == len(paced) >= 3
    assert handing.micro_batches_per_invocation == paced[0]
    # against the same round in one invocation: each hand-on stores the progress, records the continuation and
    # publishes it; each continuation is checked and handled once, and reads the progress and the weights again
    whole = predict(work.at(timeout_s={**work.timeout_s, "worker": 10**6}), quotas=Quotas(lambda_timeout_s=10**6))
    assert whole.continuations.invocations == 1
    more = {op: n - whole.requests_per_iteration.get(op, 0) for op, n in plan.requests_per_iteration.items()}
    handed = W * handing.handed_on
    parts = upload_parts(handing.progress_bytes)  # the progress, stored as a multipart upload
    assert parts > 1
    assert {op: n for op, n in more.items() if n} == {
        "s3:CreateMultipartUpload": handed,
        "s3:UploadPart": parts * handed,
        "s3:CompleteMultipartUpload": handed,
        "s3:GetObject": (2 + R) * handed,
        "dynamodb:UpdateItem": 2 * handed,
        "sns:PublishBatch": handed,
        "dynamodb:PutItem": handed,
    }
    assert function(plan, "worker").invocations == W * handing.invocations
    assert function(plan, "worker").bytes_written_total - function(whole, "worker").bytes_written_total == (
        handed * handing.progress_bytes
    )
    assert plan.iteration_s == pytest.approx(whole.iteration_s + handing.seconds)
    assert plan.run_dollars > whole.run_dollars
    assert next(q for q in plan.quotas if q.name == "duration: worker").ok  # each invocation within its timeout
    sentence = continuation_sentence(plan) or ""
    per = handing.micro_batches_per_invocation
    assert f"in {handing.invocations} invocations of {per} micro-batches of ≤ {micro_batch} samples" in sentence


def test_the_acceptance_plan_at_the_memory_it_names_answers(capsys: pytest.CaptureFixture) -> None:
    """At the default 3,008 MB a ResNet-50 sample's step does not fit beside the runtime, the 1,504 MB cache and the
    model's buffers; at the memory the plan names it does, a few samples at a time."""
    default = _quotas(plan_json(capsys, *SLSML, "--workers", "256"))["memory: worker"]
    assert not default["ok"] and default["limit"] == 3008 and "(not one fits)" in default["detail"]
    give = int(re.search(r"\(--memory worker=(\d+)\)", default["detail"])[1])
    out = plan_json(capsys, *SLSML, "--workers", "256", "--memory", f"worker={give}")
    worker = _quotas(out)["memory: worker"]
    assert worker["ok"] and worker["limit"] == give
    memory = sizing.WorkerMemory(give, MEMORY_SHARE * give, 4 * RESNET, out["workload"]["activation_bytes_per_sample"])
    fitting = memory.micro_batch()
    assert 1 <= fitting < 8192 // 256  # a few samples' layer outputs at a time
    assert (out["micro_batch"], out["micro_batches"]) == (fitting, memory.micro_batches(8192 // 256))


def test_a_plan_of_which_not_one_sample_fits_answers_naming_the_memory_to_give(capsys: pytest.CaptureFixture) -> None:
    argv = (*SLSML, "--workers", "256", "--reducers", "64")
    out = plan_json(capsys, *argv, "--memory", "worker=2048")
    check = _quotas(out)["memory: worker"]
    assert (check["ok"], check["hard"]) == (False, True)
    assert "(not one fits)" in check["detail"]
    give = int(re.search(r"over by [\d,]+ MB \(--memory worker=(\d+)\)", check["detail"])[1])
    assert check["detail"] in out["verdict"]["binds"]
    assert out["dollars"]["run"] > 0 and out["micro_batch"] == 1
    # the memory it names is the least of the choices that fit
    assert _quotas(plan_json(capsys, *argv, "--memory", f"worker={give}"))["memory: worker"]["ok"]
    below = MEMORY_CHOICES_MB[MEMORY_CHOICES_MB.index(give) - 1]
    assert not _quotas(plan_json(capsys, *argv, "--memory", f"worker={below}"))["memory: worker"]["ok"]
    # a model whose buffers are beyond Lambda's memory: still answered, with what to change instead
    huge = plan_json(capsys, "--params", "3000000000", "--workers", "1000", "--batch", "8192", "--reducers", "256")
    assert "beyond Lambda's 10,240 MB: a smaller model" in _quotas(huge)["memory: worker"]["detail"]


def test_micro_batch_sets_the_plans_micro_batches(capsys: pytest.CaptureFixture) -> None:
    argv = (*SLSML, "--workers", "8", "--reducers", "64", "--memory", "worker=10240")
    fitting, given = plan_json(capsys, *argv), plan_json(capsys, *argv, "--micro-batch", "8")
    assert (given["micro_batch"], given["micro_batches"]) == (8, 1024 // 8)
    assert fitting["micro_batch"] > 8 and fitting["micro_batches"] == math.ceil(1024 / fitting["micro_batch"])
    needs = {name: _quotas(out)["memory: worker"]["value"] for name, out in (("fitting", fitting), ("given", given))}
    assert needs["given"] < needs["fitting"]
    over = _quotas(plan_json(capsys, *argv, "--micro-batch", "64"))["memory: worker"]  # more than fit
    assert not over["ok"] and f"({fitting['micro_batch']} fit)" in over["detail"]


def test_a_keras_model_sizes_its_micro_batch_from_its_layer_outputs(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    import keras

    model = keras.Sequential(
        [
            keras.Input((64, 64, 3)),
            keras.layers.Conv2D(64, 3, padding="same"),
            keras.layers.Conv2D(64, 3, padding="same"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    model.save(tmp_path / "conv.keras")
    out = plan_json(capsys, "--model", str(tmp_path / "conv.keras"), "--workers", "1", "--batch", "4096")
    layer_outputs = sizing.sample_bytes(model)
    assert out["workload"]["activation_bytes_per_sample"] == layer_outputs
    assert out["workload"]["compute_source"].startswith("measured")
    memory = sizing.WorkerMemory(3008, MEMORY_SHARE * 3008, 4 * model.count_params(), layer_outputs)
    assert out["micro_batch"] == memory.micro_batch() < 4096
    assert out["micro_batches"] == memory.micro_batches(4096) > 1


def test_calibrated_runtime_and_buffers_change_the_memory_needed_not_the_micro_batch() -> None:
    """The worker sizes its micro-batches with its own estimate; the plan's parameters, overridden, say what the
    step then needs."""
    work = workload(workers=8, memory_mb=function_memory({"worker": 10240}))
    plan = predict(work)
    heavier = predict(
        work, Parameters(tf_runtime_mb=sizing.TF_RUNTIME_MB + 100, worker_model_copies=sizing.MODEL_COPIES + 1)
    )
    assert (heavier.micro_batch, heavier.micro_batches) == (plan.micro_batch, plan.micro_batches)
    added = function(heavier, "worker").memory_needed_mb - function(plan, "worker").memory_needed_mb
    assert added == pytest.approx(100 + 4 * RESNET / sizing.MB)
