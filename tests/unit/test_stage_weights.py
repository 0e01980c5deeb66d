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


def test_stage_0_streams_the_update_from_the_stages_parts_and_takes_no_part_replaced_after_it_was_named(
    services: Services,
) -> None:
    """Each later stage stores its part of the update as it is (a large one in parts) and a signed record naming it
    by its ETag; stage 0 streams the update from its own part and theirs, reading theirs a PART_BYTES range at a time:
    the bytes are the model's flat gradient, and values replaced after their record was stored are not taken."""
    import keras

    from slsml.aws.storage import MULTIPART_BYTES, PART_BYTES
    from slsml.spec.messages import WorkMessage

    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(64, name="a"), keras.layers.Dense(80_000, name="b"), keras.layers.Dense(3, name="c")]
    model = keras.Sequential([keras.Input((6,)), *layers])  # (the dataset's 6 features)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    config = cloud.register_run(services, modelio.save_model(model), "streamed", workers=1, pipeline_stages=3)
    assert config.stage_blocks == (1, 1, 1)
    rng = np.random.default_rng(0)
    gradients = {id(v): rng.normal(size=v.shape).astype(np.float32) for v in model.weights}
    parts = staged.stage_models(model, config.stage_blocks)

    def values(stage: int) -> list[np.ndarray]:
        own = staged.own_weights(model, config.stage_blocks, stage)
        return staged.part_values(parts[stage], own, [gradients[id(v)] for v in parts[stage].trainable_weights], [])

    hand = staged.Hand(services, WorkMessage(run_id="streamed", iteration=0, worker=0, workers=1), config)
    for stage in (1, 2):
        hand.put_part(stage, values(stage), 0.5 * stage, None)
    taken = {stage: hand.take_part(stage) for stage in (1, 2)}
    assert taken[1][0].size == 4 * (64 * 80_000 + 80_000) > MULTIPART_BYTES  # stored in parts
    assert (taken[2][0].loss, taken[2][0].finite) == (1.0, True)
    stored = {stage: read for stage, (_, read) in taken.items()}
    ranges: list[str] = []
    services.store.s3.meta.events.register(
        "before-parameter-build.s3.GetObject", lambda params, **_: ranges.append(params["Range"])
    )
    streamed = staged.assembled_pieces(model, config.stage_blocks, stored, values(0))
    expected = config.plan.flatten([gradients[id(v)] for v in model.weights])
    assert b"".join(bytes(piece) for piece in streamed) == expected.tobytes()
    spans = [tuple(map(int, r.removeprefix("bytes=").split("-"))) for r in ranges]
    assert max(stop + 1 - start for start, stop in spans) == PART_BYTES
    assert sum(stop + 1 - start for start, stop in spans) == taken[1][0].size + taken[2][0].size

    key = keys.stage_values("streamed", 0, 0, 0, 2)
    s3 = boto3.client("s3", region_name="us-east-1")  # behind the pipeline's back
    s3.put_object(Bucket="bucket", Key=key, Body=np.zeros(taken[2][0].size // 4, np.float32).tobytes())
    with pytest.raises(RunFailed, match=f"{key} was replaced while it was read"):
        b"".join(staged.assembled_pieces(model, config.stage_blocks, stored, values(0)))
