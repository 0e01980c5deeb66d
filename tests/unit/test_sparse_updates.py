"""Exact sparse updates (``compress sparse``) on the generated workloads, with real TensorFlow gradients: rounds of
W workers whose updates go through the update format to R reducer parts, averaged and stepped as the reducers do,
end at the same weights as dense updates, bit for bit (SGD; and Adam, whose moments decay on every row as in dense
training); a Criteo-like round sends at most a tenth of dense's bytes, and the plan prices it from above."""

from __future__ import annotations

import numpy as np
import pytest

from slsml.bench.workloads import BUCKETS, Workload
from slsml.cost import chain, modelinfo
from slsml.cost.parameters import Parameters
from slsml.cost.workload import run_workload
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.shardplan import ShardPlan
from slsml.training import modelio, optimizers, updates
from slsml.training.updates import Compression

WORKERS, REDUCERS, ROUNDS, BATCH = 4, 3, 3, 64  # BATCH: each worker's samples of a round
SPARSE, DENSE = Compression.parse("sparse"), Compression.parse("none")


@pytest.fixture(scope="module")
def criteo() -> tuple[bytes, np.ndarray, np.ndarray]:
    workload = Workload("criteo", seed=3)
    x, y = workload.arrays(WORKERS * BATCH * ROUNDS)
    return workload.model(), x, y


def _parts(body: bytes, plan: ShardPlan, compression: Compression) -> list[np.ndarray]:
    """Each reducer's part of an update object, read as its ranged GETs read it, decoded."""
    out = []
    for shard in range(plan.reducers):
        if compression.tabled:
            first, last = updates.table_range(plan, shard)
            first, last = updates.significant_part_range(body[first : last + 1], plan, shard, len(body))
        else:
            first, last = updates.part_range(plan, shard, compression)
        out.append(updates.decode_part(body[first : last + 1], plan, shard, compression))
    return out


def _train(
    model_bytes: bytes, x: np.ndarray, y: np.ndarray, compression: Compression, optimizer: OptimizerConfig
) -> tuple[np.ndarray, list[int]]:
    """The weights after ``ROUNDS`` rounds of gradient averaging, and the bytes of every update object sent."""
    model = modelio.load_model(model_bytes)
    plan = ShardPlan.build(modelio.variable_specs(model), REDUCERS)
    trainer = modelio.Trainer(model, plan, modelio.loss_config(model, None))
    weights, trainable = modelio.get_flat(model, plan), plan.trainable_mask()
    states = [optimizers.initial_state(optimizer, int(plan.shard(r).trainable.sum())) for r in range(REDUCERS)]
    sizes = []
    for step in range(ROUNDS):
        modelio.set_flat(model, plan, weights)
        parts = []
        for worker in range(WORKERS):
            batch = slice((step * WORKERS + worker) * BATCH, (step * WORKERS + worker + 1) * BATCH)
            vector = trainer.compute_update(x[batch], y[batch]).vector
            body = updates.encode(vector, BATCH, "gradient", compression, plan).body
            sizes.append(len(body))
            parts.append(_parts(body, plan, compression))
        stepped = weights.copy()
        for shard in range(REDUCERS):  # as a reducer: the samples-weighted mean in float64, then one step
            layout = plan.shard(shard)
            mean = sum(p[shard].astype(np.float64) * BATCH for p in parts) / (WORKERS * BATCH)
            mean = mean.astype(np.float32)
            own = weights[layout.start : layout.stop]
            new, states[shard] = optimizers.apply(
                optimizer, own[layout.trainable], mean[layout.trainable], states[shard]
            )
            stepped[layout.start : layout.stop][layout.trainable] = new
        weights = stepped
    assert trainable.sum() == BUCKETS + 2
    return weights, sizes


