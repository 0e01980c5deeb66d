"""A worker's round in pipeline stages across Worker invocations (``slsml.pipeline.staged``): the digits CNN cut
into three stages, in micro-batches, trains on the local cloud to the weights of single-process Keras on the same
global batches, as a run of one stage does (``test_equivalence``); deliveries held back past the deadline re-launch
a round's stages together and change no weight; objects placed beforehand where the stages hand each other what they
compute are replaced by the stages' own and change nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from slsml.accounting import prices
from slsml.aws.storage import MULTIPART_BYTES
from slsml.cli.main import main
from slsml.client import demo
from slsml.cost import stages
from slsml.cost.modelinfo import from_keras_file
from slsml.cost.parameters import Parameters
from slsml.cost.workload import function_memory, function_timeouts, run_workload
from slsml.data import datasets as data
from slsml.local.faults import Delay, Faults
from slsml.spec import keys
from slsml.spec.config import RunConfig, TrainingSpec
from slsml.training import modelio, progress
from slsml.training.modelio import keras

from .conftest import final_weights, finish, log_entries, timeouts, train
from .test_equivalence import BATCH, ITERATIONS, TOLERANCE, config_of, keras_optimizer, reference
from .test_faults import injecting

STAGES, WORKERS, MICRO_BATCH = 3, 1, 20  # the worker's 96 samples in five micro-batches (20, 19, 19, 19, 19)
HAND_ON_TIMEOUT_S = 4  # the Worker's (and Reducer's) where its stages hand their rounds on: one pass an invocation
SPEC = TrainingSpec(
    workers=WORKERS,
    reducers=2,
    global_batch=BATCH,
    iterations=ITERATIONS,
    optimizer=config_of("sgd-momentum"),
    eval_every=0,
    micro_batch=MICRO_BATCH,
    pipeline_stages=STAGES,
)


def _stages(found: list[str], run_id: str, iteration: int, attempt: int) -> set[str]:
    """The stages that stored the objects ``found`` of worker 0's round (its ``attempt``)."""
    prefix = keys.stages_prefix(run_id, iteration, 0, attempt)
    return {key.removeprefix(prefix).split("/")[0] for key in found}


def _penalized() -> keras.Model:
    """The digits CNN with L2 penalties on its first convolution (stage 0's) and its hidden dense layer, and
    accuracy."""
    keras.utils.set_random_seed(1)
    l2 = keras.regularizers.L2(1e-3)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu", kernel_regularizer=l2),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu", kernel_regularizer=l2),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


@pytest.fixture(scope="module")
def staged(services, digits) -> np.ndarray:
    """The final weights of the run in stages, trained without faults."""
    train(services, SPEC, "staged")
    run = finish(services, "staged")
    assert run.status == "COMPLETED", run.reason
    return final_weights(services, "staged")[0]


def test_a_run_in_three_stages_trains_to_the_weights_of_single_process_keras(services, staged):
    config = RunConfig.model_validate(services.store.get_json(keys.run_config("staged")))
    assert config.stage_blocks is not None and len(config.stage_blocks) == STAGES
    # every stage of the worker's round computed in an invocation of its own, handing on through the bucket
    handed = services.store.list_keys(keys.stages_prefix("staged", 0, 0, 0))
    assert _stages(handed, "staged", 0, 0) == {"00", "01", "02"}
    assert len([key for key in handed if key.endswith("/forward/000000.npy")]) == STAGES - 1
    assert len([key for key in handed if key.endswith("part.npz")]) == STAGES - 1
    assert len([key for key in handed if key.endswith("part.f32")]) == STAGES
    expected, _ = reference("sgd-momentum")
    error = np.abs(staged - expected).max() / np.abs(expected).max()
    print(f"\n{STAGES} stages, W={WORKERS}, micro-batch {MICRO_BATCH}: max|Δw|/max|w| = {error:.2e}")
    assert error <= TOLERANCE["sgd-momentum"]


def test_a_run_in_stages_evaluates_through_them_to_the_figures_of_keras_evaluate(services, digits):
    """Each stage computes its layers on the workers' slices of the test split, handing on its output with the
    penalties so far; the last stage's loss and accuracy are Keras's ``evaluate`` of the same model, penalties
    included, at a checkpoint and for the final model."""
    run_id = "staged-evaluated"
    spec = SPEC.model_copy(update={"eval_every": 2, "checkpoint_every": 2})
    train(services, spec, run_id, modelio.save_model(_penalized()))
    run = finish(services, run_id)
    assert run.status == "COMPLETED", run.reason
    _, _, x_test, y_test = digits
    for iteration in (2, ITERATIONS):  # a checkpoint's evaluation, then the final model's past the budget
        handed = services.store.list_keys(keys.stages_prefix(run_id, iteration, 0, 0))
        assert _stages([key for key in handed if "/test/" in key], run_id, iteration, 0) == {"00", "01"}
        saved = keys.model(run_id, iteration) if iteration < ITERATIONS else keys.final_model(run_id)
        model = modelio.load_model(services.store.get(saved))
        expected = model.evaluate(x_test, y_test, return_dict=True, verbose=0)
        got = services.table.get_counter(run_id, iteration - 1).test
        penalties = float(sum(model.losses))
        print(f"\nmodel entering {iteration}: {got} against Keras's {expected} (penalties {penalties:.4f})")
        assert got is not None and set(got) == set(expected) == {"loss", "accuracy"}
        assert penalties > 1e-3 * expected["loss"], "the penalties are too small to tell: vacuous"
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-6)
    assert run.test == services.table.get_counter(run_id, ITERATIONS - 1).test


