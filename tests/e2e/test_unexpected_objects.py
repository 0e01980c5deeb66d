"""Objects slsml did not write, under the prefixes that notify the pipeline, while runs train: those
that are no model of the pipeline's are ignored with a logged reason and left as they are, and a manifest's name
notifies nothing. (One that takes the key
of a run's next model is replaced by the Merger's: tests/e2e/test_attacks.py.)"""

from __future__ import annotations

import numpy as np

from slsml.client import demo
from slsml.spec.config import TrainingSpec
from slsml.training import modelio

from .conftest import final_weights, finish, log_entries, train

SPEC = TrainingSpec(workers=2, reducers=2, global_batch=64, iterations=3, eval_every=0)


def test_objects_that_are_no_pipeline_model_are_ignored_and_kept(local, services, digits):
    train(services, SPEC, "stray-clean")
    assert finish(services, "stray-clean").status == "COMPLETED"

    other_model = modelio.save_model(demo.digits_cnn(seed=5))
    stray = {
        "runs/stray/models/notes.keras": b"a note, not a model",  # not an iteration's name
        "runs/stray/models/000002.keras": other_model,  # a saved model's name: no trigger
        "runs/stray/models/000007.json": b"{}",  # a manifest's name: no trigger (the Merger announces its own)
        "runs/stray/backup.keras": other_model,  # beside the run's own objects
        "incoming/not a name!.keras": other_model,  # a drop-in name that no run id can come from
        "incoming/nested/model.keras": other_model,
    }
    train(services, SPEC, "stray")
    for key, body in stray.items():
        services.store.put_new(key, body)
    run = finish(services, "stray")

    assert run.status == "COMPLETED", run.reason
    assert run.iteration == SPEC.iterations
    assert np.array_equal(final_weights(services, "stray")[0], final_weights(services, "stray-clean")[0])
    for key, body in stray.items():
        assert services.store.get(key) == body, key
    launcher_log = local.log_dir / "work_launcher.log"
    not_models = {e["key"] for e in log_entries(launcher_log, message="object is not a pipeline model: ignored")}
    assert {"runs/stray/models/notes.keras", "runs/stray/models/000002.keras", "runs/stray/backup.keras"} <= not_models
    assert "runs/stray/models/000007.json" not in launcher_log.read_text()  # no WorkLauncher heard of it
    dropped = {
        e["key"]
        for e in log_entries(local.log_dir / "run_starter.log", message="object is not a dropped model: ignored")
    }
    assert {k for k in stray if k.startswith("incoming/")} <= dropped
    assert not [r.run_id for r in services.table.list_runs() if r.run_id.startswith(("not-a-name", "nested"))]
