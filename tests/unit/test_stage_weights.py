"""A pipeline stage's function holds its own weights, not the model's (``slsml.pipeline.staged``): its warm model is
built from the run's archive's config alone (the archive read in chunks, its SHA-256 checked), its stage's layers'
weights alone given memory, and only their ranges of the shards are read."""

from __future__ import annotations

import boto3
import numpy as np
import pytest

from slsml.pipeline import staged
from slsml.pipeline.services import Services
from slsml.pipeline.steps import warm
from slsml.pipeline.steps.common import load_weights
from slsml.spec import keys
from slsml.spec.errors import RunFailed
from slsml.training import modelio

from . import cloud

SIZES = (64, 32, 3)  # three Dense layers on 6 features: 448, 2,080 and 99 weights


@pytest.fixture
def services(monkeypatch: pytest.MonkeyPatch):
    with cloud.moto_services(monkeypatch) as services:
        yield services


@pytest.fixture(scope="module")
def layered() -> bytes:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), *(keras.layers.Dense(n, name=f"d{n}") for n in SIZES)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return modelio.save_model(model)


def test_a_later_stage_holds_its_own_weights_alone_read_by_range_from_the_shards(
    services: Services, layered: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = cloud.register_run(services, layered, "staged", workers=1, pipeline_stages=3)
    assert config.stage_blocks == (1, 1, 1)
    assert config.plan.bounds[1] not in (448, 448 + 2080)  # stage 1's weights lie across both shards
    monkeypatch.setattr(warm, "ARCHIVE_CHUNK", 4096)  # the archive read in several chunks
    trainer = warm.stage_trainer_for(services.store, config, 1)
    assert [v.path for v in trainer.model.weights if modelio.held(v)] == ["d32/kernel", "d32/bias"]
    assert warm.trainer_bytes(trainer) == int(warm.TRAINER_OVERHEAD_FACTOR * 4 * 2080) + warm.TRAINER_FIXED_BYTES

    own = staged.own_weights(trainer.model, config.stage_blocks, 1)
    assert staged.spans(own) == [(448, 448 + 2080)]
    read = load_weights(services.store, config, 0, None, staged.spans(own))
    staged.set_own(own, read)
    source = modelio.load_model(layered).get_layer("d32")
    for variable, expected in zip(trainer.model.get_layer("d32").weights, source.get_weights(), strict=True):
        np.testing.assert_array_equal(variable.numpy(), expected)
    assert warm.stage_trainer_for(services.store, config, 1) is trainer  # warm: nothing read again


def test_a_stages_archive_of_other_bytes_than_run_json_names_is_refused(services: Services, layered: bytes) -> None:
    import keras

    config = cloud.register_run(services, layered, "staged", workers=1, pipeline_stages=3)
    other = keras.Sequential([keras.Input((6,)), *(keras.layers.Dense(n, name=f"d{n}") for n in SIZES)])
    s3 = boto3.client("s3", region_name="us-east-1")  # behind the pipeline's back
    s3.put_object(Bucket="bucket", Key=keys.source_model("staged"), Body=modelio.save_model(other))
    with pytest.raises(RunFailed, match=r"source.keras is not the model run.json names \(its SHA-256\)"):
        warm.stage_trainer_for(services.store, config, 2)
