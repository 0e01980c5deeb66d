"""A run's cloud in moto's in-process mock for the worker's unit tests: a bucket, the run table and the topics, a
dataset ``d``, a run registered on it, the worker's step on one slot, and the GETs a store sends."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import boto3
import numpy as np
import pytest
from botocore.awsrequest import AWSPreparedRequest
from moto import mock_aws

from slsml.aws import cache
from slsml.aws.storage import ObjectStore
from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.pipeline.services import Services
from slsml.spec import keys, wiring
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec, config_digest
from slsml.spec.messages import WorkDone, WorkMessage
from slsml.state import records


@contextmanager
def watching_gets(store: ObjectStore, seen: Callable[[str, str | None], None]) -> Iterator[None]:
    """While the block runs, ``seen(key, Range)`` for each GetObject request ``store``'s client sends (by its own
    call or by pre-signed URL), in the sending thread, before it is answered."""

    def sent(request: AWSPreparedRequest, **_: object) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(request.url).path).lstrip("/")
        seen(path.removeprefix(f"{store.bucket}/"), request.headers.get("Range"))

    events, event = store.s3.meta.events, "before-send.s3.GetObject"
    events.register(event, sent, unique_id="watching-gets")
    try:
        yield
    finally:
        events.unregister(event, unique_id="watching-gets")


@contextmanager
def gets_sent(store: ObjectStore) -> Iterator[list[tuple[str, str | None]]]:
    """The (key, Range) of every GetObject ``store``'s client sends in the block (``watching_gets``)."""
    gets: list[tuple[str, str | None]] = []
    with watching_gets(store, lambda key, byte_range: gets.append((key, byte_range))):
        yield gets


def signing_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """A KMS key in moto that seals runs' signing keys, in the environment as a deployment's functions find it."""
    arn = boto3.client("kms", region_name="us-east-1").create_key()["KeyMetadata"]["Arn"]
    monkeypatch.setenv(wiring.SIGNING_KEY_ENV, arn)
    return arn


@contextmanager
def moto_services(
    monkeypatch: pytest.MonkeyPatch, samples: int = 64, shard_mb: float | None = None
) -> Iterator[Services]:
    """A bucket, run table and topics in moto, holding dataset ``d``: ``samples`` seeded samples of 6 features and 3
    classes (its first 8 also the test split), in shards of ``shard_mb`` (None: the default)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(cache, "_warm", None)  # no trainer or dataset reader of another test's cloud
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket")
        boto3.client("dynamodb", region_name="us-east-1").create_table(**records.create_table_arguments("runs"))
        sns = boto3.client("sns", region_name="us-east-1")
        arns = {t.name: sns.create_topic(Name=t.name)["TopicArn"] for t in wiring.TOPICS}
        signing_key(monkeypatch)
        services = Services.from_names("bucket", "runs", arns)
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((samples, 6)).astype(np.float32), rng.integers(0, 3, samples)
        data.put_dataset(
            services.store, "d", x, y, x[:8], y[:8], **({} if shard_mb is None else {"shard_mb": shard_mb})
        )
        yield services


def register_run(services: Services, model_bytes: bytes, run_id: str, **options: object) -> RunConfig:
    """A registered run of 2 workers and 2 reducers on dataset ``d`` with the TrainingSpec ``options``, its model
    placed."""

    spec = TrainingSpec(
        **{
            "workers": 2,
            "reducers": 2,
            "global_batch": 16,
            "iterations": 5,
            "optimizer": OptimizerConfig(name="sgd", learning_rate=0.1),
            **options,
        }
    )
    config = launch.prepare_run(services, model_bytes, "d", spec, run_id)
    services.store.put_new(keys.model(run_id, 0), model_bytes)
    services.table.table.put_item(Item=records.run_item(run_id, "d", spec, time.time(), config_digest(config.stored())))
    return config


def place_initial(services: Services, run_id: str, iteration: int) -> None:
    """The weights entering iteration 0 placed as those entering ``iteration``: its shards, and its manifest."""
    from slsml.pipeline.steps.common import run_config, shard_etags
    from slsml.spec.messages import Manifest

    store, config = services.store, run_config(services, run_id)
    for shard in range(config.reducers):
        store.put_new(keys.shard(run_id, iteration, shard), store.get(keys.shard(run_id, 0, shard)))
    named = Manifest(iteration=iteration, shards=shard_etags(store, config, iteration) or []).model_dump_json().encode()
    key = keys.manifest(run_id, iteration)
    store.put_new(key, named, services.keys.sign_object(run_id, key, named))  # as the Merger stores it


def work(services: Services, run_id: str, iteration: int = 0, worker: int = 0, workers: int = 2) -> WorkDone | None:
    """Worker ``worker``'s step of ``iteration``; past iteration 0, from the model of iteration 0."""
    from slsml.pipeline.steps import worker as step

    if iteration:
        place_initial(services, run_id, iteration)
    return step.work(WorkMessage(run_id=run_id, iteration=iteration, worker=worker, workers=workers), services)
