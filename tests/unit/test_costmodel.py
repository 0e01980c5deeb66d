"""slsml plan: the cost model against the pipeline's real formats, physics and quotas, and its CLI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slsml.accounting import prices
from slsml.cli.main import main
from slsml.cost import predict as costmodel
from slsml.cost.chain import round_traffic
from slsml.cost.messages import LONGEST_ETAG, done_bytes, manifest_bytes
from slsml.cost.modelinfo import from_keras_file, from_params
from slsml.cost.parameters import Parameters, Quotas, load_overrides
from slsml.cost.plan import FunctionFigures, Plan, minimum_sentence
from slsml.cost.recommend import SWEEP_WORKERS, quota_changes, recommend
from slsml.cost.verdict import verdict as verdict_of
from slsml.cost.workload import Workload, function_memory, function_timeouts, with_memory
from slsml.pipeline import bus
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.spec.messages import Participant, ReduceMessage
from slsml.spec.shardplan import ShardPlan, VariableSpec
from slsml.training import optimizers, updates

PRICES = prices.PriceTable()
RESNET = 25_600_000


def workload(params: int = RESNET, workers: int = 8, reducers: int = 4, **changes) -> Workload:
    fields = from_params(params, Parameters()) | {
        "workers": workers,
        "reducers": reducers,
        "global_batch": 8192,
        "iterations": 100,
        "samples": 1_280_000,
        "memory_mb": function_memory(),
        "timeout_s": function_timeouts(),
    }
    return Workload(**(fields | changes))


def predict(work: Workload, parameters: Parameters | None = None, quotas: Quotas | None = None) -> Plan:
    return costmodel.predict(work, parameters or Parameters(), quotas or Quotas(), PRICES)


def function(plan: Plan, name: str) -> FunctionFigures:
    return next(f for f in plan.functions if f.function == name)


# ---- against the pipeline's own code -------------------------------------------------------------


@pytest.fixture(scope="module")
def keras_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A compiled Keras model with non-trainable weights (BatchNorm statistics), saved as .keras."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(37),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(5, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    path = tmp_path_factory.mktemp("model") / "small.keras"
    model.save(path)
    return path, model


def test_bytes_match_the_update_format_and_shard_plan_of_a_real_model(keras_model) -> None:
    from slsml.training import modelio

    path, model = keras_model
    specs = modelio.variable_specs(model)
    figures = from_keras_file(path, batch=4, measure=False, parameters=Parameters())
    work = workload(
        **figures, compute_per_sample_s=0.001, compute_source="test", workers=6, reducers=4, global_batch=60, quorum=0.5
    )
    plan = predict(work)
    shard_plan = ShardPlan.build(specs, 4)
    config = OptimizerConfig(name="adam")
    n = 3  # ⌈0.5 · 6⌉ participants

    update = updates.encode(modelio.get_flat(model, shard_plan), samples=10).body
    worker = function(plan, "worker")
    assert worker.bytes_written == len(update)
    assert worker.bytes_read == 4 * shard_plan.size
    assert figures["model_file_bytes"] == path.stat().st_size
    merger = function(plan, "merger")  # a steady merge lists the shards and writes the manifest naming them
    assert (merger.bytes_read, merger.bytes_written) == (0, manifest_bytes(4))

    def state_bytes(shard: int) -> int:
        trainable = int(shard_plan.shard(shard).trainable.sum())
        return sum(a.nbytes for a in optimizers.initial_state(config, trainable).values() if a.ndim == 1)

    parts = []
    for shard in range(4):
        first, last = updates.part_range(shard_plan, shard)
        weights = 4 * shard_plan.shard(shard).size
        assert last - first + 1 == weights
        parts.append((n * weights + weights + state_bytes(shard), weights + state_bytes(shard)))
    reducer = function(plan, "reducer")
    assert reducer.bytes_read_total == sum(read for read, _ in parts)
    assert reducer.bytes_written_total == sum(written for _, written in parts)
    assert reducer.bytes_read >= max(read for read, _ in parts)  # the reducer on the path: the largest shard
    assert plan.state_slots == 2


def test_the_plan_sizes_the_metrics_state_a_worker_sends_and_writes(tmp_path: Path) -> None:
    import keras

    from slsml.accounting import capacity
    from slsml.spec.messages import WorkDone
    from slsml.state.records import WorkerReport, dynamo, worker_sk
    from slsml.training import evaluation, modelio

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=[keras.metrics.AUC(num_thresholds=200)])
    path = tmp_path / "auc.keras"
    model.save(path)
    figures = from_keras_file(path, batch=4, measure=False, parameters=Parameters())

    # what a worker sends: its trainer's update of a batch, metered by the run's evaluator (steps/worker)
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 6), dtype=np.float32), rng.integers(0, 2, (16, 1)).astype(np.float32)
    loss = modelio.loss_config(model, None)
    trainer = modelio.Trainer(model, ShardPlan.build(modelio.variable_specs(model), 1), loss)
    metrics = modelio.metrics_config(model, modelio.classifies(loss))
    trainer.meter = evaluation.Evaluator(model, loss, metrics, (x[:2], y[:2])).batch_state
    update = trainer.compute_update(x, y)
    assert update.metrics is not None
    metered = [float(v) for v in update.metrics]  # as the worker's WorkDone carries them
    done = WorkDone(
        run_id="r",
        iteration=0,
        worker=0,
        samples=16,
        loss=update.loss,
        metrics=metered,
        compute_s=0.1,
        etag=LONGEST_ETAG,
    )
    assert figures["metric_values"] == len(update.metrics) > 800  # AUC: 4 × its thresholds

    # each worker's record as the ReduceLauncher stores it, and the counter's sum of them from the fire on
    W, R = 6, 2
    shape = {"compute_per_sample_s": 0.001, "compute_source": "t", "workers": W, "reducers": R}
    plan = predict(workload(**figures, **shape))
    alone = predict(workload(**figures | {"metric_values": 2}, **shape))
    report = WorkerReport.model_validate(done.model_dump()).model_dump()
    units = capacity.write_units(capacity.item_bytes({"pk": "RUN#r", "sk": worker_sk(0, 0), **dynamo(report)}))
    assert units > 1
    assert plan.write_units - alone.write_units >= (W + R + 2) * (units - 1)
    assert done_bytes(W, 16, len(metered)) >= len(done.model_dump_json())


def test_the_plan_refuses_a_metrics_state_over_what_a_report_carries(tmp_path: Path) -> None:
    import keras

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=[keras.metrics.AUC(num_thresholds=1100)])
    model.save(tmp_path / "big.keras")
    with pytest.raises(BadInputError, match=r"4,402 state values .* over the 4,096"):
        from_keras_file(tmp_path / "big.keras", batch=4, measure=False, parameters=Parameters())


def test_reducer_bytes_on_the_path_are_the_largest_shard_of_an_all_trainable_model() -> None:
    specs = [VariableSpec(name="kernel", shape=(1001,), trainable=True)]
    shard_plan = ShardPlan.build(specs, 7)
    plan = predict(
        workload(
            params=1001, workers=5, reducers=7, global_batch=50, optimizer=OptimizerConfig(name="sgd", momentum=0.9)
        )
    )
    largest = max(shard_plan.shard(s).size for s in range(7))
    assert function(plan, "reducer").bytes_read == (5 + 1) * 4 * largest + 4 * largest  # n parts + weights, 1 slot


def test_reduce_publishes_follow_the_bus_batching_of_real_messages() -> None:
    plan = predict(workload(workers=1000, reducers=100))
    reduce = ReduceMessage(
        run_id="r" * 63,
        iteration=999_999,
        shard=99,
        participants=tuple(Participant(worker=w, samples=9, etag=LONGEST_ETAG) for w in range(1000)),
    )
    batches = len(list(bus.batches([reduce.model_dump_json()] * 100)))
    assert batches > math.ceil(100 / 10)  # 1000 participants make a message too big for 10 in one batch
    # WorkLauncher ⌈W/10⌉, one WorkDone per worker, the Reduce batches, one ReduceDone per reducer, ModelMerged
    assert plan.requests_per_iteration["sns:PublishBatch"] == 100 + 1000 + batches + 100 + 1


def test_requests_follow_the_request_chain() -> None:
    """W = 8, R = 3, quorum 0.75: n = 6 participants, counted by hand from the chain's table (rounds within the
    Worker's timeout: none handed on)."""
    plan = predict(workload(workers=8, reducers=3, quorum=0.75, compute_per_sample_s=0.01))
    assert plan.participants == 6
    assert plan.requests_per_iteration == {
        "dynamodb:GetItem": 1,  # the launch's read of the run (a message's checks make no request)
        "dynamodb:UpdateItem": 1 + 8 + 1 + 3 + 2,  # claim, counters, fire, merger counters, fire+merge, advance
        "dynamodb:PutItem": 8 + 1,  # records, participants
        "dynamodb:BatchGetItem": 1,
        # the manifest and 3 shards per worker; 6 parts, the shard and the manifest that names it per reducer
        "s3:GetObject": 8 * (1 + 3) + 3 * 8,
        "s3:ListObjectsV2": 1,  # the merge's list of the shards
        "s3:PutObject": 1,  # the manifest
        # the updates and the shards, of 102 MB each: multipart uploads of 13 parts of 8 MiB (storage.upload_parts)
        "s3:CreateMultipartUpload": 8 + 3,
        "s3:UploadPart": (8 + 3) * 13,
        "s3:CompleteMultipartUpload": 8 + 3,
        "s3:DeleteObjects": 1,  # the 3 superseded shards
        "sns:PublishBatch": 1 + 8 + 1 + 3 + 1,  # Work, WorkDone, Reduce, ReduceDone, ModelMerged
    }
    assert plan.minimum_requests_per_iteration == plan.requests_per_iteration | {
        "dynamodb:UpdateItem": 1 + 3 + 1,  # claim, merger counters (the shards' durable reports), merge fire
    }
    assert [(extra.operation, extra.count) for extra in plan.extra_calls] == [
        ("dynamodb:UpdateItem", 8),
        ("dynamodb:UpdateItem", 1),
        ("dynamodb:UpdateItem", 1),
    ]
    assert plan.first_iteration.extra_requests["s3:GetObject"] > 0


