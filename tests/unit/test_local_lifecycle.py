"""The local cloud's lifecycle: the rules declared once for the deployed bucket, applied at a given time as S3
applies them (days after creation, rounded up to midnight UTC), and the table's TTL as DynamoDB applies it."""

from __future__ import annotations

import datetime as dt
import time

import boto3
import pytest
from moto import mock_aws
from pydantic import ValidationError

from slsml.aws.storage import ObjectStore
from slsml.local import lifecycle
from slsml.pipeline.services import Services
from slsml.spec import deployment, keys
from slsml.spec.config import TrainingSpec
from slsml.state import records
from slsml.state.runtable import RunTable


@pytest.fixture
def services():
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bucket")
        rules = deployment.lifecycle_configuration(deployment.lifecycle_rules())
        s3.put_bucket_lifecycle_configuration(Bucket="bucket", LifecycleConfiguration=rules)
        dynamodb = boto3.resource("dynamodb", region_name="us-east-1")
        table = dynamodb.create_table(**records.create_table_arguments("table"))
        dynamodb.meta.client.update_time_to_live(
            TableName="table", TimeToLiveSpecification={"Enabled": True, "AttributeName": records.TTL_ATTRIBUTE}
        )
        yield Services(
            store=ObjectStore(s3, "bucket"),
            table=RunTable(table),
            bus=None,
            orchestrator=None,
            deadlines=None,
            keys=None,
        )


def test_an_object_expires_at_the_midnight_after_its_days() -> None:
    created = dt.datetime(2014, 1, 15, 10, 30, tzinfo=dt.UTC)  # S3's documented example: 3 days → Jan 19, 00:00
    assert lifecycle.expires_at(created, 3) == dt.datetime(2014, 1, 19, tzinfo=dt.UTC).timestamp()
    midnight = dt.datetime(2014, 1, 15, tzinfo=dt.UTC)
    assert lifecycle.expires_at(midnight, 3) == dt.datetime(2014, 1, 18, tzinfo=dt.UTC).timestamp()


def test_tagged_transient_scratch_expires_and_nothing_else(services: Services) -> None:
    store = services.store
    transient = [keys.update("r", 0, 0), keys.mean("r", 0, 1), keys.evaluation("r", 0, 0, "test")]
    kept = [
        keys.manifest("r", 1),
        keys.shard("r", 1, 0),
        keys.residual("r", 0, 0),
        keys.local_state("r", 0, 0),
        keys.model("r", 1),
        keys.run_config("r"),
        keys.dataset_shard("d", "train", 0),
    ]
    for key in transient + kept:
        store.put_new(key, b"x")
    now, days = time.time(), deployment.SCRATCH_EXPIRY_DAYS
    assert lifecycle.expire(services, now + (days - 1) * deployment.DAY_S).objects == []  # not yet
    assert sorted(lifecycle.expire(services, now + (days + 1) * deployment.DAY_S).objects) == sorted(transient)
    assert sorted(store.list_keys("")) == sorted(kept)


def test_items_past_their_ttl_are_deleted_and_items_without_one_are_kept(services: Services) -> None:
    table, now = services.table.table, time.time()
    table.put_item(Item={"pk": "IDEMPOTENCY#worker", "sk": "a", records.TTL_ATTRIBUTE: int(now) + 10})
    table.put_item(Item={"pk": "IDEMPOTENCY#worker", "sk": "b", records.TTL_ATTRIBUTE: int(now) + 1000})
    table.put_item(Item={"pk": "RUN#r", "sk": "ITER#000000"})
    assert lifecycle.expire(services, now + 100).items == 1
    assert sorted(item["sk"] for item in table.scan()["Items"]) == ["ITER#000000", "b"]


def test_a_run_reads_its_updates_for_less_than_the_scratch_expiry() -> None:
    TrainingSpec(staleness=100, heartbeat_s=900)  # 101 × 15 min: about a day
    limit = deployment.TRANSIENT_USE_MAX_S
    TrainingSpec(staleness=1, heartbeat_s=limit // 2)
    with pytest.raises(ValidationError, match=r"\(staleness \+ 1\) × heartbeat \(2 × 86401 s\) exceeds the 172800 s"):
        TrainingSpec(staleness=1, heartbeat_s=limit // 2 + 1)
