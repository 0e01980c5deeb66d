"""A pipeline stage's function holds its own weights, not the model's (``slsml.pipeline.staged``): its warm model is
built from the run's archive's config alone (the archive read in chunks, its SHA-256 checked), its stage's layers'
weights alone given memory, and only their ranges of the shards are read."""

from __future__ import annotations

import base64

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


def test_a_stages_cold_start_takes_the_sha256_s3_keeps_of_the_archive_and_reads_its_config_alone(
    services: Services,
) -> None:
    """A run's source model is stored with the SHA-256 S3 keeps of it: a stage function's cold start checks that one
    against run.json's and reads only the ranges of the archive its config needs, not the whole archive."""
    import keras

    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(64, name="a"), keras.layers.Dense(8_000, name="b"), keras.layers.Dense(3, name="c")]
    model = keras.Sequential([keras.Input((6,)), *layers])  # 2 MB of weights
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    archive = modelio.save_model(model)
    config = cloud.register_run(services, archive, "staged", workers=1, pipeline_stages=3)
    kept = services.store.sha256(keys.source_model("staged"))
    assert kept is not None and base64.b64decode(kept).hex() == config.source_sha256
    read: list[int] = []
    services.store.s3.meta.events.register(
        "after-call.s3.GetObject", lambda parsed, **_: read.append(int(parsed["ContentLength"]))
    )
    trainer = warm.stage_trainer_for(services.store, config, 2)
    assert [v.path for v in trainer.model.weights if modelio.held(v)] == ["c/kernel", "c/bias"]
    assert 0 < sum(read) < len(archive) / 10, (read, len(archive))


def test_a_stages_archive_of_other_bytes_than_run_json_names_is_refused(services: Services, layered: bytes) -> None:
    import keras

    config = cloud.register_run(services, layered, "staged", workers=1, pipeline_stages=3)
    other = keras.Sequential([keras.Input((6,)), *(keras.layers.Dense(n, name=f"d{n}") for n in SIZES)])
    s3 = boto3.client("s3", region_name="us-east-1")  # behind the pipeline's back
    s3.put_object(Bucket="bucket", Key=keys.source_model("staged"), Body=modelio.save_model(other))
    with pytest.raises(RunFailed, match=r"source.keras is not the model run.json names \(its SHA-256\)"):
        warm.stage_trainer_for(services.store, config, 2)


def test_the_update_of_a_round_in_stages_is_each_stages_part_as_stored_named_by_an_index(services: Services) -> None:
    """Each stage stores its part of the update as it is (a large one in parts), a later one with a signed record
    naming it by its ETag; the update's index says which runs of the flat vector each part holds: each shard's ranges
    of the parts, joined, are the shard's entries of the model's flat gradient, read no more than the shard's bytes."""
    import keras

    from slsml.aws.storage import MULTIPART_BYTES
    from slsml.spec.messages import WorkMessage
    from slsml.training import updates

    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(64, name="a"), keras.layers.Dense(80_000, name="b"), keras.layers.Dense(3, name="c")]
    model = keras.Sequential([keras.Input((6,)), *layers])  # (the dataset's 6 features)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    config = cloud.register_run(services, modelio.save_model(model), "indexed", workers=1, pipeline_stages=3)
    assert config.stage_blocks == (1, 1, 1) and config.reducers == 2
    rng = np.random.default_rng(0)
    gradients = {id(v): rng.normal(size=v.shape).astype(np.float32) for v in model.weights}
    parts = staged.stage_models(model, config.stage_blocks)

    def values(stage: int) -> list[np.ndarray]:
        own = staged.own_weights(model, config.stage_blocks, stage)
        return staged.part_values(parts[stage], own, [gradients[id(v)] for v in parts[stage].trainable_weights], [])

    hand = staged.Hand(services, WorkMessage(run_id="indexed", iteration=0, worker=0, workers=1), config)
    for stage in (1, 2):
        hand.put_part(stage, values(stage), 0.5 * stage, None)
    taken = [hand.take_part(stage) for stage in (1, 2)]
    assert taken[0].size == 4 * (64 * 80_000 + 80_000) > MULTIPART_BYTES and taken[0].etag.endswith('-3"')  # in parts
    assert (taken[1].loss, taken[1].finite) == (1.0, True)
    index = updates.StagedIndex(
        tuple(staged.stage_runs(model, config.stage_blocks)), (hand.put_values(0, values(0)), *(t.etag for t in taken))
    )
    assert [stage for stage, _, _ in index.runs] == [0, 1, 2]
    index = updates.StagedIndex.decode(index.encode(), config.plan)
    expected = config.plan.flatten([gradients[id(v)] for v in model.weights])
    for shard in range(config.reducers):
        layout = config.plan.shard(shard)
        ranges = index.ranges(config.plan, shard)
        assert sum(stop - start for _, start, stop in ranges) == 4 * layout.size
        read = b"".join(
            services.store.get(keys.stage_values("indexed", 0, 0, 0, stage), (start, stop - 1))
            for stage, start, stop in ranges
        )
        assert read == expected[layout.start : layout.stop].tobytes()
    # an index whose runs do not cover the model, or overlap, is no index
    for runs in (index.runs[:-1], ((0, 0, 10), (1, 5, config.plan.size - 5))):
        with pytest.raises(updates.UpdateFormatError, match="index of an update in stages"):
            updates.StagedIndex.decode(updates.StagedIndex(runs, index.etags).encode(), config.plan)