def test_a_cold_worker_reads_the_model_file_instead_of_the_shards_entering_the_first_iteration() -> None:
    """The first iteration's extra reads: each cold container's run.json, each worker's model file and dataset
    manifest, less the manifest and R shards a steady worker reads (the model file holds the first weights)."""

    def extra(reducers: int) -> int:
        return predict(workload(workers=8, reducers=reducers)).first_iteration.extra_requests["s3:GetObject"]

    # one reducer more: its and its Merger's run.json, and one shard fewer read by each of the 8 workers
    assert extra(4) - extra(3) == 2 - 8


def test_the_superseded_state_takes_a_delete_per_thousand_keys() -> None:
    def deletes(**spec: Any) -> int:
        training = TrainingSpec(global_batch=8192, **spec)
        return predict(workload(workers=8, reducers=3, training=training)).requests_per_iteration["s3:DeleteObjects"]

    assert deletes() == 1  # 3 shards
    assert deletes(max_workers=997) == 1  # no slot state: the workers' bound does not matter
    # a residual per worker slot the run may have: 3 + 997 keys, then one more
    assert deletes(max_workers=997, compress="topk:0.01") == 1
    assert deletes(max_workers=998, compress="topk:0.01") == 2
    # and a slot state beside it
    assert deletes(max_workers=998, compress="topk:0.01", algorithm="average", local_state="keep") == 2
    assert deletes(max_workers=999, compress="topk:0.01", algorithm="average", local_state="keep") == 3


