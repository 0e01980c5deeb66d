"""The warm cache: one LRU cache bounded by bytes, its bound from the function's memory, and a warm
process serving run after run of different models within it."""

from __future__ import annotations

from types import SimpleNamespace

import boto3
import keras
import numpy as np
import pytest
from moto import mock_aws

from slsml.aws import cache
from slsml.aws.storage import ObjectStore
from slsml.data import datasets as data
from slsml.pipeline.steps.common import run_config
from slsml.pipeline.steps.warm import reader_for, trainer_bytes, trainer_for
from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec, config_digest
from slsml.spec.shardplan import ShardPlan
from slsml.state import records
from slsml.state.runtable import RunTable
from slsml.training import modelio

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")

MB = 2**20


def test_least_recently_used_entries_go_first_once_over_the_bound() -> None:
    lru = cache.LRUCache(limit=10)
    lru.put("a", "A", 4)
    lru.put("b", "B", 4)
    assert lru.get("a") == "A"  # now "b" is the least recently used
    lru.put("c", "C", 4)
    assert (lru.get("b"), lru.get("a"), lru.get("c"), lru.nbytes) == (None, "A", "C", 8)
    assert lru.put("huge", "H", 11) == "H" and lru.get("huge") is None  # bigger than the bound: not kept
    lru.put("a", "A2", 6)  # a new value replaces the old one and its size
    assert (lru.get("a"), lru.get("c"), lru.nbytes) == ("A2", "C", 10)
    unbounded = cache.LRUCache(limit=None)
    for i in range(100):
        unbounded.put(i, i, MB)
    assert len(unbounded) == 100


def test_the_bound_is_a_share_of_the_functions_memory_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cache.BOUND_ENV, raising=False)
    monkeypatch.setenv(cache.MEMORY_ENV, "3008")
    assert cache.limit_bytes() == int(cache.MEMORY_SHARE * 3008 * MB)
    monkeypatch.setenv(cache.BOUND_ENV, "64")
    assert cache.limit_bytes() == 64 * MB


def test_an_invocation_that_sets_another_bound_shrinks_the_warm_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "_warm", None)
    monkeypatch.setenv(cache.BOUND_ENV, "4")
    warm = cache.warm()
    for i in range(4):
        warm.put(i, i, MB)
    monkeypatch.setenv(cache.BOUND_ENV, "2.5")
    assert cache.warm() is warm and warm.limit == int(2.5 * MB)
    assert (warm.nbytes, [warm.get(i) for i in range(4)]) == (2 * MB, [None, None, 2, 3])
    monkeypatch.setenv(cache.BOUND_ENV, "8")
    assert cache.warm().limit == 8 * MB and len(warm) == 2