def _wide() -> keras.Model:
    """A model of 6 M weights (24 MB) whose middle layer's part of the update (18.5 MB) is stored in parts."""
    keras.utils.set_random_seed(1)
    layers = [keras.layers.Dense(32, activation="relu"), keras.layers.Dense(140_000, activation="relu")]
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), *layers, keras.layers.Dense(10)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_an_update_of_parts_stored_in_parts_trains_to_the_weights_of_single_process_keras(services):
    """Each stage stores its part of the update as it is (a large one in parts) and stage 0 an index naming them,
    which the reducers read by range: no function holds the whole update, and the run ends at single-process Keras's
    weights."""
    run_id, iterations = "staged-parts", 2
    train(services, SPEC.model_copy(update={"iterations": iterations}), run_id, modelio.save_model(_wide()))
    run = finish(services, run_id)
    assert run.status == "COMPLETED", run.reason
    handed = services.store.list_keys(keys.stages_prefix(run_id, 0, 0, 0))
    parts = [services.store.read(key, (0, 0)) for key in handed if key.endswith("part.f32")]
    assert len(parts) == STAGES and max(p.size or 0 for p in parts) > MULTIPART_BYTES  # one stored in parts
    assert str(max(parts, key=lambda p: p.size or 0).etag).endswith('-3"')
    update = services.store.read(keys.update(run_id, 0, 0, 0))
    assert update.size is not None and update.size < 4096  # the index, which names the parts
    x, y, _, _ = demo.digits()
    model, optimizer = _wide(), keras_optimizer("sgd-momentum")
    for iteration in range(iterations):
        batch = data.global_batch_indices(len(x), BATCH, seed=0, iteration=iteration)
        with tf.GradientTape() as tape:
            loss = model.loss(y[batch], model(x[batch], training=True))
        optimizer.apply_gradients(
            zip(tape.gradient(loss, model.trainable_weights), model.trainable_weights, strict=True)
        )
    expected = np.concatenate([np.asarray(w).ravel() for w in model.get_weights()])
    error = np.abs(final_weights(services, run_id)[0] - expected).max() / np.abs(expected).max()
    print(f"\nan update of {len(parts)} stored parts: max|Δw|/max|w| = {error:.2e}")
    assert error <= TOLERANCE["sgd-momentum"]


def test_the_plan_splits_the_model_as_the_runs_start_did(local, services, staged, capsys, tmp_path: Path):
    """``slsml plan`` of the run's model, options and worker memory names the split its start stored."""
    config = RunConfig.model_validate(services.store.get_json(keys.run_config("staged")))
    demo.digits_cnn(seed=1).save(tmp_path / "cnn.keras")  # the model ``train`` starts the run with
    argv = ["--model", str(tmp_path / "cnn.keras"), "--pipeline-stages", str(STAGES), "--workers", str(WORKERS)]
    argv += ["--batch", str(BATCH), "--micro-batch", str(MICRO_BATCH), "--iterations", str(ITERATIONS)]
    assert main(["plan", *argv, "--memory", f"worker={local.worker_memory_mb}", "--json"]) == 0
    pipeline = json.loads(capsys.readouterr().out)["pipeline"]
    assert pipeline["deployed"] == list(config.stage_blocks or ()) and pipeline["merger"] is None


@pytest.mark.usefixtures("warm")  # the Worker times out after seconds here
def test_stages_held_back_past_the_deadline_are_relaunched_together_and_change_no_weight(local, services, staged):
    spec = SPEC.model_copy(update={"deadline_s": 8.0, "deadline_floor": 1.0, "deadline_retries": 2})
    # the first launch of iteration 1 (its three stages' messages) is held back past the deadline
    first_launch = r"Work\|run_id=staged-relaunch,iteration=1,worker=0(,attempt=0)?$"
    held_back = Faults(sns_delay=Delay(probability=1, seconds=10), sns_delay_match=first_launch)
    # a round's stages take about a second, three under load: its deadline and the Worker's timeout are eight
    with timeouts(local, 8), injecting(local, held_back):
        train(services, spec, "staged-relaunch")
        run = finish(services, "staged-relaunch")
    assert run.status == "COMPLETED", run.reason
    relaunched = [r for r in services.table.list_iterations("staged-relaunch") if r.relaunched]
    assert [(r.iteration, r.relaunched) for r in relaunched] == [(1, {0: 1})]
    for record in relaunched:  # each re-launched round's stages handed on under its new attempt
        attempt = record.relaunched[0]
        found = services.store.list_keys(keys.stages_prefix("staged-relaunch", record.iteration, 0, attempt))
        assert _stages(found, "staged-relaunch", record.iteration, attempt) == {"00", "01", "02"}, found
    assert np.array_equal(final_weights(services, "staged-relaunch")[0], staged)


