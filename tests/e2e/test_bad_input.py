"""Bad input: a clear error naming the problem, the run FAILED with the reason, nothing overwritten."""

from __future__ import annotations

import io
import json
import time
import zipfile
from datetime import datetime

import keras
import numpy as np
import pytest

from slsml.client import demo
from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.spec import keys
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError
from slsml.training import modelio

from .conftest import DIGITS, finish, log_entries, prepared_with_source, train

SPEC = TrainingSpec(workers=2, reducers=1, global_batch=64, iterations=2, eval_every=0)


def test_upload_that_is_not_a_keras_model_fails_the_run(services, digits):
    # an upload that is not a model, behind slsml's back (prepare_run checks what it is given)
    config = prepared_with_source(services, SPEC, "bad-model", b"definitely not a zip archive")
    store = services.store
    launch.launch_run(services, config)
    run = finish(services, "bad-model", timeout_s=60)
    assert run.status == "FAILED"
    assert "not a Keras model" in run.reason and "runs/bad-model/source.keras" in run.reason
    assert store.get(keys.model("bad-model", 0)) == b"definitely not a zip archive"
    # workers already warm with a model of the same architecture may take an iteration from the shards the start
    # stored before the first one that loads the upload fails the run; no final model comes of it
    assert not services.store.exists(keys.final_model("bad-model"))


def test_start_rejects_a_file_that_is_not_a_model(services, digits):
    with pytest.raises(BadInputError, match="not a Keras model"):
        launch.start_run(services, b"PK\x03\x04 truncated", DIGITS, SPEC, run_id="garbage")
    assert not services.store.exists(keys.run_config("garbage"))


def test_data_that_does_not_fit_the_model(services, digits):
    x, y, x_test, y_test = digits
    data.put_dataset(services.store, "flat-digits", x.reshape(len(x), -1), y, x_test.reshape(len(x_test), -1), y_test)
    with pytest.raises(BadInputError, match="does not fit the model"):
        launch.start_run(services, modelio.save_model(demo.digits_cnn()), "flat-digits", SPEC, run_id="misfit")
    assert not services.store.exists(keys.run_config("misfit"))