@pytest.mark.parametrize(
    "optimizer",
    [OptimizerConfig(name="sgd", learning_rate=0.5), OptimizerConfig(name="adam", learning_rate=0.01)],
    ids=lambda o: o.name,
)
def test_sparse_updates_train_to_the_same_weights_as_dense_ones(criteo, optimizer: OptimizerConfig) -> None:
    model_bytes, x, y = criteo
    initial = np.concatenate([np.ravel(w) for w in modelio.load_model(model_bytes).get_weights()])
    dense, dense_sizes = _train(model_bytes, x, y, DENSE, optimizer)
    sparse, sparse_sizes = _train(model_bytes, x, y, SPARSE, optimizer)
    assert np.array_equal(sparse, dense)  # exact: the same bits
    moved = sparse[:BUCKETS] != initial[:BUCKETS]
    touched = np.zeros(BUCKETS, dtype=bool)
    touched[np.unique(x)] = True
    assert moved[touched].mean() > 0.99  # every row looked up moved (but those whose gradient summed to zero)
    assert not moved[~touched].any()  # rows never looked up stay: their gradient is zero, dense or sparse
    assert max(sparse_sizes) <= 0.1 * min(dense_sizes)  # the bytes of one worker's update, every round


def test_a_criteo_round_sends_a_tenth_of_dense_bytes_and_the_plan_prices_it(criteo) -> None:
    """The plan counts the rows a batch touches as if its lookups were uniform: right for uniform features, and an
    upper bound for the Zipf-skewed ones of the workload (a common value repeats)."""
    model_bytes, x, y = criteo
    model = modelio.load_model(model_bytes)
    plan = ShardPlan.build(modelio.variable_specs(model), REDUCERS)
    trainer = modelio.Trainer(model, plan, modelio.loss_config(model, None))

    def sent(features: np.ndarray) -> tuple[int, int]:
        vector = trainer.compute_update(features, y[:BATCH]).vector
        return (
            len(updates.encode(vector, BATCH, "gradient", SPARSE, plan).body),
            len(updates.encode(vector, BATCH, "gradient", DENSE, plan).body),
        )

    (skewed, dense), (uniform, _) = (
        sent(x[:BATCH]),
        sent(np.random.default_rng(5).integers(0, BUCKETS, x[:BATCH].shape)),
    )
    spec = TrainingSpec(
        workers=WORKERS, reducers=REDUCERS, global_batch=WORKERS * BATCH, iterations=10, compress="sparse"
    )
    figures = modelinfo.from_keras(model_bytes, "criteo.keras", "criteo.keras", BATCH, False, Parameters())
    figures |= {"compute_per_sample_s": 1e-4, "compute_source": "not measured: the bytes do not depend on it"}
    planned = chain.round_traffic(run_workload(figures, spec), Parameters()).update_bytes
    print(f"\none worker's update of {BATCH} samples: {skewed:,} B sparse (Zipf features), {uniform:,} B sparse")
    print(f"(uniform features), {dense:,} B dense; planned {planned:,} B")
    assert skewed <= 0.1 * dense and planned <= 0.1 * dense
    assert abs(planned - uniform) <= 0.01 * uniform and skewed < planned


def test_the_plan_reads_each_embedding_table_and_the_rows_a_sample_looks_up() -> None:
    import keras

    shared = keras.layers.Embedding(100, 4)
    first, second = keras.Input((3,), dtype="int32"), keras.Input((5,), dtype="int32")
    model = keras.Model([first, second], keras.layers.Concatenate(axis=1)([shared(first), shared(second)]))
    found = modelinfo.embeddings(modelio.load_model(modelio.save_model(model)))
    assert [(e.rows, e.width, e.lookups) for e in found] == [(100, 4, 8)]  # a shared table: every call's lookups
    ratings = modelinfo.embeddings(modelio.load_model(Workload("movielens").model()))
    assert [(e.rows, e.width, e.lookups) for e in ratings] == [(6040, 16, 1), (3706, 16, 1)]
    assert ratings[0].touched(1) == pytest.approx(1) and ratings[0].touched(10**6) == pytest.approx(6040)
