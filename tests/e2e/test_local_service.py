"""The local cloud as a service that stays up, driven as a user would: `slsml local up` (its Reducer sized by
`--memory`, its Worker's timeout set by `--function-timeout`, which `slsml plan` and its runs' deadlines keep to), the
AWS CLI dropping a model into incoming/ (and refused an overwrite of what the run stored), `slsml run list`, `run watch`
to COMPLETED, `run stop` and `run resume` on a local run, `local down`. Every command is its own process, as in a
terminal."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import keras
import numpy as np
import pytest

import slsml as slsml_api
from slsml.client import demo
from slsml.local import service as service_module
from slsml.spec import keys
from slsml.spec.errors import NotFoundError
from slsml.state.runtable import RunTable
from slsml.training import modelio

from .service import Held, last_json, local_service, service_env, service_store, service_table, slsml

LIMIT_WORKERS = 8  # the service's limit on any run's workers (the tests' runs ask for at most 4)
REDUCER_MB = 2048  # the service's Reducer memory (the deployment's: 1769 MB)
WORKER_TIMEOUT_S = 300  # the service's Worker timeout (the deployment's: 120 s), the shortest deadline of its runs
DEADLINE = ["--deadline", str(WORKER_TIMEOUT_S)]
# few enough that its resume ends soon (it is stopped at its second iteration, its Worker's messages held meanwhile)
STOP_ME_ITERATIONS = 40
# until it is stopped, each round of the run waits this long in its Worker's queue: `run start` returns long before the
# run could end (on a loaded machine, the command returned once all 40 rounds had run)
PACE_S = 2
AWS_CLI = os.environ.get("SLSML_AWS_CLI", str(Path(__file__).parents[2] / ".venv-awscli" / "bin" / "aws"))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    """`slsml local up` in a folder of its own; `local down` at the end (and the test checks it)."""
    home = tmp_path_factory.mktemp("service")
    x, y, x_test, y_test = demo.digits()
    np.savez(home / "digits.npz", x=x, y=y, x_test=x_test, y_test=y_test)
    (home / "cnn.keras").write_bytes(modelio.save_model(demo.digits_cnn(seed=1)))
    sizes = ["--memory", f"reducer={REDUCER_MB}", "--function-timeout", f"worker={WORKER_TIMEOUT_S}"]
    with local_service(home, "--limit-workers", str(LIMIT_WORKERS), *sizes) as state:
        assert state["pool"] == 2
        yield home


def test_a_model_dropped_by_the_aws_cli_trains_and_is_watched_to_the_end(service: Path) -> None:
    env = service_env(service)
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    put = slsml(service, "data", "put", "digits", "digits.npz")
    assert put.returncode == 0, put.stderr
    request = service / "cnn.json"
    request.write_text(
        json.dumps(
            {
                "dataset": "digits",
                "training": {
                    "iterations": 6,
                    "eval_every": 3,
                    "workers": 3,
                    "reducers": 2,
                    "deadline_s": WORKER_TIMEOUT_S,
                },
            }
        )
    )
    aws = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **env}
    bucket = f"s3://{env['SLSML_BUCKET']}/incoming/"
    for path in (request, service / "cnn.keras"):  # the request first: the model's upload starts the run
        copied = subprocess.run(
            [AWS_CLI, "s3", "cp", str(path), bucket], capture_output=True, text=True, env=aws, timeout=120
        )
        assert copied.returncode == 0, copied.stderr
    run_id = f"cnn-{hashlib.sha256((service / 'cnn.keras').read_bytes() + request.read_bytes()).hexdigest()[:8]}"
    deadline = time.monotonic() + 180  # the RunStarter loads the model and checks it against the data first
    while run_id not in slsml(service, "run", "list").stdout:
        assert time.monotonic() < deadline, f"{run_id} never appeared in `slsml run list`"
        time.sleep(2)

    watched = slsml(service, "run", "watch", run_id, "--json", "--timeout", "300")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    summary = last_json(watched)
    assert (summary["run_id"], summary["status"], summary["iterations"]) == (run_id, "COMPLETED", 6)
    assert summary["workers"] == 3 and summary["test_accuracy"] > 0.3
    # the run wrote create-only, as the bucket's policy demands; an overwrite by the AWS CLI is refused, as S3 would
    config = f"runs/{run_id}/run.json"
    overwrite = subprocess.run(
        [AWS_CLI, "s3", "cp", str(request), f"s3://{env['SLSML_BUCKET']}/{config}"],
        capture_output=True,
        text=True,
        env=aws,
        timeout=120,
    )
    assert overwrite.returncode != 0 and "AccessDenied" in overwrite.stderr, overwrite.stderr
    assert json.loads(service_store(service).get(config))["run_id"] == run_id
    progress = [line for line in watched.stderr.splitlines() if line.startswith(f"{run_id} 6/6  ")]
    assert progress and re.search(r"  loss [\d.]+  accuracy [\d.]+  test_accuracy [\d.]+  ", progress[-1]), (
        watched.stderr
    )  # the figures as Keras names them, in a pipe
    assert re.search(r"test_loss\s*│ [\d.]+\s*│", watched.stderr) and re.search(
        r"test_accuracy\s*│ [\d.]+\s*│", watched.stderr
    ), watched.stderr
    report = slsml(service, "run", "report", run_id, "--json")  # where a run's files go: runs/<run>/
    assert report.returncode == 0, report.stderr
    written = Path("runs") / run_id / "report"
    assert json.loads(report.stdout) == {"run_id": run_id, "report": str(written / "index.html")}
    page = (service / written / "index.html").read_text()
    assert run_id in page and "COMPLETED" in page
    assert all((service / written / image).stat().st_size > 0 for image in ("curves.png", "cost.png"))
    reducer_log = (service_module.user_state_dir() / "logs" / "reducer.log").read_text()  # the Reducer's size
    started = [json.loads(line) for line in reducer_log.splitlines() if "warm process started" in line]
    assert started and {entry["function_memory_size"] for entry in started} == {REDUCER_MB}
    reports = re.findall(r"^REPORT RequestId: .*\tMemory Size: (\d+) MB\tMax Memory Used: (\d+) MB$", reducer_log, re.M)
    assert reports and all(int(size) == REDUCER_MB > int(used) for size, used in reports)


def _put_digits(service: Path) -> None:
    """Dataset ``digits`` on the service, unless an earlier test of the file put it."""
    listed = slsml(service, "data", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    if "digits" not in {summary["name"] for summary in json.loads(listed.stdout)}:
        put = slsml(service, "data", "put", "digits", "digits.npz")
        assert put.returncode == 0, put.stderr


def _iteration(table: RunTable, run_id: str) -> int:
    """The iteration the run is in; 0 until it is registered."""
    try:
        return table.get_run(run_id).iteration
    except NotFoundError:
        return 0


def _status(cwd: Path, run_id: str) -> dict:
    """`slsml run status RUN --json`, read."""
    return last_json(slsml(cwd, "run", "status", run_id, "--json"))


def test_a_local_run_stops_resumes_and_is_scaled(service: Path) -> None:
    # the run is paced from its start, watched in the service's table, and stopped with its Worker's messages held in
    # their queue (clients made first: a command takes seconds to start on a loaded machine, in which the run would
    # run to its end)
    env = service_env(service)
    _put_digits(service)
    table, paced, hold = service_table(service), Held(env, "worker", PACE_S), Held(env, "worker")
    with paced:
        started = slsml(
            service,
            "run",
            "start",
            "--local",
            "--model",
            "cnn.keras",
            "--data",
            "digits",
            "--iterations",
            str(STOP_ME_ITERATIONS),
            "--eval-every",
            "0",
            "--run-id",
            "stop-me",
            "--no-wait",
            "--workers",
            "2",
            "--max-workers",
            "4",
            *DEADLINE,
        )
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == "stop-me"
        # two iterations complete: the run resumes past its first, with 2 workers
        deadline = time.monotonic() + 120
        while _iteration(table, "stop-me") < 2:
            assert time.monotonic() < deadline, "run stop-me completed no iteration"
            time.sleep(0.05)
        with hold:  # the run's next rounds wait in their queue: it cannot end before the stop lands
            stopped = slsml(service, "run", "stop", "stop-me", "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout) == {"run_id": "stop-me", "status": "STOPPED"}
    status = _status(service, "stop-me")
    assert status["status"] == "STOPPED" and status["training"]["eval_every"] == 0  # the flag, not the default
    scaled = slsml(service, "run", "scale", "stop-me", "--workers", "4", "--json")  # the stopped run, for its resume
    assert scaled.returncode == 0, scaled.stderr
    assert (json.loads(scaled.stdout)["workers"], json.loads(scaled.stdout)["was"]) == (4, 2)
    assert "run stop-me: 4 workers from the first iteration it runs once resumed (it is STOPPED) (was 2)" in (
        scaled.stderr
    ), scaled.stderr
    resumed = slsml(service, "run", "resume", "stop-me", "--json")
    assert resumed.returncode == 0, resumed.stderr
    entering = re.search(r"resumed from its model entering iteration (\d+)", resumed.stderr)
    assert entering, resumed.stdout + resumed.stderr
    assert json.loads(resumed.stdout)["iteration"] == int(entering[1])
    watched = slsml(service, "run", "watch", "stop-me", "--json", "--timeout", "300")
    summary = last_json(watched)
    assert (summary["status"], summary["iterations"]) == ("COMPLETED", STOP_ME_ITERATIONS)
    assert summary["training"] == status["training"]  # a resumed run goes on with the spec it started with
    first, changed = summary["fleet"]  # the iterations from the resume on trained with 4 workers, and say why
    assert (first["workers"], changed["workers"], changed["reason"]) == (2, 4, "run scale"), summary["fleet"]
    assert changed["iteration"] == int(entering[1])
    assert re.search(rf"workers\s*│ 2 → 4 at iteration {changed['iteration']} \(run scale\)", watched.stderr)
    finished = slsml(service, "run", "scale", "stop-me", "--workers", "3")
    assert finished.returncode == 2 and "is COMPLETED: only a RUNNING, STOPPED or FAILED run can be scaled" in (
        finished.stderr
    )
    fetched = slsml(service, "run", "fetch", "stop-me", "--out", "stopped.keras", "--json")
    assert fetched.returncode == 0, fetched.stderr
    assert json.loads(fetched.stdout)["bytes"] == (service / "stopped.keras").stat().st_size
    assert modelio.load_model((service / "stopped.keras").read_bytes()).count_params() > 0


def test_a_checkpoint_is_fetched_by_its_iteration_and_starts_a_new_run(service: Path) -> None:
    common = ["--data", "digits.npz", "--eval-every", "0", "--workers", "2", "--json", *DEADLINE]
    saving = slsml(service, "run", "start", "--local", "--model", "cnn.keras", "--iterations", "4", *common,
                   "--checkpoint-every", "2", "--run-id", "checkpointed")  # fmt: skip
    assert last_json(saving)["status"] == "COMPLETED"
    fetched = slsml(service, "run", "fetch", "checkpointed", "--iteration", "2", "--out", "at-2.keras", "--json")
    assert last_json(fetched)["bytes"] == (service / "at-2.keras").stat().st_size
    checkpoint = modelio.load_model((service / "at-2.keras").read_bytes()).get_weights()
    initial = modelio.load_model((service / "cnn.keras").read_bytes()).get_weights()
    assert not all(np.array_equal(a, b) for a, b in zip(checkpoint, initial, strict=True))  # two iterations on
    unsaved = slsml(service, "run", "fetch", "checkpointed", "--iteration", "3")
    assert unsaved.returncode == 2, unsaved.stderr
    assert "saved no model entering iteration 3; it saved those entering 0, 2" in unsaved.stderr, unsaved.stderr
    resumed = slsml(service, "run", "start", "--local", "--model", "at-2.keras", "--iterations", "2", *common,
                    "--run-id", "from-checkpoint")  # fmt: skip
    assert last_json(resumed)["status"] == "COMPLETED"
    # a checkpoint replaced behind the pipeline's back is refused by its SHA-256, which the Merger recorded
    store, initial_bytes = service_store(service), (service / "cnn.keras").read_bytes()
    store.s3.put_object(Bucket=store.bucket, Key=keys.model("checkpointed", 2), Body=initial_bytes)
    replaced = slsml(service, "run", "fetch", "checkpointed", "--iteration", "2", "--out", "forged.keras")
    assert replaced.returncode != 0 and not (service / "forged.keras").exists()
    read = hashlib.sha256(initial_bytes).hexdigest()
    assert f"is not the model run 'checkpointed' saved: its bytes as read have the SHA-256 {read}" in replaced.stderr
    assert slsml(service, "run", "fetch", "checkpointed", "--iteration", "0", "--out", "at-0.keras").returncode == 0


def test_a_run_beyond_the_services_limits_is_refused_and_a_dropped_one_fails_with_the_reason(service: Path) -> None:
    over = f"{LIMIT_WORKERS + 4} workers, over the deployment's limit workers={LIMIT_WORKERS}"
    _put_digits(service)
    refused = slsml(
        service,
        "run",
        "start",
        "--local",
        "--model",
        "cnn.keras",
        "--data",
        "digits",
        "--workers",
        str(LIMIT_WORKERS + 4),
        "--iterations",
        "2",
        "--run-id",
        "too-wide",
        "--no-wait",
        *DEADLINE,
    )
    assert refused.returncode == 2 and over in refused.stderr, refused.stderr
    assert "too-wide" not in dict(_listed(service))  # refused before anything was stored
    # a model dropped with a request beyond the limit (no CLI to refuse it): the pipeline fails its run
    store = service_store(service)
    model = modelio.save_model(demo.digits_cnn(seed=11))
    request = {
        "dataset": "digits",
        "training": {"workers": LIMIT_WORKERS + 4, "iterations": 2, "deadline_s": WORKER_TIMEOUT_S},
    }
    body = json.dumps(request).encode()
    store.s3.put_object(Bucket=store.bucket, Key="incoming/wide.json", Body=body)
    store.s3.put_object(Bucket=store.bucket, Key="incoming/wide.keras", Body=model)
    run_id, table = f"wide-{hashlib.sha256(model + body).hexdigest()[:8]}", service_table(service)
    deadline = time.monotonic() + 180
    while (status := _run_status(table, run_id)) in {None, "RUNNING"}:
        assert time.monotonic() < deadline, f"{run_id} did not end ({status})"
        time.sleep(0.5)
    failed = table.get_run(run_id)
    assert (failed.status, failed.reason) == ("FAILED", f"the run asks for {over}")
    assert table.get_counter(run_id, 0).workers is None  # refused before any worker was launched


def _plan(cwd: Path) -> dict:
    """`slsml plan --json` in ``cwd`` of a run whose rounds (8 local steps of 32 s) outlast a default Worker."""
    planned = slsml(cwd, "plan", "--workers", "1", "--iterations", "2", "--params", "100000", "--samples", "60000",
                    "--compute-per-sample", "0.5", "--batch", "64", "--algorithm", "average", "--local-steps", "8",
                    *DEADLINE, "--json")  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    return last_json(planned)


def test_plan_and_runs_keep_to_the_services_function_timeouts(service: Path, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patched:  # a user with no service up: a default deployment's
        patched.setenv(service_module.STATE_HOME_ENV, str(tmp_path))
        default = _plan(tmp_path)
    local = _plan(service)
    assert (default["workload"]["timeout_s"]["worker"], local["workload"]["timeout_s"]["worker"]) == (120, 300)
    assert local["workload"]["timeout_s"]["reducer"] == default["workload"]["timeout_s"]["reducer"]
    # a round of 256 s: handed on once (two invocations of 4 steps) within 120 s, in one invocation within 300 s
    handed = [(plan["continuations"]["invocations"], plan["continuations"]["timeout_s"]) for plan in (default, local)]
    assert handed == [(2, 120), (1, 300)]
    assert local["requests_per_iteration"] != default["requests_per_iteration"]
    short = slsml(service, "run", "start", "--local", "--model", "cnn.keras", "--data", "digits", "--iterations",
                  "2", "--deadline", "200", "--run-id", "too-short", "--no-wait")  # fmt: skip
    assert short.returncode == 2, short.stderr
    assert "a deadline of 200 s (deadline_s, --deadline) is shorter than the worker function's 300 s timeout" in (
        short.stderr
    )
    for command in (["local", "up"], ["run", "start", "--local"]):
        bad = slsml(service, *command, "--function-timeout", "worker=901")
        assert bad.returncode == 2 and (
            "argument --function-timeout: functions.worker.timeout_s=901: Input should be less than or equal to 900;"
            in bad.stderr.strip().splitlines()[-1]
        ), bad.stderr


def test_faults_for_a_run_on_the_service_are_refused_in_one_line_saying_what_to_do(service: Path) -> None:
    refused = slsml(service, "run", "start", "--local", "--model", "cnn.keras", "--data", "digits", "--iterations",
                    "2", "--faults", "worker_crash=0.5", "--run-id", "faulty", "--no-wait")  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "error: --faults worker_crash=0.5: faults are injected into a one-shot local run only, and the local service"
        " is up (the run would go to it, which injects none): stop it (`slsml local down`) to run on a cloud of its"
        " own with --faults, or leave --faults out"
    ]
    assert "faulty" not in slsml(service, "run", "list").stdout
    sized = slsml(service, "run", "start", "--local", "--model", "cnn.keras", "--data", "digits", "--iterations",
                  "2", "--memory", "worker=4096", "--run-id", "sized", "--no-wait")  # fmt: skip
    assert sized.returncode == 2 and sized.stderr.strip().splitlines() == [
        "error: --memory worker=4096: it sets a one-shot local run's own cloud, and the local service is up (the run"
        " would go to it, which runs as `slsml local up` set it): give --memory to `slsml local up`, or leave it out"
    ], sized.stderr


def test_the_service_is_found_from_any_folder_and_a_run_given_no_target_goes_to_it(
    service: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"  # no state of slsml's here or above it: the service is the user's
    elsewhere.mkdir()
    for name in ("cnn.keras", "digits.npz"):
        (elsewhere / name).write_bytes((service / name).read_bytes())
    status = slsml(elsewhere, "local", "status")
    assert status.returncode == 0, status.stderr
    assert f"state in {service_module.user_state_dir()}, logs in" in status.stdout, status.stdout
    put = slsml(elsewhere, "data", "put", "digits-elsewhere", "digits.npz", "--json")
    assert put.returncode == 0, put.stderr
    assert "digits-elsewhere" in slsml(service, "data", "list", "--json").stdout  # seen from where it started
    started = slsml(elsewhere, "run", "start", "--model", "cnn.keras", "--data", "digits-elsewhere", "--iterations",
                    "1", "--workers", "1", "--run-id", "no-target", "--no-wait", *DEADLINE)  # fmt: skip
    assert started.returncode == 0, started.stderr
    endpoint = service_env(service)["AWS_ENDPOINT_URL"]
    said = [line for line in started.stderr.splitlines() if "local service" in line]  # beside TensorFlow's own
    assert said == [f"running on the local service at {endpoint} (neither --local nor --stack given)"], started.stderr
    assert started.stdout.strip() == "no-target"
    assert "no-target" in dict(_listed(elsewhere)) and "no-target" in dict(_listed(service))


def test_fit_trains_on_the_service_that_is_up_and_leaves_the_callers_clients_as_they_were(
    service: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    x, y, _, _ = demo.digits()
    model = keras.Sequential([keras.Input(x.shape[1:]), keras.layers.Flatten(), keras.layers.Dense(10, "softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    before = {name: os.environ.get(name) for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID")}
    listed = dict(_listed(service))
    history = slsml_api.fit(model, x, y, batch_size=256, epochs=1, verbose=2, workers=2, deadline_s=WORKER_TIMEOUT_S)
    assert {name: os.environ.get(name) for name in before} == before
    endpoint = service_env(service)["AWS_ENDPOINT_URL"]
    said = [line for line in capfd.readouterr().err.splitlines() if "local service" in line]
    assert said == [f"running on the local service at {endpoint} (no stack given)"]
    trained = {run: status for run, status in _listed(service) if run not in listed}
    assert list(trained.values()) == ["COMPLETED"] and next(iter(trained)).startswith("fit-"), trained
    assert len(history.history["loss"]) == 1


def _run_status(table: RunTable, run_id: str) -> str | None:
    try:
        return table.get_run(run_id).status
    except NotFoundError:
        return None


def _listed(cwd: Path) -> list[tuple[str, str]]:
    """`slsml run list --json`: each run's id and status, in the order listed."""
    listed = slsml(cwd, "run", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return [(summary["run_id"], summary["status"]) for summary in json.loads(listed.stdout)]


def test_local_down_ends_the_service_and_its_runs_stay_listed(service: Path) -> None:
    assert slsml(service, "local", "status").returncode == 0
    listed = _listed(service)
    assert {run_id for run_id, _ in listed} >= {"stop-me"} and len(listed) >= 2
    down = slsml(service, "local", "down", "--json")
    result = json.loads(down.stdout)  # every run of the service, those not recorded yet recorded now
    assert result["stopped"] and result["runs"] == len(listed) >= result["recorded"]  # watched runs record themselves
    said = f"local service stopped; its {len(listed)} runs recorded under runs/ ({result['recorded']} now"
    assert said in down.stderr
    assert slsml(service, "local", "status").returncode == 1
    assert _listed(service) == listed  # recorded under runs/, in the same order
    fetched = slsml(service, "run", "fetch", "stop-me", "--out", "after-down.keras")
    assert fetched.returncode == 0, fetched.stderr
    assert (service / "after-down.keras").read_bytes() == (service / "stopped.keras").read_bytes()
    listing = slsml(service, "run", "stop", "stop-me")
    assert listing.returncode == 2 and "no local service is up" in listing.stderr
