"""`slsml run scale` against the local service (`slsml local up`), through the command's entry point: a run
started at 2 workers is scaled to 8 while it trains, its next iterations are launched with 8, its summary shows
the change, and scaling out of bounds or a finished run is refused and changes nothing."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from slsml import cli, demo, modelio
from slsml.local import service

ITERATIONS = 10


def test_a_run_scaled_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # the service's state, its logs and runs/ go here
    monkeypatch.setenv("COLUMNS", "200")
    x, y, x_test, y_test = demo.digits()
    np.savez(tmp_path / "digits.npz", x=x, y=y, x_test=x_test, y_test=y_test)
    (tmp_path / "cnn.keras").write_bytes(modelio.save_model(demo.digits_cnn(seed=1)))
    assert cli.main(["local", "up", "--pool", "2"]) == 0
    try:
        for name in service.environment(service.status()):  # the commands point this process's AWS clients at
            monkeypatch.setenv(name, os.environ.get(name, ""))  # the service: the test's end puts them back
        _scale_a_run(capsys)
    finally:
        cli.main(["local", "down"])


def _scale_a_run(capsys: pytest.CaptureFixture[str]) -> None:
    started = cli.main(["run", "start", "--local", "--model", "cnn.keras", "--data", "digits.npz", "--workers", "2",
                        "--max-workers", "8", "--iterations", str(ITERATIONS), "--eval-every", "0", "--run-id",
                        "scale-me", "--no-wait"])
    assert started == 0, capsys.readouterr().err
    capsys.readouterr()
    _, services = service.connect()
    deadline = time.monotonic() + 120
    while services.table.get_run("scale-me").iteration < 1:  # scaled while it trains, after its first iteration
        assert time.monotonic() < deadline, "the run did not get past its first iteration"
        time.sleep(0.05)
    assert cli.main(["run", "scale", "scale-me", "--workers", "8"]) == 0
    said = capsys.readouterr().err
    told = re.search(r"run scale-me: 8 workers from (?:iteration (\d+) on|the next iteration launched on \((\d+) at"
                     r" the earliest\)) \(was 2\)", said)
    assert told, said
    assert services.table.get_run("scale-me").workers == 8

    assert cli.main(["run", "scale", "scale-me", "--workers", "9"]) == 2
    assert "error: 9 workers lie outside run 'scale-me''s bounds of 1 to 8" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        cli.main(["run", "scale", "scale-me", "--workers", "0"])
    assert "argument --workers: 0: a run trains with at least 1 worker" in capsys.readouterr().err
    assert services.table.get_run("scale-me").workers == 8

    assert cli.main(["run", "watch", "scale-me", "--json", "--timeout", "300"]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["status"] == "COMPLETED", summary["reason"]
    fleet = [services.table.get_counter("scale-me", i).workers for i in range(ITERATIONS)]
    with capsys.disabled():
        print(f"\n{said.strip()}\nworkers by iteration: {fleet}")
    first = fleet.index(8)
    if told[1] is not None:  # the command said which iteration
        assert first == int(told[1]), fleet
    else:
        assert first in {int(told[2]), int(told[2]) + 1}, fleet
    assert fleet == [2] * first + [8] * (ITERATIONS - first), fleet
    assert summary["fleet"] == [{"iteration": 0, "workers": 2, "reason": None},
                                {"iteration": first, "workers": 8, "reason": "run scale"}]
    assert re.search(rf"│ workers\s*│ 2 → 8 at iteration {first} \(run scale\)\s*│", err), err

    assert cli.main(["run", "scale", "scale-me", "--workers", "4"]) == 2
    assert "error: run 'scale-me' is COMPLETED: only a RUNNING run can be scaled" in capsys.readouterr().err
    assert services.table.get_run("scale-me").workers == 8
    assert cli.main(["run", "scale", "no-such-run", "--workers", "4"]) == 2
    assert "error: no run named 'no-such-run'" in capsys.readouterr().err
