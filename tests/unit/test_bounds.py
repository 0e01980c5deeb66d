"""A model archive or a run request too large for its function is refused by name before it is read, extracted or
built; a drop-in refused so stores no object, its run registered FAILED (the RunStarter, against moto)."""

from __future__ import annotations

import io
import json
import logging
import zipfile

import numpy as np
import pytest

from slsml.data import datasets as data
from slsml.pipeline.services import Services
from slsml.pipeline.steps import run_starter
from slsml.spec import keys
from slsml.spec.config import DropInRequest
from slsml.spec.deployment import RUNS_PREFIX
from slsml.spec.errors import BadInputError
from slsml.spec.messages import ModelLanded
from slsml.training import bounds, modelio
from tests import archives

from .test_reduce_steps import services  # noqa: F401

SMALL = bounds.Limits(memory_bytes=32 * bounds.MB, storage_bytes=512 * bounds.MB)


def test_a_zip_bomb_is_refused_from_its_directory() -> None:
    bomb = archives.bomb(4_000_000_000)
    expanded = sum(member.file_size for member in zipfile.ZipFile(io.BytesIO(bomb)).infolist())
    with pytest.raises(BadInputError) as refused:
        modelio.load_model(bomb, where="incoming/bomb.keras")
    assert str(refused.value).startswith(f"incoming/bomb.keras expands to {expanded:,} bytes from {len(bomb):,}")


def test_a_model_is_sized_from_its_config_before_its_variables_are_built() -> None:
    assert modelio.load_model(archives.small_model(), limits=SMALL).count_params() == 7 * 7 + 7 + 7 * 2 + 2
    width = 2000  # Dense(2000) on Input(2000): 16 MB of weights, 112 MB loaded with Adam's m and v, in 32 MB
    with pytest.raises(BadInputError) as refused:
        modelio.load_model(archives.declaring(width), where="wide.keras", limits=SMALL)
    weights = 4 * (width * width + width + width * 2 + 2)
    assert str(refused.value).startswith(
        f"wide.keras declares {weights:,} bytes of weights: loading them takes 5× that, its optimizer's slots 2× more"
    )
    assert f"above the {SMALL.memory_bytes:,} of memory" in str(refused.value)


@pytest.fixture
def seven(services: Services) -> Services:  # noqa: F811
    rng = np.random.default_rng(0)
    x, y = rng.random((40, 7), dtype=np.float32), rng.random((40, 2), dtype=np.float32)
    data.put_dataset(services.store, "seven", x[:32], y[:32], x[32:], y[32:])
    return services


@pytest.mark.parametrize(
    ("model", "request_body", "reason"),
    [
        (archives.bomb(4_000_000_000), b'{"dataset": "seven"}', "the model expands to 4,000,00"),
        (archives.declaring(30_000), b'{"dataset": "seven"}', "the model declares 3,600,360,008 bytes of weights"),
        (
            archives.small_model(),
            json.dumps({"dataset": "seven", "pad": " " * 70_000}).encode(),
            "incoming/m.json is too large: 70,0",
        ),
    ],
)
def test_a_drop_in_too_large_for_its_function_is_refused_by_name_with_nothing_stored(
    seven: Services,
    model: bytes,
    request_body: bytes,
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    seven.store.put_new(keys.incoming_request("m"), request_body)
    seven.store.put_new("incoming/m.keras", model)
    caplog.set_level(logging.ERROR)
    assert run_starter.on_dropped(ModelLanded(key="incoming/m.keras", sequencer="1"), seven, DropInRequest()) is None
    (refused,) = [r for r in caplog.records if r.getMessage() == "dropped model not started"]
    assert refused.key == "incoming/m.keras" and refused.reason.startswith(reason)
    assert seven.store.list_keys(RUNS_PREFIX) == []
    (run,) = seven.table.list_runs()  # the refusal is visible: the run registered FAILED with its reason
    assert run.status == "FAILED" and run.reason.startswith(f"incoming/m.keras not started: {reason}")
