"""Micro-batches in a run: a worker whose share is cut into micro-batches sends the update of its whole share, and
says so in its usage line; a run is refused at start, with nothing stored, where not one sample (or not the
``--micro-batch`` it asks for) fits the deployment's worker."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from slsml.accounting import usage
from slsml.pipeline.services import Services
from slsml.rounds import sizing
from slsml.rounds.stages import Stage, held
from slsml.spec import keys
from slsml.spec.errors import BadInputError
from slsml.training import updates

from . import cloud


@pytest.fixture
def services(monkeypatch: pytest.MonkeyPatch):
    with cloud.moto_services(monkeypatch) as services:
        yield services


def test_a_worker_in_micro_batches_sends_its_whole_shares_update(
    services: Services,
    model_bytes: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    streamed: list[usage.Streamed] = []
    monkeypatch.setattr(usage, "streamed", streamed.append)
    sent = {}
    for run_id, micro_batch in (("whole", None), ("micro", 3)):  # a share of 8: micro-batches of 3, 3, 2
        config = cloud.register_run(services, model_bytes, run_id, micro_batch=micro_batch)
        cloud.work(services, run_id, worker=1)
        body = services.store.get(keys.update(run_id, 0, 1))
        sent[run_id] = updates.decode(body, "gradient", config.plan, config.training.compression)[0]
    assert [(s.micro_batch, s.micro_batches) for s in streamed] == [(streamed[0].micro_batch, 1), (3, 3)]
    np.testing.assert_allclose(sent["micro"], sent["whole"], rtol=1e-5, atol=1e-7)
    assert not np.array_equal(sent["micro"], np.zeros_like(sent["micro"]))


def test_a_run_whose_one_sample_does_not_fit_the_worker_is_refused_with_nothing_stored(
    services: Services,
    model_bytes: bytes,
) -> None:
    small = replace(services, limits=services.limits.with_worker_memory(1024))
    with pytest.raises(BadInputError) as refused:
        cloud.register_run(small, model_bytes, "small")
    message = str(refused.value)
    assert "one sample's training step needs ~" in message and "the worker has 1,024 MB" in message
    assert "\n" not in message and "functions.worker.memory_mb" in message
    assert not services.store.exists(keys.run_config("small"))


def test_a_micro_batch_past_the_workers_memory_is_refused_naming_the_one_that_fits(
    services: Services,
    model_bytes: bytes,
) -> None:
    config = cloud.register_run(services, model_bytes, "fits")
    memory = sizing.of_run(config, 3008, 1504, 0)
    fitting = memory.micro_batch()
    assert 0 < fitting < 2**31  # the model's samples are counted: they bound it
    with pytest.raises(BadInputError, match=f"--micro-batch {fitting + 1}: .* {fitting:,} fit"):
        cloud.register_run(services, model_bytes, "past", micro_batch=fitting + 1)
    assert not services.store.exists(keys.run_config("past"))
    assert cloud.register_run(services, model_bytes, "at", micro_batch=fitting).training.micro_batch == fitting


def _wide_model() -> bytes:
    """A model of few weights whose layers' outputs are wide: one sample's step takes ~44 MB."""
    import keras

    from slsml.training import modelio

    keras.utils.set_random_seed(0)
    wide = [keras.layers.Activation("relu") for _ in range(40)]
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2**18), *wide, keras.layers.Dense(3, "softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return modelio.save_model(model)


def test_a_model_no_worker_holds_a_sample_of_is_split_into_stages_that_each_fit(services: Services) -> None:
    from slsml.cost.stages import blocks_of
    from slsml.training import modelio

    model_bytes, memory_mb = _wide_model(), 1660
    small = replace(services, limits=services.limits.with_worker_memory(memory_mb))
    with pytest.raises(BadInputError, match=f"one sample's training step needs ~.* the worker has {memory_mb:,} MB"):
        cloud.register_run(small, model_bytes, "whole")
    config = cloud.register_run(small, model_bytes, "staged", pipeline_stages=3)
    blocks = blocks_of(modelio.load_model(model_bytes))
    assert config.stage_blocks is not None and len(config.stage_blocks) == 3
    assert sum(config.stage_blocks) == len(blocks) and min(config.stage_blocks) >= 1
    memory = sizing.of_run(config, memory_mb, memory_mb / 2, 0)
    assert memory.micro_batch() == 0  # the whole model's step: not one sample
    first = 0
    for count in config.stage_blocks:  # each stage's step fits the run's micro-batch
        stage = Stage(tuple(blocks[first : first + count]))
        first += count
        assert config.training.micro_batch is not None
        assert 1 <= config.training.micro_batch <= held(stage, memory).micro_batch()


def test_stages_refuse_what_they_cannot_run_with_nothing_stored(services: Services, model_bytes: bytes) -> None:
    with pytest.raises(BadInputError, match=r"^--pipeline-stages 2: stages train .* not with --compress topk"):
        cloud.register_run(services, model_bytes, "lossy", pipeline_stages=2, compress="topk:0.5")
    bounded = replace(services, limits=services.limits.with_worker_concurrency(3))
    with pytest.raises(BadInputError, match=r"2 workers of 2 stages are 4 Worker invocations at once, .* runs 3 "):
        cloud.register_run(bounded, model_bytes, "crowded", pipeline_stages=2)
    assert cloud.register_run(bounded, model_bytes, "fits", workers=1, pipeline_stages=2).stage_blocks == (1, 1)
    assert not services.store.exists(keys.run_config("lossy")) and not services.store.exists(keys.run_config("crowded"))
