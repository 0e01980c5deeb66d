"""The plan of a large create-only write: a multipart upload of parts sent at once, as ObjectStore stores it."""

from __future__ import annotations

import collections

import pytest

from slsml.accounting import prices
from slsml.aws.storage import MULTIPART_BYTES, PARALLEL_PARTS, PART_BYTES, ObjectStore, upload_parts
from slsml.cost import gpuworker
from slsml.cost import predict as costmodel
from slsml.cost.chain import creates
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.plan import Plan
from slsml.cost.workload import Workload
from slsml.spec import keys

from . import test_cost_gpu as cost_gpu

P = Parameters()
PRICES = prices.PriceTable()
RESNET = 25_600_000  # a 102 MB update: 13 parts
MULTIPART = ("s3:CreateMultipartUpload", "s3:UploadPart", "s3:CompleteMultipartUpload")


def workload(params: int = RESNET) -> Workload:
    """Two workers of a model of ``params`` and 32 reducers (a ResNet-50's shards of 9.6 MB: one PUT each)."""
    return cost_gpu.workload(workers=2, compute_per_sample_s=0.1, params=params, reducers=32)


def on_gpu(work: Workload) -> Workload:
    return work.at(accelerator=gpuworker.accelerator(24, work, P, PRICES, None, "calibration.json", ("g5.xlarge",)))


def predict(work: Workload) -> Plan:
    return costmodel.predict(work, P, Quotas(), PRICES)


def write_update_s(plan: Plan) -> float:
    worker = next(stage for stage in plan.stages if stage.name == "Worker")
    return float(worker.detail.split("write update ")[1].split(" s")[0])


@pytest.mark.parametrize("size", [1, MULTIPART_BYTES - 1, MULTIPART_BYTES, 2 * MULTIPART_BYTES + 1])
def test_the_plan_counts_the_requests_the_store_sends(store: ObjectStore, size: int) -> None:
    sent: collections.Counter[str] = collections.Counter()
    store.s3.meta.events.register("before-call.s3.*", lambda model, **_: sent.update([f"s3:{model.name}"]))
    store.create(keys.update("r", 1, 0, attempt=1), b"u" * size)
    assert dict(sent) == creates(1, size)


def test_a_gpu_workers_large_update_is_written_in_parts_over_as_many_connections() -> None:
    work = on_gpu(workload())
    plan = predict(work)
    update = next(f for f in plan.functions if f.function == "worker").bytes_written
    parts = upload_parts(update)
    assert parts == -(-update // PART_BYTES) > 1
    one_connection = P.s3_request_s + update / (gpuworker.S3_CONNECTION_MB_S * 1e6)
    at_once = min(parts, PARALLEL_PARTS)
    in_parts = 3 * P.s3_request_s + update / (gpuworker.s3_mb_s(work, at_once) * 1e6)  # start, the parts, completion
    assert write_update_s(plan) == pytest.approx(in_parts, abs=0.005) and in_parts < one_connection / 4
    requests = plan.requests_per_iteration
    assert [requests[operation] for operation in MULTIPART] == [2, 2 * parts, 2]
    assert requests["s3:PutObject"] == 1 + 32  # the manifest and the shards, each under MULTIPART_BYTES
    assert plan.minimum_requests_per_iteration["s3:UploadPart"] == 2 * parts
    assert all(PRICES.request_price(operation) == PRICES.s3_put for operation in MULTIPART)


def test_a_lambda_workers_parts_go_at_its_measured_rate_and_are_counted() -> None:
    plan = predict(workload())
    update = next(f for f in plan.functions if f.function == "worker").bytes_written
    parts = upload_parts(update)
    assert write_update_s(plan) == pytest.approx(3 * P.s3_request_s + update / (P.s3_write_mb_s * 1e6), abs=0.005)
    assert [plan.requests_per_iteration[operation] for operation in MULTIPART] == [2, 2 * parts, 2]


def test_a_small_models_updates_stay_one_put_each() -> None:
    plan = predict(workload(params=100_000))
    assert not plan.requests_per_iteration.keys() & set(MULTIPART)
    assert plan.requests_per_iteration["s3:PutObject"] == 2 + 32 + 1


@pytest.mark.parametrize("params", [RESNET, 100_000])
def test_the_put_rate_of_an_updates_prefix_counts_every_request_that_stores_it(params: int) -> None:
    plan = predict(workload(params=params))
    update = next(f for f in plan.functions if f.function == "worker").bytes_written
    (rate,) = [q for q in plan.quotas if q.name == "S3 PUT rate"]
    assert "a worker's update" in rate.detail
    assert rate.value == sum(creates(1, update).values())  # within a second: the Work batch is published at once