def test_the_chain_is_its_minimum_and_the_extras_within_a_fifth_of_it() -> None:
    ratios = {}
    for workers in (1, 4, 16, 64, 256, 1000):
        for reducers in (1, 2, 4, 16, 100):
            for quorum in (1, 0.75):
                plan = predict(workload(params=1_000_000, workers=workers, reducers=reducers, quorum=quorum))
                total, minimum = plan.requests_per_iteration, plan.minimum_requests_per_iteration
                assert total.keys() == minimum.keys()
                for operation in total:
                    extras = sum(extra.count for extra in plan.extra_calls if extra.operation == operation)
                    assert total[operation] - minimum[operation] == extras, (workers, reducers, quorum, operation)
                assert all(extra.reason for extra in plan.extra_calls)
                ratios[workers, reducers, quorum] = plan.requests_ratio
    assert max(ratios.values()) < 1.2


def test_the_docs_state_the_demos_requests_and_the_extras() -> None:
    plan = predict(workload(params=100_000, workers=4, reducers=2, global_batch=128))
    page = " ".join((Path(__file__).parents[2] / "docs" / "cost.md").read_text().split())
    assert minimum_sentence(plan) in page
    for extra in plan.extra_calls:
        assert extra.reason in page


# ---- physics ------------------------------------------------------------------------------------