def _token_classifier(dtype: str = "int32") -> bytes:
    model = keras.Sequential(
        [
            keras.Input((12,), dtype=dtype),
            keras.layers.Embedding(50, 8),
            keras.layers.GRU(4),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return modelio.save_model(model)


def _nothing_stored(services, run_id: str) -> None:
    assert not services.store.list_keys(keys.run_prefix(run_id))
    with pytest.raises(NotFoundError):
        services.table.get_run(run_id)


def test_float_features_for_an_integer_input_of_another_width_are_refused(services):
    """A Sequential model would run on them (Keras only warns, and casts the floats): a run trained on garbage."""
    rng = np.random.default_rng(0)
    x, y = rng.random((200, 30)).astype(np.float32), rng.integers(0, 3, 200)
    data.put_dataset(services.store, "thirty-floats", x[:160], y[:160], x[160:], y[160:])
    with pytest.raises(BadInputError) as refused:
        launch.start_run(services, _token_classifier(), "thirty-floats", SPEC, run_id="garbage-in")
    message = str(refused.value)
    assert message.startswith("the data does not fit the model: samples of shape (30,) float32 vs model input")
    assert "of shape (12,) int32: 30 features where the model takes 12; float32 data for an integer input" in message
    assert message.endswith(modelio.FIT_DATA)
    _nothing_stored(services, "garbage-in")


def test_integer_values_beyond_the_inputs_dtype_are_refused(services):
    """The dataset's recorded value range counts, not only the samples the check reads."""
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 50, (200, 12)), rng.integers(0, 3, 200)
    x[-1, -1] = 40_000  # in the test split: the first training samples look fine
    data.put_dataset(services.store, "wide-ids", x[:160], y[:160], x[160:], y[160:])
    with pytest.raises(
        BadInputError,
        match=r"samples of shape \(12,\) int64 vs model input '\w+' of shape \(12,\)"
        r" int16: values from 0 to 40000 do not fit int16 \(-32768 to 32767\)",
    ):
        launch.start_run(services, _token_classifier("int16"), "wide-ids", SPEC, run_id="wide-ids")
    _nothing_stored(services, "wide-ids")


def test_labels_beyond_the_model_outputs(services, digits):
    x, y, x_test, y_test = digits
    data.put_dataset(services.store, "many-classes", x, y * 2, x_test, y_test * 2)
    with pytest.raises(BadInputError, match="labels go up to 18 but the model has only 10 outputs"):
        launch.start_run(services, modelio.save_model(demo.digits_cnn()), "many-classes", SPEC, run_id="classes")


def test_missing_dataset(services, digits):
    with pytest.raises(NotFoundError, match="dataset 'nowhere' does not exist"):
        launch.start_run(services, modelio.save_model(demo.digits_cnn()), "nowhere", SPEC, run_id="no-data")


def test_unknown_run_is_ignored_and_reported(local, services, digits):
    services.store.put_new(keys.model("ghost", 0), modelio.save_model(demo.digits_cnn()))
    with pytest.raises(NotFoundError, match="no run named 'ghost'"):
        services.table.get_run("ghost")
    time.sleep(2)
    assert services.table.list_iterations("ghost") == []
    log = (local.log_dir / "work_launcher.log").read_text()
    assert "model belongs to no known run" in log and "ghost" in log


def test_an_existing_run_is_never_overwritten(services, digits):
    train(services, SPEC, "keep-me")
    assert finish(services, "keep-me").status == "COMPLETED"
    config_before = services.store.get(keys.run_config("keep-me"))
    final_before = services.store.get(keys.final_model("keep-me"))
    other = modelio.save_model(demo.digits_cnn(seed=7))
    with pytest.raises(BadInputError, match=r"already exists \(`slsml run status keep-me` shows it\): give this one"):
        launch.start_run(services, other, DIGITS, SPEC, run_id="keep-me")
    assert services.store.get(keys.run_config("keep-me")) == config_before
    assert services.store.get(keys.final_model("keep-me")) == final_before
    assert services.table.get_run("keep-me").status == "COMPLETED"


def test_dataset_names_are_never_reused(services, digits):
    x, y, x_test, y_test = digits
    manifest_before = services.store.get(keys.dataset_manifest(DIGITS))
    with pytest.raises(BadInputError, match="already exists"):
        data.put_dataset(services.store, DIGITS, x[:10], y[:10], x_test[:5], y_test[:5])
    assert services.store.get(keys.dataset_manifest(DIGITS)) == manifest_before
    assert np.array_equal(
        data.DatasetReader(services.store, data.load_manifest(services.store, DIGITS)).take("train", np.arange(5))[1],
        y[:5],
    )


def test_a_message_failing_three_times_fails_its_run_via_the_dead_letter_queue(local, services, digits):
    model = modelio.save_model(demo.digits_cnn())
    config = launch.prepare_run(services, model, DIGITS, SPEC, run_id="corrupt-source")
    # a run whose run.json, as it registered it, is not slsml's (slsml never writes one): the WorkLauncher, which reads
    # the run's config first, fails unexpectedly on its S3 event
    services.store.put_new(keys.run_config("corrupt-config"), b"{}")
    services.store.put_new(keys.source_model("corrupt-config"), model)
    launch.launch_run(services, config.model_copy(update={"run_id": "corrupt-config"}), stored=b"{}")
    run = finish(services, "corrupt-config", timeout_s=120)
    assert run.status == "FAILED"
    # the error as Lambda attaches it to a dead letter: the exception's message, without its name
    assert run.reason.startswith("work_launcher failed three times on one message: "), run.reason
    assert "run 'corrupt-config' has a run.json that is not slsml's: run_id: Field required" in run.reason, run.reason
    assert any(d["run_id"] == "corrupt-config" and d["function"] == "work_launcher" for d in local.host.dead_letters)
    assert "corrupt-config" in (local.log_dir / "dead-letters.jsonl").read_text()
    # failed by the dead-letter reader, as on AWS, from the dead letters the host handed it: an S3 event's letter
    # names its run by the model's key, which the event encodes
    assert local.host.wait_idle("corrupt-config", timeout_s=60)  # its log is written
    letters = log_entries(local.log_dir / "dead_letters.log", message="dead letter", run_id="corrupt-config")
    assert letters and all(e["function"] == "work_launcher" and not e["rejected"] for e in letters), letters
    failed = log_entries(local.log_dir / "dead_letters.log", message="run failed", run_id="corrupt-config")
    assert [e["reason"] for e in failed] == [run.reason]
    # as Lambda retries: the event tried again 1 s, then 2 s after it failed, and dead-lettered as soon as its third
    # try failed
    made = [
        entry["usage"]
        for entry in log_entries(local.log_dir / "work_launcher.log", message="usage")
        if entry["usage"]["run_id"] == "corrupt-config"
        and entry["usage"]["iteration"] == 0  # a try on the event
        and entry["usage"]["duration_s"] > 0
    ]
    assert len(made) == 3, made
    first, second, third = sorted(made, key=lambda usage: usage["start"])
    assert second["start"] - first["end"] >= 1.0 and third["start"] - second["end"] >= 2.0, made
    lettered = min(datetime.strptime(e["timestamp"], "%Y-%m-%d %H:%M:%S,%f%z").timestamp() for e in letters)
    assert lettered - third["end"] < 1.0


@keras.saving.register_keras_serializable(package="tests")
class HalvingSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.01 / (1.0 + keras.ops.cast(step, "float32"))

    def get_config(self):
        return {}


@keras.saving.register_keras_serializable(package="tests")
class TunedSGD(keras.optimizers.SGD):
    pass


def _compiled(optimizer: keras.optimizers.Optimizer) -> bytes:
    model = demo.digits_cnn()
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return modelio.save_model(model)


def _with_learning_rate(model_bytes: bytes, learning_rate: object) -> bytes:
    """The same .keras file with its compiled optimizer's learning rate replaced (as a hand edit would)."""
    source, target = io.BytesIO(model_bytes), io.BytesIO()
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        for item in zin.infolist():
            body = zin.read(item)
            if item.filename == "config.json":
                config = json.loads(body)
                config["compile_config"]["optimizer"]["config"]["learning_rate"] = learning_rate
                body = json.dumps(config).encode()
            zout.writestr(item, body)
    return target.getvalue()


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            lambda: _compiled(keras.optimizers.Adam(HalvingSchedule())),
            r"carries code of its own, which slsml's functions do not run: class 'HalvingSchedule' \(tests>Halving",
        ),
        (lambda: _compiled(TunedSGD(0.01)), r"code of its own, which .* class 'TunedSGD' \(tests>TunedSGD\); they"),
        (
            lambda: _with_learning_rate(
                _compiled(keras.optimizers.Adam()),
                {
                    "module": "keras.optimizers.schedules",
                    "class_name": "ExponentialDecay",
                    "config": {"initial_learning_rate": 0.01, "decay_steps": -3, "decay_rate": 0.5},
                },
            ),
            "decay_steps` must be > 0. Received: decay_steps=-3",
        ),
    ],
    ids=["custom-schedule", "custom-optimizer", "malformed-schedule"],
)
def test_an_optimizer_the_reducers_cannot_apply_is_refused_by_name(services, digits, model, message):
    run_id = "refused-optimizer"
    with pytest.raises(BadInputError, match=message):
        launch.start_run(services, model(), DIGITS, SPEC, run_id=run_id)
    assert not services.store.list_keys(keys.run_prefix(run_id))
    with pytest.raises(NotFoundError):
        services.table.get_run(run_id)
