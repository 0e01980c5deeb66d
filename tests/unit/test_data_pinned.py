"""A run pins its dataset (moto's S3 and DynamoDB): every read, ranged or whole, is checked against the shard its
manifest lists at no request more; a run whose dataset changed or went away fails or refuses to resume, naming it;
`data rm` refuses a dataset a stopped or failed run would resume on unless forced."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import boto3
import numpy as np
import pytest

from slsml.aws import cache
from slsml.aws.cache import LRUCache
from slsml.aws.storage import ObjectStore
from slsml.cli import targets
from slsml.cli.main import main
from slsml.data import catalog
from slsml.data import datasets as data
from slsml.pipeline.services import Services
from slsml.pipeline.steps.warm import reader_for
from slsml.spec import keys
from slsml.spec.errors import BadInputError, NotFoundError
from slsml.state.orchestration import Orchestrator
from slsml.state.records import RunStatus

from . import cloud

RECORD = 6 * 4 + 8  # a sample of dataset d: 6 float32 features and an int64 label


def swap(store: ObjectStore, name: str, split: str, shard: int) -> None:
    """Overwrite a shard in place, as a plain PUT of other bytes of the same length would."""
    key = keys.dataset_shard(name, split, shard)
    body = bytearray(store.get(key))
    body[0] ^= 0xFF
    store.s3.put_object(Bucket=store.bucket, Key=key, Body=bytes(body))


def test_every_read_is_checked_against_the_shard_its_manifest_lists_at_no_request_more(
    services: Services,
) -> None:
    store = services.store
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((40, 6)).astype(np.float32), rng.integers(0, 3, 40)
    manifest = data.put_dataset(store, "p", x, y, x[:8], y[:8], shard_mb=10 * RECORD / 2**20)  # 10 records a shard
    assert all(entry.etag for entry in manifest.train.shards)
    wanted = np.array([3, 4, 17, 25, 26])
    ranged = data.DatasetReader(store, manifest)
    with cloud.gets_sent(store) as gets:
        np.testing.assert_array_equal(ranged.take("train", wanted)[0], x[wanted])
    assert len(gets) == len(data.coalesce(wanted, manifest.shard_records)) == 3  # one GET a run of records

    swap(store, "p", "train", 1)
    changed = r"^dataset 'p': train shard 1 is not the one its manifest lists"
    with pytest.raises(BadInputError, match=changed):
        ranged.take("train", np.array([17]))
    np.testing.assert_array_equal(ranged.take("train", np.array([3, 25]))[0], x[[3, 25]])  # the others read on
    with pytest.raises(BadInputError, match=changed):  # whole shards read into the warm cache: the same
        data.DatasetReader(store, manifest, LRUCache(None)).take("train", wanted)


def test_a_run_pins_its_dataset_and_fails_naming_it_whichever_containers_are_warm(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    import keras

    from slsml.training import modelio

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    config = cloud.register_run(services, modelio.save_model(model), "r")
    store = services.store
    assert config.dataset_sha256 == hashlib.sha256(store.get(keys.dataset_manifest("d"))).hexdigest()
    warm = reader_for(store, config)
    warm.take("train", np.arange(8))

    swap(store, "d", "train", 0)  # a shard replaced under the run
    with pytest.raises(BadInputError, match=r"^dataset 'd': train shard 0 is not the one its manifest lists"):
        data.DatasetReader(store, warm.manifest).take("train", np.arange(8))  # a cold container's read

    # the dataset removed, then put again with other data under its name: a warm container's reader (kept by the
    # pin) trains on the pinned shards it holds, never on the others; a cold one finds no manifest, then another one
    pinned = warm.take("train", np.arange(8))[0]
    catalog.remove(store, "d")
    rng = np.random.default_rng(5)
    other = rng.standard_normal((64, 6)).astype(np.float32)
    data.put_dataset(store, "d", other, rng.integers(0, 3, 64), other[:8], rng.integers(0, 3, 8))
    np.testing.assert_array_equal(reader_for(store, config).take("train", np.arange(8))[0], pinned)
    with pytest.raises(BadInputError, match=r"^dataset 'd': train shard 0 is not the one its manifest lists"):
        data.DatasetReader(store, reader_for(store, config).manifest).take("train", np.arange(8))  # read anew
    monkeypatch.setattr(cache, "_warm", None)  # a cold container
    with pytest.raises(BadInputError, match=r"^dataset 'd' changed since the run started: its manifest is not the"):
        reader_for(store, config)
    catalog.remove(store, "d")
    with pytest.raises(NotFoundError, match=r"^dataset 'd' the run trains on was removed since the run started"):
        reader_for(store, config)


@pytest.fixture
def stopped(services: Services, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Services:
    """The run commands' target: the moto cloud of ``services`` with a run state machine, holding run ``r`` on
    dataset ``d``, stopped."""
    import keras

    from slsml.aws import clients
    from slsml.training import modelio

    monkeypatch.chdir(tmp_path)
    arn = boto3.client("stepfunctions").create_state_machine(
        name="runs",
        roleArn="arn:aws:iam::123456789012:role/runs",
        definition=json.dumps({"StartAt": "wait", "States": {"wait": {"Type": "Pass", "End": True}}}),
    )["stateMachineArn"]
    acting = dataclasses.replace(services, orchestrator=Orchestrator(clients.client("stepfunctions"), arn))
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    cloud.register_run(acting, modelio.save_model(model), "r")
    monkeypatch.setattr(targets, "target", lambda args: (acting, lambda run: []))
    assert main(["run", "stop", "r"]) == 0
    return acting


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``slsml ARGS``, which must be refused: the one line it printed."""
    capsys.readouterr()
    assert main(list(args)) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    return err


def test_a_run_resumes_on_the_data_it_started_on_or_refuses_at_once(
    stopped: Services, capsys: pytest.CaptureFixture[str]
) -> None:
    store = stopped.store
    rng = np.random.default_rng(0)  # dataset d as moto_services put it
    x, y = rng.standard_normal((64, 6)).astype(np.float32), rng.integers(0, 3, 64)

    err = _refused(capsys, "data", "rm", "d")
    assert "run r would resume on" in err and "`slsml data rm d --force`" in err
    assert store.exists(keys.dataset_manifest("d"))
    assert main(["data", "rm", "d", "--force"]) == 0

    err = _refused(capsys, "run", "resume", "r")
    assert "run 'r' cannot resume: dataset 'd' the run trains on was removed since the run started" in err
    assert "`slsml data put d SOURCE`" in err
    assert stopped.table.get_run("r").status == RunStatus.STOPPED  # nothing changed

    rng = np.random.default_rng(9)
    other = rng.standard_normal((64, 6)).astype(np.float32)
    data.put_dataset(store, "d", other, y, other[:8], y[:8])
    err = _refused(capsys, "run", "resume", "r")
    assert "run 'r' cannot resume: dataset 'd' changed since the run started" in err and "`slsml data rm d`" in err

    assert main(["data", "rm", "d", "--force"]) == 0
    data.put_dataset(store, "d", x, y, x[:8], y[:8])  # the same data put back: the same manifest
    swap(store, "d", "test", 0)
    err = _refused(capsys, "run", "resume", "r")
    assert "run 'r' cannot resume: dataset 'd': test shard 0 is not the one its manifest lists" in err

    assert main(["data", "rm", "d", "--force"]) == 0
    data.put_dataset(store, "d", x, y, x[:8], y[:8])
    capsys.readouterr()
    assert main(["run", "resume", "r"]) == 0
    assert stopped.table.get_run("r").status == RunStatus.RUNNING