@pytest.mark.usefixtures("warm")  # the Worker times out after seconds here
def test_stages_whose_worker_times_out_hand_each_pass_on_and_end_bit_identical(local, services, staged, tmp_path):
    """With the Worker's timeout below the time a round keeps for handing on (``progress.PAUSE_RESERVE_S``), each
    stage's invocation computes one pass (a micro-batch's forward or backward pass), stores its stage's progress and
    hands the rest of the round on to a fresh invocation; every message delivered twice, and an object placed
    beforehand at every key where the stages hand each other their outputs, gradients, parts (their records and
    values) and progress: each is replaced by the stage's own (``slsml.pipeline.signed``, ``ObjectStore.put_own``)."""
    assert HAND_ON_TIMEOUT_S < progress.PAUSE_RESERVE_S
    demo.digits_cnn(seed=1).save(tmp_path / "cnn.keras")  # the model ``train`` starts the run with
    spec = SPEC.model_copy(update={"deadline_s": 120.0})  # no stage waits so long: no round is re-launched
    passes = 2 * 5  # each of the five micro-batches' forward and backward passes; the last stage's backward alone
    # each stage's round handed on after each pass but the last: an invocation a pass
    done = {0: range(1, passes), 1: range(1, passes), 2: range(1, passes // 2)}
    placed = set()
    for i in range(ITERATIONS):
        placed |= {keys.stage_progress("staged-handed", i, 0, 0, s, d) for s, ds in done.items() for d in ds}
        placed |= {keys.handed("staged-handed", i, 0, 0, s, m, False) for s in (0, 1) for m in range(5)}
        placed |= {keys.handed("staged-handed", i, 0, 0, s, m, True) for s in (1, 2) for m in range(5)}
        placed |= {keys.stage_part("staged-handed", i, 0, 0, s) for s in (1, 2)}
        placed |= {keys.stage_values("staged-handed", i, 0, 0, s) for s in (0, 1, 2)}
    for key in placed:
        services.store.put_new(key, b"not the pipeline's")
    local.host.duplicate_deliveries = True
    try:
        with timeouts(local, HAND_ON_TIMEOUT_S):
            train(services, spec, "staged-handed")
            run = finish(services, "staged-handed")
    finally:
        local.host.duplicate_deliveries = False
    assert run.status == "COMPLETED", run.reason
    assert np.array_equal(final_weights(services, "staged-handed")[0], staged)
    records = services.table.list_iterations("staged-handed")
    assert len(records) == ITERATIONS and not any(r.relaunched for r in records)
    replaced = log_entries(local.log_dir / "worker.log", message="an object not written by its step was replaced")
    assert {entry["key"] for entry in replaced if "/staged-handed/" in entry["key"]} == placed
    for iteration in range(ITERATIONS):
        prefix = keys.stages_prefix("staged-handed", iteration, 0, 0)
        stored = [k.removeprefix(prefix) for k in services.store.list_keys(prefix) if "/progress/" in k]
        handed = {(int(k[:2]), int(k.rsplit("/", 1)[1].removesuffix(".npz"))) for k in stored}
        # handed on after each pass but the last: an invocation a pass
        assert handed == {(s, d) for s, ds in done.items() for d in ds}, sorted(handed)
    # the plan of the same stages and timeout hands as many rounds on
    figures = from_keras_file(tmp_path / "cnn.keras", batch=32, measure=False, parameters=Parameters())
    figures |= {"compute_per_sample_s": 1e-4, "compute_source": "a pass well within the timeout"}
    work = run_workload(figures, spec).at(
        timeout_s={**function_timeouts(), "worker": HAND_ON_TIMEOUT_S},
        memory_mb={**function_memory(), "worker": local.worker_memory_mb},
    )
    model = modelio.load_model((tmp_path / "cnn.keras").read_bytes())
    pipeline = stages.plan(work, Parameters(), prices.PriceTable(), stages.blocks_of(model), STAGES, HAND_ON_TIMEOUT_S)
    assert pipeline.hand_ons.handed_on == len(handed)


@pytest.mark.usefixtures("warm")  # the Worker times out after seconds here
def test_stages_handing_their_rounds_on_under_faults_end_bit_identical(local, services, staged):
    """Each pass an invocation, as above, with duplicated messages, Worker invocations that crash on their first
    receive (and are retried) and slow reads."""
    spec = SPEC.model_copy(update={"deadline_s": 120.0})
    faults = Faults.parse("seed=6,duplicate=0.5,worker_crash=0.25,s3_get_delay=0.2:0.3")
    with timeouts(local, HAND_ON_TIMEOUT_S), injecting(local, faults) as report:
        train(services, spec, "staged-handed-faults")
        run = finish(services, "staged-handed-faults")
    print(f"faults: {report}")
    assert run.status == "COMPLETED", run.reason
    assert report["injected"]["worker_crash"] > 0 and report["retries"] >= report["injected"]["worker_crash"]
    assert np.array_equal(final_weights(services, "staged-handed-faults")[0], staged)