def test_doubling_workers_doubles_the_workers_requests() -> None:
    base = workload(compute_per_sample_s=0.01)  # rounds within the Worker's timeout at either W
    small, large = predict(base.at(workers=16)), predict(base.at(workers=32))
    # minus the reducers' and merger's; the updates and the shards are multipart uploads
    for operation, others in (("s3:CreateMultipartUpload", 4), ("dynamodb:PutItem", 1)):
        workers_own = [plan.requests_per_iteration[operation] - others for plan in (small, large)]
        assert workers_own[1] == 2 * workers_own[0]
    assert function(large, "worker").invocations == 2 * function(small, "worker").invocations
    assert function(large, "reducer").bytes_read_total > function(small, "reducer").bytes_read_total


def test_compute_bound_epochs_cost_the_same_and_take_half_the_time_with_twice_the_workers() -> None:
    base = workload(params=10_000, reducers=1, compute_per_sample_s=0.5)  # tiny model, slow samples
    small, large = predict(base.at(workers=16)), predict(base.at(workers=32))
    assert large.epoch_s / small.epoch_s == pytest.approx(0.5, rel=0.03)
    assert large.epoch_dollars == pytest.approx(small.epoch_dollars, rel=0.03)


def test_communication_bound_iterations_grow_with_workers_at_fixed_reducers() -> None:
    base = workload(compute_per_sample_s=1e-6)
    times = [predict(base.at(workers=w)).iteration_s for w in (64, 128, 256, 512)]
    assert times == sorted(times)


def test_memory_buys_worker_compute_and_a_quorum_saves_reads() -> None:
    base = workload(workers=64)
    small = predict(with_memory(base, worker=1769))
    large = predict(with_memory(base, worker=10240))
    assert function(large, "worker").seconds < function(small, "worker").seconds
    full, quorum = predict(base), predict(base.at(quorum=0.5))
    assert quorum.requests_per_iteration["s3:GetObject"] < full.requests_per_iteration["s3:GetObject"]
    assert quorum.iteration_s < full.iteration_s


def test_the_dynamodb_counter_floors_an_instant_chain() -> None:
    instant = Parameters(
        **{
            name: 0
            for name in (
                "s3_event_s",
                "sns_lambda_s",
                "sns_publish_s",
                "s3_request_s",
                "dynamodb_s",
                "handler_s",
                "average_ns",
                "optimizer_ns",
            )
        },
        s3_read_mb_s=1e12,
        s3_write_mb_s=1e12,
        keras_mb_s=1e12,
    )
    plan = predict(workload(params=1000, workers=500, reducers=10, compute_per_sample_s=0), instant)
    assert plan.iteration_s == pytest.approx((500 + 10 + 3) / 1000)
    assert plan.binding.name == "DynamoDB partition writes"
    assert not plan.binding.ok


def test_the_binding_quota_switches_to_reducer_memory_once_the_parts_outgrow_it() -> None:
    """R = 10 shards of a 25.6 M-weight model are 10.24 MB parts: a 3008 MB reducer holds fewer than
    3008 / 10.24 = 293 of them. Below that the worker's memory (its runtime, warm cache and model buffers) is the
    closest limit."""
    memory = function_memory({"worker": 3008, "reducer": 3008})
    base = workload(reducers=10, compute_per_sample_s=0.01, activation_bytes_per_sample=0, memory_mb=memory)
    assert predict(base.at(workers=150)).binding.name == "memory: worker"
    over = predict(base.at(workers=300)).binding
    assert (over.name, over.ok, over.hard) == ("memory: reducer", False, True)
    changes = quota_changes(base, Parameters(), Quotas(), PRICES, top=400)
    threshold = next(w for w, name, exceeded in changes if name == "memory: reducer" and exceeded)
    assert 270 < threshold <= 293