def _model(i: int) -> keras.Model:
    """Model i of 20, all different: widths 16 to 320, every other one compiled with Adam (its slots count)."""
    keras.utils.set_random_seed(i)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16 * (i + 1), activation="relu"),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    if i % 2:
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def test_a_warm_process_serving_20_runs_stays_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    limit = 12 * MB
    monkeypatch.setenv(cache.BOUND_ENV, str(limit / MB))
    monkeypatch.setattr(cache, "_warm", None)  # a fresh process's cache
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((200, 8)).astype(np.float32), rng.integers(0, 4, 200)
    loss = modelio.loss_config(_model(0), "sparse_categorical_crossentropy")
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket="bucket")
        store = ObjectStore(boto3.client("s3"), "bucket")
        data.put_dataset(store, "d", x[:160], y[:160], x[160:], y[160:], shard_mb=64 * 40 / MB)  # 64 records
        boto3.client("dynamodb").create_table(**records.create_table_arguments("runs"))
        table = RunTable(boto3.resource("dynamodb").Table("runs"))
        services = SimpleNamespace(store=store, table=table)  # what reading a run's config takes
        runs = [f"run-{i}" for i in range(20)]
        sizes = []
        for i, run_id in enumerate(runs):
            blob = modelio.save_model(_model(i))
            store.put_new(keys.source_model(run_id), blob)
            config = RunConfig(
                run_id=run_id,
                dataset="d",
                training=TrainingSpec(workers=1, reducers=1, global_batch=8),
                optimizer=OptimizerConfig(name="adam"),
                loss=loss,
                classification=True,
                plan=ShardPlan.build(modelio.variable_specs(modelio.load_model(blob)), 1),
            )
            store.put_new(keys.run_config(run_id), config.stored())
            digest = config_digest(config.stored())
            table.table.put_item(Item=records.run_item(run_id, "d", config.training, 0.0, digest))

            config = run_config(services, run_id)  # what a worker does with the run's work
            trainer, fresh = trainer_for(store, config, 0)
            assert fresh
            trainer.compute_update(*reader_for(store, config).take("train", np.arange(i, i + 8)))
            sizes.append(trainer_bytes(trainer))
            warm = cache.warm()
            assert warm.limit == limit and warm.nbytes <= limit, (run_id, warm.nbytes)

        assert sum(sizes) > 2 * limit  # without eviction the cache would hold them all
        assert trainer_for(store, run_config(services, runs[-1]), 0) == (trainer, False)  # the latest run hits
        assert trainer_for(store, run_config(services, runs[0]), 0)[1]  # the first run was evicted: loaded again
        assert cache.warm().nbytes <= limit


def _alike(seed: int, activation: str = "relu") -> keras.Model:
    """A model of one architecture whatever the seed: its weights differ, and so do its names (Keras numbers
    those of each model a process builds)."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation=activation), keras.layers.Dense(4, activation="softmax")]
    )


def test_a_workers_warm_model_serves_the_runs_of_one_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "_warm", None)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 8)).astype(np.float32), rng.integers(0, 4, 8)
    models = {"first": _alike(1), "alike": _alike(2), "other-loss": _alike(3), "tanh": _alike(4, "tanh")}
    assert models["first"].layers[0].name != models["alike"].layers[0].name
    losses = {name: "sparse_categorical_crossentropy" for name in models} | {"other-loss": "categorical_hinge"}
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket="bucket")
        store = ObjectStore(boto3.client("s3"), "bucket")
        configs = {}
        for name in models:  # as a run is prepared: from the model the user's bytes load
            blob = modelio.save_model(models[name])
            store.put_new(keys.source_model(name), blob)
            models[name] = model = modelio.load_model(blob)
            configs[name] = RunConfig(
                run_id=name,
                dataset="d",
                training=TrainingSpec(workers=1, reducers=1, global_batch=8),
                optimizer=OptimizerConfig(name="sgd"),
                loss=modelio.loss_config(model, losses[name]),
                classification=True,
                plan=ShardPlan.build(modelio.variable_specs(model), 1),
                architecture=modelio.architecture(model),
            )
        first, fresh = trainer_for(store, configs["first"], 0, shared=True)
        assert fresh
        first.compute_update(x, y)

        # a run of the same architecture: the same warm model, with that run's weights set as on any warm start
        shared, fresh = trainer_for(store, configs["alike"], 0, shared=True)
        assert (shared is first, fresh) == (True, False)
        modelio.set_flat(shared.model, configs["alike"].plan, modelio.get_flat(models["alike"], configs["alike"].plan))
        got = shared.compute_update(x, y)
        alone = modelio.Trainer(models["alike"], configs["alike"].plan, configs["alike"].loss)
        expected = alone.compute_update(x, y)
        assert np.array_equal(got.vector, expected.vector) and got.loss == expected.loss

        # another loss, another activation, or a Merger's model (it saves the run's own archive): a model of its own
        for name in ("other-loss", "tanh"):
            assert trainer_for(store, configs[name], 0, shared=True)[1], name
        own, fresh = trainer_for(store, configs["alike"], 0)
        assert own is not first and fresh
