"""Object key layout: the keys that trigger an iteration (the initial model, then each iteration's manifest)."""

from __future__ import annotations

import pytest

from slsml.spec import keys


@pytest.mark.parametrize(("run", "iteration"), [("run-1", 0), ("a", 7), ("0abc-def", 123456), ("r" * 63, 999999)])
def test_parse_model_key_accepts_trigger_keys(run: str, iteration: int) -> None:
    key = keys.trigger(run, iteration)
    assert key == f"runs/{run}/models/{iteration:06d}" + (".json" if iteration else ".keras")
    assert keys.parse_model_key(key) == (run, iteration)


@pytest.mark.parametrize(
    "key",
    [
        keys.final_model("run-1"),
        keys.run_config("run-1"),
        keys.model("run-1", 3),  # a model saved at a checkpoint or for the final one: it launches nothing
        keys.source_model("run-1"),
        keys.shard("run-1", 3, 0),
        keys.update("run-1", 3, 0),
        keys.residual("run-1", 3, 0),
        keys.dataset_shard("digits", "train", 0),
        "incoming/model.keras",
        "runs/run-1/models/000001.h5",
        "runs/run-1/models/000001.keras.tmp",
        "runs/run-1/models/1.keras",
        "runs/run-1/models/1.json",
        "runs/run-1/models/000001.json.tmp",
        "runs/run-1/models/0000001.keras",
        "runs/run-1/models/00000a.keras",
        "runs/run-1/models/.keras",
        "runs/run-1/000001.keras",
        "runs/run-1/x/models/000001.keras",
        "x/runs/run-1/models/000001.keras",
        "/runs/run-1/models/000001.keras",
        "runs/Run-1/models/000001.keras",
        "runs/-run/models/000001.keras",
        "runs/run_1/models/000001.keras",
        "runs//models/000001.keras",
        f"runs/{'r' * 64}/models/000001.keras",
        "runs/run-1/models/000001.keras\n",
        "",
    ],
)
def test_parse_model_key_rejects_other_keys(key: str) -> None:
    assert keys.parse_model_key(key) is None