# ---- the command --------------------------------------------------------------------------------


def plan_json(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_is_one_object_with_requests_keyed_like_a_run_summary(capsys: pytest.CaptureFixture) -> None:
    out = plan_json(capsys, "--params", "100000", "--workers", "4", "--reducers", "2", "--iterations", "10")
    assert all(re.fullmatch(r"(s3|dynamodb|sns):[A-Z][A-Za-z0-9]+", key) for key in out["requests_per_iteration"])
    assert all(isinstance(count, int) for count in out["requests_per_iteration"].values())
    assert out["dollars"]["run"] > 10 * out["dollars"]["iteration"] > 0
    assert {q["name"] for q in out["quotas"]} >= {"Lambda concurrency", "DynamoDB partition writes", "S3 GET rate"}
    configured = [q for q in out["quotas"] if q["name"] not in ("zip package", "container image")]
    assert out["binding"].startswith(max(configured, key=lambda q: q["utilization"])["name"])
    total, minimum = out["requests_per_iteration"], out["minimum_requests_per_iteration"]
    assert out["requests_ratio"] == sum(total.values()) / sum(minimum.values()) == 59 / 53
    assert sum(extra["count"] for extra in out["extra_calls"]) == sum(total.values()) - sum(minimum.values())
    assert out["recommendation"]["fastest"]["reducers"] >= 1
    assert out["parameters"]["sns_lambda_s"] == {
        "value": 0.073,
        "unit": "s",
        "what": "SNS → Lambda delivery",
        "source": "published p50 73 ms (p90 125 ms, p99 225 ms)",
    }


def test_calibration_and_params_override_the_defaults(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    calibration = tmp_path / "fitted.json"
    calibration.write_text(json.dumps({"s3_read_mb_s": 130.0}))
    argv = ("--params", "1000000", "--workers", "8", "--reducers", "2", "--iterations", "10")
    base = plan_json(capsys, *argv)
    fitted = plan_json(capsys, *argv, "--calibration", str(calibration))
    assert fitted["parameters"]["s3_read_mb_s"] == base["parameters"]["s3_read_mb_s"] | {
        "value": 130.0,
        "source": "calibration fitted.json",
    }
    assert fitted["iteration_s"] < base["iteration_s"]
    slower = plan_json(capsys, *argv, "--param", "sns_lambda_s=0.2")
    assert slower["parameters"]["sns_lambda_s"]["source"] == "given"
    # five SNS deliveries on the path: ModelUpdated, Work, WorkDone, Reduce, ReduceDone
    assert slower["iteration_s"] - base["iteration_s"] == pytest.approx(5 * (0.2 - 0.073))
    with pytest.raises(BadInputError, match=r"unknown parameters.*sns_lambda_s"):
        load_overrides(None, ["sns_latency=1"], Parameters)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--params", "1000", "--workers", "800", "--batch", "8192", "--quota", "lambda_concurrency=500"],
            "concurrency quota of 500 by 300",
        ),
        (["--params", "1000", "--workers", "1200", "--batch", "8192"], "--workers: .* less than or equal to 1000"),
        (
            [
                "--params",
                "1000",
                "--workers",
                "1000",
                "--reducers",
                "2",
                "--batch",
                "8192",
                "--quota",
                "sns_message_bytes=20000",
            ],
            "SNS allows 20,000 B.*over by",
        ),
        (["--params", "10", "--workers", "2", "--reducers", "20"], "20 reducers but the model has only 10 weights"),
        (
            ["--params", "1000", "--workers", "8", "--batch", "4"],
            r"--batch \(4\) must be at least the number of --workers \(8\)",
        ),
        (["--params", "1000", "--memory", "worker=20000"], "outside Lambda's 128–10,240 MB"),
    ],
)
def test_impossible_settings_name_the_limit(capsys: pytest.CaptureFixture, argv: list[str], message: str) -> None:
    assert main(["plan", *argv]) == 2
    assert re.search(message, " ".join(capsys.readouterr().err.split()))


