"""``wait_for_run`` reads a run every ``poll_s`` while it moves, and less and less often while it rests (up to
``RESTING_POLL_S`` between reads), so a client waiting on a run costs the table little; its end is still seen
within ``RESTING_POLL_S``."""

from __future__ import annotations

import itertools
import threading
import time

from slsml.client import runs
from slsml.spec.config import TrainingSpec
from slsml.state import records
from slsml.state.records import RunRecord, RunStatus


def test_a_resting_run_is_read_less_often_and_its_end_seen_within_the_resting_poll(services) -> None:
    spec = TrainingSpec(workers=2, reducers=2, global_batch=16, iterations=5)
    services.table.table.put_item(Item=records.run_item("r", "d", spec, time.time(), "digest"))
    reads: list[float] = []
    get_run = services.table.get_run

    def read(run_id: str) -> RunRecord:
        reads.append(time.monotonic())
        return get_run(run_id)

    services.table.get_run = read
    ended: list[float] = []

    def pipeline() -> None:  # moves once, rests, then fails the run
        time.sleep(0.3)
        services.table.advance("r", 1, 0)
        time.sleep(3.0)
        ended.append(time.monotonic())
        services.table.fail("r", "ended by the test")

    moving = threading.Thread(target=pipeline)
    moving.start()
    run = runs.wait_for_run(services, "r", poll_s=0.05)
    moving.join()
    assert run.status == RunStatus.FAILED and run.iteration == 1
    assert reads[-1] - ended[0] <= runs.RESTING_POLL_S + 0.2  # its end seen within the resting poll
    resting = [t for t in reads if ended[0] - 3.0 < t < ended[0]]
    gaps = [b - a for a, b in itertools.pairwise(resting)]
    assert len(resting) <= 8, f"{len(resting)} reads in 3 s of rest"  # every 0.05 s: 60
    assert gaps[0] < gaps[-1] <= runs.RESTING_POLL_S + 0.2  # longer and longer, up to the resting poll
