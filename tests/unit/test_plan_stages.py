"""The plan of a model in pipeline stages: the fewest stages whose memory fits the worker, each stage's figures,
the round's bubble, hops and dollars, and its pick against one bigger function."""

from __future__ import annotations

import math
import re
from pathlib import Path

import keras
import pytest

from slsml.aws.storage import PART_BYTES
from slsml.cli.main import main

from .test_costmodel import plan_json

DENSE = ("--params", "1500000000", "--dense-layers", "24", "--compute-per-sample", "0.2", "--memory", "worker=10240")


def test_a_dense_model_past_ten_gigabytes_is_planned_in_stages_that_each_hold_their_own_weights(
    capsys: pytest.CaptureFixture,
) -> None:
    """Each stage function holds its own weights and stores its own part of the update, which the reducers read by
    range: a 1.5-billion-parameter model fits CPU functions in stages, and the plan picks them."""
    out = plan_json(capsys, *DENSE, "--workers", "4", "--batch", "1024")
    pipeline = out["pipeline"]
    S, M, R = pipeline["stages"], pipeline["micro_batches"], out["workload"]["reducers"]
    assert 4 * 1_500_000_000 * 3 > 10e9  # weights and Adam's two slots
    assert not pipeline["given"] and 1 < S <= 24
    assert all(stage["memory_needed_mb"] <= 10240 for stage in pipeline["per_stage"])
    assert sum(stage["weight_bytes"] for stage in pipeline["per_stage"]) == 4 * 1_500_000_000
    assert pipeline["bubble"] == pytest.approx((S - 1) / (M + S - 1))
    assert M * pipeline["micro_batch"] >= 1024 // 4 > (M - 1) * pipeline["micro_batch"]
    # no stage holds the whole model (6 × 5,722 MB of buffers): stage 0 needs what the others do
    assert len({stage["memory_needed_mb"] for stage in pipeline["per_stage"]}) == 1
    hops, records = M * (S - 1) * 4, (S - 1) * 4  # each boundary, micro-batch and pipeline; each later stage's part
    requests = pipeline["requests_per_round"]
    assert requests["s3:PutObject"] == 2 * hops + records  # each activation and its gradient, and the parts' records
    # each stage's part (500 MB): a multipart upload of 8 MiB parts
    pieces = sum(math.ceil(stage["weight_bytes"] / PART_BYTES) for stage in pipeline["per_stage"])
    handing = pipeline["hand_ons"]["requests"]  # (a stage's round handed on stores its progress, multipart too)
    assert requests["s3:CreateMultipartUpload"] - handing.get("s3:CreateMultipartUpload", 0) == S * 4
    assert requests["s3:HeadObject"] - handing.get("s3:HeadObject", 0) == S * 4  # (looked for first: a retry's)
    assert requests["s3:UploadPart"] - handing.get("s3:UploadPart", 0) == 4 * pieces
    # each read once found, each input read again at the backward pass, the records, each reducer's reads of an
    # update's index and of the parts (more than an update's one range: R + S − 1 a pipeline); and the polls
    assert requests["s3:GetObject"] > 3 * hops + records + 4 * (R + S - 1)
    bigger = next(o for o in pipeline["options"] if o["name"] == "one bigger function")
    staged = next(o for o in pipeline["options"] if o["name"] == f"{S} stages of 10,240 MB")
    assert not bigger["fits"] and staged["fits"] and pipeline["deployed"] == [2] * S
    assert pipeline["pick"].startswith(f"{S} stages of 10,240 MB")
    # the Merger loads the whole model (49 GB with Adam's state): the stages do not split it
    merger = next(q for q in out["quotas"] if q["name"] == "memory: merger")
    assert not merger["ok"] and pipeline["merger"] == merger["detail"]
    assert pipeline["dollars_per_round"] > 0 and pipeline["round_s"] > 0
    # one stage fewer does not fit: the fewest were chosen
    assert main(["plan", *DENSE, "--workers", "4", "--pipeline-stages", str(S - 1)]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.endswith(
        f"--pipeline-stages {S - 1}: no split into {S - 1} stages fits a worker of 10,240 MB, each stage's function"
        f" holding its own stage's weights; {S} stages fit: give --pipeline-stages {S} or more, or the worker function"
        " more memory (--memory worker=MB)"
    )
    # a worker that no block fits: the block that needs the most, in a stage of its own
    assert main(["plan", *DENSE[:-1], "worker=2048", "--workers", "4", "--pipeline-stages", str(S)]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    found = re.search(
        rf"--pipeline-stages {S}: no split into {S} stages fits a worker of 2,048 MB: each stage's function holds its"
        r" own stage's weights, and layer 'dense_\d+' needs ~([\d,]+) MB for one sample in a stage of their own: give"
        r" the worker function more memory \(--memory worker=MB\)$",
        said,
    )
    assert found is not None and int(found[1].replace(",", "")) > 2048, said
    assert main(["plan", *DENSE, "--workers", "4", "--pipeline-stages", "25"]) == 2  # more stages than blocks
    said = capsys.readouterr().err.strip()
    assert said.endswith(
        "--pipeline-stages 25: the model's 24 blocks (the layers between its cut points) make 24 stages at most:"
        " give --pipeline-stages 24 or fewer"
    )


def test_a_model_that_fits_a_bigger_function_is_weighed_against_it(capsys: pytest.CaptureFixture) -> None:
    small = ("--params", "100000000", "--dense-layers", "8", "--compute-per-sample", "0.02", "--workers", "2")
    out = plan_json(capsys, *small, "--memory", "worker=3008")
    pipeline = out["pipeline"]
    bigger = next(o for o in pipeline["options"] if o["name"].startswith("one function of"))
    assert bigger["fits"] and pipeline["stages"] > 1
    assert pipeline["deployed"] is not None and len(pipeline["deployed"]) == pipeline["stages"]
    cheapest = min((o for o in pipeline["options"] if o["fits"]), key=lambda o: o["dollars"])
    assert pipeline["pick"].startswith(cheapest["name"])


def test_a_keras_model_is_cut_at_its_layers_and_one_without_a_cut_refused(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    model = keras.Sequential(
        [keras.Input((32,)), *(keras.layers.Dense(64, activation="relu") for _ in range(3)), keras.layers.Dense(4)]
    )
    model.compile(optimizer="sgd", loss="mse")
    path = tmp_path / "chain.keras"
    model.save(path)
    out = plan_json(capsys, "--model", str(path), "--compute-per-sample", "0.001", "--pipeline-stages", "2")
    stages = out["pipeline"]["per_stage"]
    assert len(stages) == 2 and out["pipeline"]["given"]
    assert out["pipeline"]["deployed"] == [2, 2]  # the split a run makes
    assert sum(s["weight_bytes"] for s in stages) == 4 * model.count_params()
    assert sum(s["flops_share"] for s in stages) == pytest.approx(1)
    x = keras.Input((8,))
    skipping = keras.Model(x, keras.layers.Add(name="skip")([x, keras.layers.Dense(8)(keras.layers.Dense(8)(x))]))
    skipping.compile(optimizer="sgd", loss="mse")
    skipping.save(tmp_path / "skip.keras")
    argv = ["plan", "--model", str(tmp_path / "skip.keras"), "--compute-per-sample", "0.001", "--pipeline-stages", "2"]
    assert main(argv) == 2
    assert "layer 'skip' takes the output of 'the input' across every boundary" in capsys.readouterr().err


def test_a_gpu_worker_is_weighed_beside_the_stages_when_one_is_planned(capsys: pytest.CaptureFixture) -> None:
    argv = ("--params", "100000000", "--dense-layers", "8", "--compute-per-sample", "0.02", "--workers", "2")
    out = plan_json(capsys, *argv, "--memory", "worker=8192", "--accelerator", "worker=24", "--pipeline-stages", "2")
    options = {o["name"]: o for o in out["pipeline"]["options"]}
    gpu = options["a GPU worker of 24 GiB on g6.xlarge"]
    assert gpu["fits"] and gpu["round_s"] > 0 and gpu["dollars"] > 0
    assert out["pipeline"]["memory_mb"] == 8192 and out["pipeline"]["stages"] == 2
    cheapest = min((o for o in options.values() if o["fits"]), key=lambda o: o["dollars"])
    assert out["pipeline"]["pick"].startswith(cheapest["name"])


def test_a_pass_or_a_sample_past_the_workers_timeout_does_not_fit(capsys: pytest.CaptureFixture) -> None:
    """A round goes on past the Worker's timeout between passes (stages) or micro-batches (one function), never within
    one: where a stage's pass, or one sample's step of the whole model, outlasts the timeout (120 s), the option does
    not fit; with a tenth of the compute both fit, the stages' round handed on in invocations the plan counts."""
    heavy = ("--params", "100000000", "--dense-layers", "8", "--workers", "1", "--batch", "8", "--micro-batch", "1")
    heavy += ("--pipeline-stages", "4", "--memory", "worker=10240", "--iterations", "2")
    for compute in ("3000", "300"):
        pipeline = plan_json(capsys, *heavy, "--compute-per-sample", compute)["pipeline"]
        options = {o["name"]: o for o in pipeline["options"]}
        staged, bigger = options["4 stages of 10,240 MB"], options["one function of 8,845 MB"]
        assert staged["fits"] is (compute == "300") and bigger["fits"] is (compute == "300"), (staged, bigger)
        assert ("outlasts the Worker's timeout of 120 s" in staged["detail"]) is (compute == "3000")
        assert ("outlasts the Worker's timeout of 120 s" in bigger["detail"]) is (compute == "3000")
        assert pipeline["hand_ons"]["invocations"] > 1 and pipeline["hand_ons"]["timeout_s"] == 120
    assert plan_json(capsys, *heavy, "--compute-per-sample", "3000")["pipeline"]["pick"] == (
        "none: 4 stages of 10,240 MB and one function of 8,845 MB do not fit"
    )
