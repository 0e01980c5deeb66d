"""Error feedback: over iterations, what a worker slot sent plus its stored residual is the sum of its uncompressed
updates; the worker reads the slot's residual of the iteration before and stores the next, create-only, and
refuses a residual that does not fit the model, storing nothing."""

from __future__ import annotations

import numpy as np
import pytest

from slsml.pipeline.services import Services
from slsml.spec import keys
from slsml.spec.errors import RunFailed
from slsml.spec.shardplan import ShardPlan, VariableSpec
from slsml.training import feedback, updates
from slsml.training.updates import Compression

from . import cloud

PLAN = ShardPlan.build(
    [
        VariableSpec(name="kernel", shape=(40, 10), trainable=True),
        VariableSpec(name="mean", shape=(10,), trainable=False),
        VariableSpec(name="bias", shape=(10,), trainable=True),
    ],
    reducers=3,
)
TRAINABLE = PLAN.trainable_mask()
LOSSY = [Compression.parse(t) for t in ("fp16", "topk:0.05", "significance:0.3")]


def _updates(iterations: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-7, 0, PLAN.size)  # magnitudes float16 rounds, or loses below its subnormals
    return [(rng.standard_normal(PLAN.size) * scale).astype(np.float32) for _ in range(iterations)]


@pytest.mark.parametrize("compression", LOSSY, ids=str)
def test_what_was_sent_plus_the_residual_is_the_sum_of_the_updates(compression: Compression) -> None:
    weights = np.random.default_rng(1).standard_normal(PLAN.size).astype(np.float32)
    residual, sent_total, update_total = None, np.zeros(TRAINABLE.sum()), np.zeros(TRAINABLE.sum())
    rounding = np.zeros(TRAINABLE.sum())  # what storing each residual in bfloat16 may lose: 2⁻⁸ of each entry
    for number, update in enumerate(_updates(12)):
        compressed = feedback.compress(update, residual, PLAN, compression, 8, "gradient", weights)
        decoded, samples = updates.decode(compressed.update.body, "gradient", PLAN, compression)
        assert samples == 8 and np.array_equal(decoded, compressed.sent)
        assert np.array_equal(compressed.sent[~TRAINABLE], update[~TRAINABLE])  # values, sent whole
        assert not compressed.residual[~TRAINABLE].any()
        sent_total += compressed.sent[TRAINABLE]
        update_total += update[TRAINABLE]
        residual = feedback.decode_residual(feedback.encode_residual(compressed.residual), PLAN, "r")  # stored
        assert np.array_equal(residual, compressed.residual)  # rounded as stored: nothing more is lost
        rounding += 2.0**-8 * np.abs(residual[TRAINABLE])
        error = np.abs(sent_total + residual[TRAINABLE] - update_total) - rounding
        assert error.max() <= 1e-6 * np.abs(update_total).max(), f"iteration {number}: {error.max():.2e}"
    left = np.abs(residual[TRAINABLE]).max()
    assert left > 1e-4 * np.abs(update_total).max(), "compression must leave something out, or this tests nothing"


@pytest.mark.parametrize("compression", LOSSY, ids=str)
def test_without_the_residual_the_sums_drift(compression: Compression) -> None:
    """The same updates compressed alone: their sum misses what the residuals kept (the test above can fail)."""
    weights = np.random.default_rng(1).standard_normal(PLAN.size).astype(np.float32)
    alone = sum(
        feedback.compress(u, None, PLAN, compression, 8, "gradient", weights).sent[TRAINABLE] for u in _updates(12)
    )
    total = sum(u[TRAINABLE].astype(np.float64) for u in _updates(12))
    assert np.abs(alone - total).max() > 1e-4 * np.abs(total).max()


def test_a_large_residual_entry_is_sent_when_it_grows_large_enough() -> None:
    topk = Compression.parse("topk:0.01")
    update = np.full(PLAN.size, 1e-3, dtype=np.float32)
    residual = np.zeros(PLAN.size, dtype=np.float32)
    residual[7] = 5.0
    compressed = feedback.compress(update, residual, PLAN, topk, 8, "gradient")
    assert compressed.sent[7] == np.float32(5.001) and compressed.residual[7] == 0
    assert compressed.residual[8] == pytest.approx(1e-3, rel=2.0**-8)


def test_a_non_finite_update_keeps_the_residual_it_found() -> None:
    residual = np.linspace(-1, 1, PLAN.size, dtype=np.float32) * TRAINABLE
    update = _updates(1)[0]
    update[3] = np.nan
    compressed = feedback.compress(update, residual, PLAN, LOSSY[1], 8, "gradient")
    assert np.array_equal(compressed.residual, residual)
    assert not feedback.compress(update, None, PLAN, LOSSY[1], 8, "gradient").residual.any()


