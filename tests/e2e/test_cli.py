"""The ``slsml`` command as a user runs it (a fresh process, its own embedded cloud)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from slsml.cli import display
from slsml.client import demo
from slsml.training import modelio
from tests import archives
from tests.processes import left_running

REQUIRED = {
    "run_id",
    "status",
    "iterations",
    "workers",
    "reducers",
    "quorum",
    "test_accuracy",
    "wall_s",
    "median_iteration_s",
    "requests_per_iteration",
    "gb_seconds",
    "cost_usd",
    "cost_per_iteration_usd",
    "cost_by_service_usd",
}


def slsml(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slsml.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200"},
    )  # table rows on one line each


def test_run_start_trains_a_users_model_and_status_fetch_read_it(tmp_path: Path) -> None:
    x, y, x_test, y_test = demo.digits()
    np.savez(tmp_path / "my_digits.npz", x=x, y=y, x_test=x_test, y_test=y_test)
    (tmp_path / "model.keras").write_bytes(modelio.save_model(demo.digits_cnn()))

    done = slsml(
        "run",
        "start",
        "--local",
        "--model",
        "model.keras",
        "--data",
        "my_digits.npz",
        "--workers",
        "2",
        "--reducers",
        "1",
        "--iterations",
        "4",
        "--deadline-floor",
        "0.7",
        "--run-id",
        "cli-run",
        "--out",
        "trained.keras",
        "--json",
        "--faults",
        "seed=1,duplicate=0.5,worker_crash=0.3",
        "--report",
        "report",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    page = (tmp_path / "report" / "index.html").read_text()  # --report: the page shows the same summary
    assert json.loads(re.search(r'id="summary-json">(.*?)</script>', page).group(1)) == summary
    assert f"report: {Path('report') / 'index.html'}" in done.stderr
    assert summary.keys() >= REQUIRED
    assert (summary["run_id"], summary["status"], summary["iterations"]) == ("cli-run", "COMPLETED", 4)
    assert summary["training"]["deadline_floor"] == 0.7 and summary["training"]["iterations"] == 4
    assert 0 <= summary["test_accuracy"] <= 1 and summary["median_iteration_s"] > 0
    injected = {kind: n for kind, n in summary["faults"]["injected"].items() if n}
    assert injected.keys() == {"duplicate", "worker_crash"}, summary["faults"]
    table = done.stderr  # the summary a person reads says the same
    assert re.search(r"options\s*│ deadline_floor 0\.7\s*│", table), table
    assert "faults injected" in table and ", ".join(f"{k} {n}" for k, n in injected.items()) in table, table
    assert f"{summary['faults']['failed_invocations']} failed invocations" in table, table
    requests = summary["requests_per_iteration"]  # counted by the functions, priced (slsml.accounting.usage)
    assert requests["s3:PutObject"] >= 3 and requests["sns:PublishBatch"] >= 3 and requests["dynamodb:UpdateItem"] > 0
    assert summary["gb_seconds"] > 0 and 0 < summary["cost_per_iteration_usd"] < summary["cost_usd"]
    assert summary["cost_by_service_usd"].keys() >= {"lambda", "s3", "sns", "dynamodb"}
    s3 = ", ".join(f"{op.split(':')[1]} {n:g}" for op, n in requests.items() if op.startswith("s3:") and n)
    assert f"s3: {s3}" in table, table
    dollars = display.dollars
    assert f"{dollars(summary['cost_usd'])} in all, {dollars(summary['cost_per_iteration_usd'])}" in table
    assert modelio.load_model((tmp_path / "trained.keras").read_bytes()).count_params() > 0
    kept = [tmp_path / "runs", tmp_path / "runs" / "cli-run", tmp_path / ".slsml" / "logs" / "cli-run"]
    files = [path for folder in kept[1:] for path in folder.iterdir()]
    modes = {str(path.relative_to(tmp_path)): stat.S_IMODE(path.stat().st_mode) for path in kept + files}
    assert modes == {  # the run's record and its functions' logs are its user's alone, as its local cloud was
        **{str(path.relative_to(tmp_path)): 0o700 for path in kept},
        **{str(path.relative_to(tmp_path)): 0o600 for path in files},
    }
    assert "runs/cli-run/summary.json" in modes and ".slsml/logs/cli-run/worker.log" in modes, modes

    status = slsml("run", "status", "cli-run", "--json", cwd=tmp_path)
    assert status.returncode == 0 and json.loads(status.stdout.strip().splitlines()[-1]) == summary
    fetched = slsml("run", "fetch", "cli-run", "--out", "copy.keras", cwd=tmp_path)
    assert fetched.returncode == 0
    assert (tmp_path / "copy.keras").read_bytes() == (tmp_path / "trained.keras").read_bytes()


def test_cli_errors_name_the_problem(tmp_path: Path) -> None:
    (tmp_path / "model.keras").write_bytes(b"not a model")
    np.savez(tmp_path / "d.npz", x=np.zeros((10, 8, 8, 1), np.float32), y=np.zeros(10, np.int64))
    bad_model = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slsml.cli.main",
            "run",
            "start",
            "--local",
            "--model",
            "model.keras",
            "--data",
            "d.npz",
            "--iterations",
            "1",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its process group: the command and every process it starts
    _, stderr = bad_model.communicate(timeout=600)
    assert bad_model.returncode == 2
    assert "model.keras is not a Keras model" in stderr
    assert left_running(bad_model.pid) == []  # nor the cloud and fork server it began while the model loaded
    unknown = slsml("run", "status", "no-such-run", cwd=tmp_path)
    assert unknown.returncode == 2 and "no run named 'no-such-run'" in unknown.stderr


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (archives.bomb(4_000_000_000), "model.keras expands to 4,000,00"),
        (archives.declaring(30_000), "model.keras declares 3,600,360,008 bytes of weights"),
    ],
)
def test_run_start_refuses_a_model_too_large_for_the_worker(tmp_path: Path, model: bytes, reason: str) -> None:
    (tmp_path / "model.keras").write_bytes(model)
    np.savez(tmp_path / "d.npz", x=np.zeros((10, 7), np.float32), y=np.zeros((10, 2), np.float32))
    refused = slsml(
        "run", "start", "--local", "--model", "model.keras", "--data", "d.npz", "--iterations", "1", cwd=tmp_path
    )
    assert refused.returncode == 2 and reason in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz", "model.keras"]  # nothing stored


def test_data_put_uploads_shards_and_a_manifest(tmp_path: Path, local, services) -> None:
    import os

    from slsml.data import datasets as data

    x = np.arange(50 * 3, dtype=np.float32).reshape(50, 3)
    y = np.arange(50) % 4
    np.savez(tmp_path / "small.npz", x=x, y=y)
    env = {**os.environ, **local.deployment.environment()}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "slsml.cli.main",
            "data",
            "put",
            "small",
            "small.npz",
            "--bucket",
            local.deployment.bucket,
            "--shard-mb",
            str(16 * 20 / 2**20),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "40 train, 10 test" in done.stdout
    manifest = data.load_manifest(services.store, "small")
    assert (manifest.train.count, manifest.test.count, len(manifest.train.shards), manifest.classes) == (40, 10, 3, 4)
    assert manifest.shard_records == 16  # records of 12 + 8 bytes
    x_train, _y_train = data.DatasetReader(services.store, manifest).split("train")
    assert {tuple(row) for row in x_train} <= {tuple(row) for row in x}
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "slsml.cli.main",
            "data",
            "put",
            "small",
            "small.npz",
            "--bucket",
            local.deployment.bucket,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "dataset 'small' already exists" in again.stderr