def test_sweep_writes_a_chart_with_a_point_per_worker_count(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    from matplotlib import image
    from PIL import Image

    png = tmp_path / "sweep.png"
    out = plan_json(
        capsys,
        "--params",
        "1000000",
        "--reducers",
        "4",
        "--batch",
        "64",
        "--epochs",
        "1",
        "--samples",
        "6400",
        "--sweep",
        "--png",
        str(png),
    )
    expected = [w for w in SWEEP_WORKERS if w <= 64]
    assert [point["workers"] for point in out["sweep"]] == expected
    pixels = image.imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    drawn = json.loads(Image.open(png).text["slsml-sweep"])
    assert [point["workers"] for point in drawn] == expected
    assert all(point["epoch_dollars"] > 0 for point in drawn)


def test_a_sweep_over_given_workers_prices_each_as_it_would_run(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """slsML's workload, whose workers' shares of the batch are over their memory at once: the sweep prices the W
    it is given, each worker computing its share in micro-batches, and leaves out a W above the batch."""
    out = plan_json(
        capsys,
        *("--params", "25600000", "--compute-per-sample", "0.1", "--sample-bytes", "150528", "--batch", "8192"),
        *("--epochs", "1", "--samples", "1281167", "--memory", "worker=10240"),
        *("--sweep", "64,16,256,16384", "--png", str(tmp_path / "sweep.png")),
    )
    points = {point["workers"]: point for point in out["sweep"]}
    assert list(points) == [16, 64, 256]
    assert not any(point["violations"] for point in points.values())
    assert [points[w]["micro_batches"] for w in points] == [
        math.ceil(8192 / w / points[w]["micro_batch"]) for w in points
    ]
    assert points[16]["epoch_s"] > points[64]["epoch_s"]  # compute shrinks with W …
    assert points[16]["epoch_dollars"] < points[64]["epoch_dollars"] < points[256]["epoch_dollars"]  # … overhead grows
    assert out["workload"]["global_batch"] == 8192 and "workers" not in out["workload"]
    with pytest.raises(SystemExit):
        main(["plan", "--params", "1000", "--epochs", "1", "--samples", "6400", "--sweep", "4,x"])
    assert "'4,x': write worker counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "--params", "1000", "--epochs", "1", "--samples", "6400", "--sweep", "--compare-vm", "9:3"])
    assert "argument --compare-vm: not allowed with argument --sweep" in capsys.readouterr().err


def test_a_keras_model_is_counted_and_timed(capsys: pytest.CaptureFixture, keras_model) -> None:
    path, model = keras_model
    out = plan_json(
        capsys, "--model", str(path), "--workers", "2", "--reducers", "2", "--batch", "16", "--iterations", "5"
    )
    assert out["workload"]["params"] == model.count_params()
    assert out["workload"]["compute_source"].startswith("measured")
    assert out["workload"]["compute_per_sample_s"] > 0
    assert out["workload"]["optimizer"]["name"] == "adam"
    assert np.isfinite(out["iteration_s"])


def test_a_model_of_two_inputs_and_two_outputs_is_timed(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    import keras

    pixels, extra = keras.Input((8, 8, 1), name="pixels"), keras.Input((3,), name="extra")
    hidden = keras.layers.Concatenate()([keras.layers.Flatten()(pixels), extra])
    outputs = [keras.layers.Dense(10, name="digit")(hidden), keras.layers.Dense(1, name="size")(hidden)]
    model = keras.Model({"pixels": pixels, "extra": extra}, outputs)
    model.compile(optimizer="adam", loss={"digit": "sparse_categorical_crossentropy", "size": "mse"})
    model.save(tmp_path / "multi.keras")
    out = plan_json(capsys, "--model", str(tmp_path / "multi.keras"), "--batch", "16", "--iterations", "5")
    assert out["workload"]["params"] == model.count_params()
    assert out["workload"]["sample_bytes"] == 4 * (8 * 8 + 3)  # both inputs of a sample
    assert out["workload"]["compute_source"].startswith("measured")


# ---- update rules and options ---------------------------------------------------------------------


@pytest.mark.parametrize("compress", ["none", "fp16", "topk:0.01", "significance:0.05"])
def test_the_plan_s_update_is_as_large_as_the_encoder_s(keras_model, compress: str) -> None:
    from slsml.training import modelio

    path, model = keras_model
    spec = TrainingSpec(workers=4, reducers=3, compress=compress)
    plan_of = ShardPlan.build(modelio.variable_specs(model), 3)
    rng = np.random.default_rng(0)
    vector, weights = rng.normal(size=plan_of.size).astype(np.float32), rng.normal(size=plan_of.size)
    body = updates.encode(vector, 32, "gradient", spec.compression, plan_of, weights.astype(np.float32)).body
    figures = from_keras_file(path, batch=32, measure=False, parameters=Parameters())
    trainable = plan_of.trainable_mask()
    sent = (np.abs(vector) > 0.05 * np.maximum(np.abs(weights), updates.SIGNIFICANCE_EPS))[trainable].mean()
    traffic = round_traffic(
        Workload(
            **figures,
            compute_per_sample_s=0,
            compute_source="-",
            training=spec,
            workers=4,
            reducers=3,
            global_batch=128,
            iterations=1,
            memory_mb=function_memory(),
            timeout_s=function_timeouts(),
        ),
        Parameters(significance_density=float(sent)),
    )
    exact = compress in ("none", "fp16")  # else each shard's count of trainable entries rounds on its own
    assert traffic.update_bytes == pytest.approx(len(body), abs=0 if exact else 8 * 3 * 2)
    assert (traffic.residual_bytes, traffic.table_reads) == (
        0 if compress == "none" else 2 * plan_of.size,
        int(compress.startswith("significance")),
    )


def test_the_plan_follows_the_update_rule_and_compression() -> None:
    base = workload(compute_per_sample_s=0.01)  # rounds within the Worker's timeout: none handed on
    gradient = predict(base)
    averaged = predict(base.at(training=TrainingSpec(algorithm="average", local_steps=4)))
    fedopt = predict(base.at(training=TrainingSpec(algorithm="average", local_steps=4, server="optimizer")))
    topk = predict(base.at(training=TrainingSpec(compress="topk:0.01")))
    compute = {
        name: float(re.search(r"samples ([\d.]+) s", stage.detail)[1])
        for name, plan in (("gradient", gradient), ("average", averaged))
        for stage in plan.stages
        if stage.name == "Worker"
    }
    assert compute["average"] == pytest.approx(4 * compute["gradient"], rel=0.01)
    assert (averaged.state_slots, fedopt.state_slots, gradient.state_slots) == (0, 2, 2)  # FedAvg: SGD at rate 1
    moved = {
        name: sum(f.bytes_read_total + f.bytes_written_total for f in plan.functions)
        for name, plan in (("gradient", gradient), ("topk", topk))
    }
    assert moved["topk"] < moved["gradient"]  # the update and its bfloat16 residual, against a dense update
    W = gradient.workload.workers
    more = {op: topk.requests_per_iteration[op] - count for op, count in gradient.requests_per_iteration.items()}
    # the residuals (a multipart upload of 7 parts each); the updates in one PUT each, not a multipart upload of 13
    assert {op: n for op, n in more.items() if n} == {
        "s3:GetObject": W,
        "s3:PutObject": W,
        "s3:UploadPart": W * (7 - 13),
    }
    stale = predict(base.at(training=TrainingSpec(staleness=3)))
    assert stale.requests_per_iteration["dynamodb:Query"] == 3


def test_the_plan_answers_first_and_warns_about_the_configuration(capsys: pytest.CaptureFixture) -> None:
    argv = [
        "--params",
        "38282",
        "--compute-per-sample",
        "6e-4",
        "--workers",
        "64",
        "--epochs",
        "10",
        "--samples",
        "50000",
    ]
    out = plan_json(capsys, *argv)
    verdict = out["verdict"]
    assert next(iter(out)) == "verdict"
    assert (verdict["epoch_dollars"], verdict["run_dollars"]) == (out["dollars"]["epoch"], out["dollars"]["run"])
    assert (verdict["epoch_s"], verdict["run_s"]) == (out["epoch_s"], out["run_s"])
    assert "zip package" not in verdict["binds"] and "container image" not in verdict["binds"]
    slowest = max(out["stages"], key=lambda s: s["seconds"])["name"]
    assert verdict["binds"].startswith(f"{slowest} takes")
    few, latency = verdict["warnings"]
    assert few.startswith("64 workers × batch 128 leave 2 samples per worker") and "8 workers would take" in few
    hops = sum(s["seconds"] for s in out["stages"] if s["function"] is None)
    assert latency.startswith(f"latency-bound: {hops / out['iteration_s']:.0%} of the iteration")
    for advice in verdict["recommendations"]:
        assert advice.endswith(("already is", "better on both")) or re.search(
            r"\d\.?\d*× (faster for \d\.?\d*× the dollars|cheaper for \d\.?\d*× the time)$", advice
        ), advice

    assert main(["plan", *argv]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "per epoch" in first and "per run (3,910 iterations)" in first


def test_a_recommendation_that_is_no_faster_and_dearer_is_not_made() -> None:
    work = workload(params=1_000_000, workers=64, reducers=4)
    plan = predict(work)
    recommendation = recommend(work, Parameters(), Quotas(), PRICES)
    verdict = verdict_of(plan, recommendation, Parameters(), Quotas(), PRICES)
    for label, choice in (("fastest", recommendation.fastest), ("cheapest", recommendation.cheapest)):
        assert choice is not None
        said = [advice for advice in verdict.recommendations if advice.startswith(label)]
        time, money = choice.iteration_s / plan.iteration_s, choice.iteration_dollars / plan.iteration_dollars
        if time >= 0.99 and money >= 0.99:
            assert said == [f"{label}: the asked configuration already is"]
        elif said:
            assert f"--reducers {choice.reducers}" in said[0] or choice.reducers == work.reducers


def test_compare_vm_prices_the_same_epoch_on_one_machine(capsys: pytest.CaptureFixture) -> None:
    argv = [
        "--params",
        "1000000",
        "--compute-per-sample",
        "1e-3",
        "--workers",
        "16",
        "--batch",
        "1024",
        "--epochs",
        "2",
        "--samples",
        "100000",
    ]
    out = plan_json(capsys, *argv, "--compare-vm", "500:3.06:p3.2xlarge")
    vm = out["compare_vm"]
    assert (vm["samples"], vm["seconds"]) == (100_000, pytest.approx(200.0))  # an epoch at 500 samples/s
    assert vm["dollars"] == pytest.approx(200 / 3600 * 3.06)
    assert (vm["lambda_seconds"], vm["lambda_dollars"]) == (out["epoch_s"], out["dollars"]["epoch"])
    assert out["verdict"]["compared"] == vm["sentence"]
    assert vm["sentence"].startswith("the run on one p3.2xlarge (500 samples/s, $3.06/h; given (--compare-vm))")
    assert f"(an epoch: {out['epoch_s'] / 200:.2g}× the one machine's time" in vm["sentence"]
    # the whole run: CPU workers' is the plan's; the machine's its start-up and its samples (no sample bytes: no data)
    run = vm["run"]
    assert (run["lambda_seconds"], run["lambda_dollars"], run["lambda_extras"]) == (
        out["run_s"],
        out["dollars"]["run"],
        {},
    )
    assert run["seconds"] == pytest.approx(Parameters().vm_start_s + out["workload"]["iterations"] * 1024 / 500)
    assert f"{run['lambda_seconds'] / run['seconds']:.2g}× its time" in vm["sentence"] and vm["machines"] is None
    with pytest.raises(SystemExit) as exit_:
        main(["plan", *argv, "--compare-vm", "fast:3"])
    assert exit_.value.code == 2 and "SAMPLES_PER_S:DOLLARS_PER_HOUR" in capsys.readouterr().err


def test_a_global_batch_past_the_samples_or_reducers_past_the_weights_are_refused_with_what_to_give(
    capsys: pytest.CaptureFixture,
) -> None:
    assert main(["plan", "--params", "1000", "--samples", "100", "--iterations", "2"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("global batch 128 is larger than the 100 training samples: give --batch 100 or less")
    )
    assert main(["plan", "--params", "10", "--samples", "1000", "--reducers", "12", "--iterations", "2"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "12 reducers but the model has only 10 weights: 2 reducers would own no shard; give --reducers 10 or fewer"
        )
    )