def test_a_residual_is_stored_in_half_a_dense_update_and_one_stored_in_float32_is_read() -> None:
    residual = np.linspace(-3, 3, PLAN.size, dtype=np.float32) * TRAINABLE
    stored = feedback.encode_residual(residual)
    assert len(stored) == feedback.residual_bytes(PLAN.size) == 2 * PLAN.size
    np.testing.assert_allclose(feedback.decode_residual(stored, PLAN, "r"), residual, rtol=2.0**-8, atol=0)
    before = residual.astype("<f4").tobytes()
    assert np.array_equal(feedback.decode_residual(before, PLAN, "r"), residual)


@pytest.mark.parametrize("change", [-4, 4, -1])
def test_a_residual_of_another_size_is_refused_by_name(change: int) -> None:
    body = feedback.encode_residual(np.zeros(PLAN.size, dtype=np.float32))
    body = body[:change] if change < 0 else body + b"\0" * change
    with pytest.raises(
        feedback.ResidualError,
        match=f"res.bin: a residual of {len(body)} bytes does not match the model's {PLAN.size} weights",
    ):
        feedback.decode_residual(body, PLAN, "res.bin")
    with pytest.raises(feedback.ResidualError, match="NaN"):
        feedback.decode_residual(np.full(PLAN.size, np.inf, dtype="<f4").tobytes(), PLAN, "res.bin")


# ---- the worker: reads the slot's residual, stores the next ------------------------------------------------


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    """A small Keras model with BatchNorm statistics (non-trainable weights)."""
    import keras

    from slsml.training import modelio

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(40),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return modelio.save_model(model)


def _update(services: Services, config, iteration: int, worker: int) -> np.ndarray:
    body = services.store.get(keys.update(config.run_id, iteration, worker))
    return updates.decode(body, "gradient", config.plan, config.training.compression)[0]


def test_the_worker_adds_its_slots_residual_and_stores_the_next(services: Services, model_bytes: bytes) -> None:
    plain = cloud.register_run(services, model_bytes, "plain", compress="none")
    for iteration in range(2):
        cloud.work(services, "plain", iteration, 0)
    assert not services.store.list_keys("runs/plain/iters/000000/residuals/")  # none without compression
    uncompressed = [_update(services, plain, i, 0) for i in range(2)]

    config = cloud.register_run(services, model_bytes, "topk", compress="topk:0.1")
    trainable = config.plan.trainable_mask()
    assert (~trainable).sum() == 80, "the model has BatchNorm statistics"
    cloud.work(services, "topk", 0, 0)
    residual_0 = feedback.decode_residual(services.store.get(keys.residual("topk", 0, 0)), config.plan, "r0")
    sent_0 = _update(services, config, 0, 0)
    kept = np.abs(sent_0 + residual_0 - uncompressed[0])
    assert (kept <= 2.0**-8 * np.abs(residual_0)).all()  # every entry is sent or kept, to bfloat16's rounding
    assert np.array_equal(sent_0[~trainable], uncompressed[0][~trainable]) and not residual_0[~trainable].any()
    assert (sent_0[trainable] != 0).sum() < 0.11 * trainable.sum()

    cloud.work(services, "topk", 1, 0)
    residual_1 = feedback.decode_residual(services.store.get(keys.residual("topk", 1, 0)), config.plan, "r1")
    sent_1 = _update(services, config, 1, 0)
    np.testing.assert_allclose(
        (sent_0 + sent_1 + residual_1)[trainable],
        (uncompressed[0] + uncompressed[1])[trainable],
        rtol=0,
        atol=1e-6 * np.abs(uncompressed[0]).max() + 2.0**-7 * np.abs(residual_1).max(),
    )
    dense = services.store.head(keys.update("plain", 0, 0))
    assert dense is not None
    plain_size = len(services.store.get(keys.update("plain", 0, 0)))
    assert len(services.store.get(keys.update("topk", 0, 0))) < plain_size / 3

    # a slot new at iteration 1 (a scale-out) has no residual: it starts from zeros, and stores one
    cloud.work(services, "topk", 1, 2, workers=3)
    assert services.store.exists(keys.residual("topk", 1, 2))


def test_a_residual_that_does_not_fit_the_model_fails_the_run_and_stores_nothing(
    services: Services, model_bytes: bytes
) -> None:
    config = cloud.register_run(services, model_bytes, "bad-residual", compress="fp16")
    wrong = keys.residual("bad-residual", 0, 1)
    body = feedback.encode_residual(np.zeros(config.plan.size - 1, dtype=np.float32))
    # stored as the pipeline stores it (signed: slsml.pipeline.signed), so that what is checked is its shape
    services.store.put_new(wrong, body, services.keys.sign_object("bad-residual", wrong, body))
    with pytest.raises(RunFailed, match=f"{wrong}: a residual of {2 * config.plan.size - 2} bytes does not match"):
        cloud.work(services, "bad-residual", 1, 1)
    assert not services.store.exists(keys.update("bad-residual", 1, 1))
    assert not services.store.exists(keys.residual("bad-residual", 1, 1))
