"""The local host's warm processes behave like Lambda's containers: one killed outright (out of memory, a
segfault) is replaced by a fresh one and the message it held is retried, while its function's other invocations
run on; an invocation that runs past its function's timeout is ended there and retried. A run that meets both
completes with weights bit-identical to an undisturbed run's."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np

from slsml.local.faults import Delay, Faults
from slsml.spec.config import TrainingSpec
from slsml.spec.limits import RunLimits

from .conftest import final_weights, finish, train

RUN, REFERENCE = "contained", "contained-reference"
SPEC = TrainingSpec(workers=2, reducers=2, global_batch=64, iterations=4, eval_every=0)
TIMEOUT_S = 2  # the Worker's, for this test: every Worker's first receive hangs past it
HANG = Faults(worker_hang=1.0, hang_s=600)  # ten minutes, if nothing ended it


def _warm_pids(local, function: str) -> list[int]:
    """The processes ``function`` started so far, in the order they started, as its log says."""
    lines = (local.log_dir / f"{function}.log").read_text().splitlines()
    return [
        entry["pid"]
        for line in lines
        if line.startswith("{")
        if (entry := json.loads(line)).get("message") == "warm process started"
    ]


def test_a_killed_warm_process_and_a_step_past_its_timeout_change_nothing(local, services, digits):
    train(services, SPEC, REFERENCE)
    assert finish(services, REFERENCE).status == "COMPLETED"
    report_before = local.host.fault_report()
    limits = RunLimits(function_timeouts_s={**RunLimits().function_timeouts_s, "worker": TIMEOUT_S})
    local.host.faults = HANG
    try:
        with local.limited(limits):
            train(services, SPEC, RUN)
            deadline = time.monotonic() + 120
            while services.table.get_run(RUN).iteration < 1:
                assert time.monotonic() < deadline, "the run never completed an iteration"
                time.sleep(0.05)
            started = set(_warm_pids(local, "reducer"))
            os.kill(min(started), signal.SIGKILL)  # as the out-of-memory killer would
            run = finish(services, RUN)
    finally:
        local.host.faults = None
    assert run.status == "COMPLETED", run.reason
    report = local.host.fault_report()
    assert report["replaced_processes"] > report_before["replaced_processes"]
    timed_out = f"worker: Task timed out after {TIMEOUT_S:.2f} seconds"
    assert report["errors"].get(timed_out, 0) >= SPEC.workers * SPEC.iterations, report["errors"]
    assert set(_warm_pids(local, "reducer")) - started  # fresh processes took the killed one's place
    attacked, _ = final_weights(services, RUN)
    undisturbed, _ = final_weights(services, REFERENCE)
    assert np.array_equal(attacked, undisturbed)


TWO_RUN = "contained-two"
TWO = TrainingSpec(workers=2, reducers=1, global_batch=64, iterations=1, eval_every=0)
LOADING_S = 6  # a fresh Worker process's read of the run's model is held back this long: both Workers are in flight
DIED = "worker: Runtime exited: a warm process of worker died"


def test_a_killed_container_ends_its_own_invocation_alone(local, services, digits):
    """Two Worker invocations run at once, each in a fresh container; one's process is killed: the other completes
    on its first try, and the killed one's message is retried in a fresh process."""
    replaced_before = local.host.fault_report()["replaced_processes"]
    local.host.faults = Faults(
        s3_get_delay=Delay(probability=1.0, seconds=LOADING_S), s3_get_delay_match=rf"^runs/{TWO_RUN}/source\.keras$"
    )
    try:
        with local.resized({"worker": local.host.memory_mb["worker"]}):  # fresh containers, started by the run
            known = set(_warm_pids(local, "worker"))
            train(services, TWO, TWO_RUN)
            deadline = time.monotonic() + 120
            while len(started := [pid for pid in _warm_pids(local, "worker") if pid not in known]) < TWO.workers:
                assert time.monotonic() < deadline, "the run's Workers never started"
                time.sleep(0.05)
            killed, survivor = started
            os.kill(killed, signal.SIGKILL)  # the first one: its invocation waits on the model while the other starts
            run = finish(services, TWO_RUN)
            later = [pid for pid in _warm_pids(local, "worker") if pid not in known]
    finally:
        local.host.faults = None
    assert run.status == "COMPLETED", run.reason
    report = local.host.fault_report(TWO_RUN)  # the run's own: an earlier test's late messages may still fail
    assert report["failed_invocations"] == 1, report  # the other's first try completed
    assert report["retries"] == 1, report
    assert sum(n for error, n in report["errors"].items() if error.startswith(DIED)) == 1, report["errors"]
    assert report["replaced_processes"] - replaced_before == 1
    assert set(later) - {survivor, killed}  # a fresh process took the killed one's message
