"""The demo's promise: digits to ≥ 0.95 test accuracy within 150 iterations, every iteration through
all five functions (4 workers, 2 reducers, quorum 1)."""

from __future__ import annotations

from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.training import modelio

from .conftest import finish, train

DEMO = TrainingSpec(workers=4, reducers=2, global_batch=128, iterations=150, quorum=1.0, eval_every=50)


def test_demo_configuration_reaches_95_percent(services, digits):
    from slsml.client import demo

    train(services, DEMO, "demo-accuracy", modelio.save_model(demo.digits_cnn(learning_rate=3e-3, seed=0)))
    run = finish(services, "demo-accuracy", timeout_s=900)
    assert run.status == "COMPLETED", run.reason
    assert run.test_accuracy >= 0.95, f"test accuracy {run.test_accuracy:.4f}"
    iterations = services.table.list_iterations("demo-accuracy")
    assert [r.iteration for r in iterations] == list(range(150))
    for record in iterations:  # WorkLauncher → 4 Workers → ReduceLauncher → 2 Reducers → Merger
        assert record.launched_by and record.reduce_fired_by is not None and record.merged_at
        assert set(record.reports) == {0, 1, 2, 3}
        assert [p.worker for p in record.participants] == [0, 1, 2, 3] and record.participant_count == 4
        assert (record.shards_in, record.merge_fired_by in {0, 1}, record.stale_shards) == (2, True, set())
        assert services.store.exists(keys.trigger("demo-accuracy", record.iteration + 1))
    model = modelio.load_model(services.store.get(keys.final_model("demo-accuracy")))
    assert model.count_params() > 0
