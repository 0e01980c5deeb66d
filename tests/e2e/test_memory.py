"""A function's memory is enforced locally as on AWS: a Worker process whose memory passes the Worker's size is
killed as Lambda kills its container ("Runtime exited with error: signal: killed", Max Memory Used at the size), a
fresh process takes the retry, and the run fails once the message has failed three times; the same run at the
deployment's size completes. Every invocation's REPORT line gives its peak memory."""

from __future__ import annotations

import re

from slsml.spec.config import TrainingSpec
from slsml.spec.deployment import DEFAULT_FUNCTIONS

from .conftest import finish, train

# the share in one micro-batch, as given: a worker sized below the step it takes (not one that sizes its micro-batches
# to its memory, and refuses where none fits) is killed
SPEC = TrainingSpec(workers=1, reducers=1, global_batch=32, iterations=2, eval_every=0, micro_batch=32)
USED = re.compile(
    r"^REPORT RequestId: \S+\tDuration: [\d.]+ ms\tBilled Duration: \d+ ms\tMemory Size: (\d+) MB"
    r"\tMax Memory Used: (\d+) MB$",
    re.M,
)
BELOW_STEP_MB = 64  # how far below what a step took the Worker is sized


def test_a_worker_past_its_memory_is_killed_and_retried_until_its_run_fails(local, services, digits):
    log = local.log_dir / "worker.log"
    normal = DEFAULT_FUNCTIONS["worker"].memory_mb
    with local.resized({"worker": normal}):  # fresh processes, as those of the smaller Worker will be
        start = len(log.read_bytes())
        train(services, SPEC, "memory-normal")
        assert finish(services, "memory-normal").status == "COMPLETED"
    reports = USED.findall(log.read_bytes()[start:].decode())
    assert len(reports) >= SPEC.iterations
    assert {int(size) for size, _ in reports} == {normal}
    needed = max(int(used) for _, used in reports)
    assert needed < normal  # the deployment's size leaves room

    small = needed - BELOW_STEP_MB
    before = local.host.fault_report()
    with local.resized({"worker": small}):
        start = len(log.read_bytes())
        train(services, SPEC, "memory-small")
        run = finish(services, "memory-small")
    assert run.status == "FAILED"
    assert f"signal: killed (out of memory: past the worker function's {small} MB)" in run.reason, run.reason
    report = local.host.fault_report()
    assert report["replaced_processes"] - before["replaced_processes"] >= 3  # each try in a fresh process
    assert report["retries"] - before["retries"] >= 2  # as Lambda retries an asynchronous event twice
    logged = log.read_bytes()[start:].decode()
    assert logged.count("Error: Runtime exited with error: signal: killed\nRuntime.ExitError\n") >= 3
    assert (str(small), str(small)) in USED.findall(logged)  # Max Memory Used: the size, as Lambda reports it
