"""The dashboard's custom metrics are emitted where they are true. A short run whose worker 3 is a
straggler left behind at the deadline floor (so that the watchdog acts and a worker comes late) writes,
in its functions' embedded-metric-format log lines, every metric the deployed dashboard graphs, under
the namespace and with the dimensions the dashboard graphs it with (``infra.observability``); a run before it, whose
update is replaced behind the pipeline's back, writes the refusal of it."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from infra.observability import CUSTOM_STATISTICS, custom_metric
from slsml.local.faults import Delay, Faults
from slsml.spec import keys, wiring
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.messages import WorkMessage
from slsml.training import updates

from .conftest import finish, timeouts, train
from .test_attacks import _recreate, _wait_for
from .test_faults import injecting

pytestmark = pytest.mark.usefixtures("warm")  # the Worker and Reducer time out after seconds here
RUN = "metrics-straggler"
# the Worker's and Reducer's timeout, and the run's deadline: a warm process's step takes well under it, on a machine
# whose other test process keeps its cores busy too; the straggler's messages are held back longer (late_worker)
DEADLINE_S = 5
SPEC = TrainingSpec(
    workers=4,
    reducers=2,
    global_batch=128,
    iterations=2,
    eval_every=0,
    deadline_s=DEADLINE_S,
    deadline_floor=0.5,
    optimizer=OptimizerConfig(name="adam", learning_rate=3e-3),
)
MetricKey = tuple[str, str, frozenset[tuple[str, str]]]  # namespace, name, dimensions


def graphed() -> set[MetricKey]:
    """What the dashboard's custom-metric graphs read: the CDK metric objects it is built from."""
    keys = set()
    for metric, statistic in CUSTOM_STATISTICS.items():
        shown = custom_metric(metric, statistic)
        keys.add((shown.namespace, shown.metric_name, frozenset((shown.dimensions or {}).items())))
    return keys


def emitted(lines: list[str]) -> set[MetricKey]:
    """The metrics in embedded-metric-format lines (JSON with an ``_aws`` key), each with each dimension set
    it is emitted under, as CloudWatch stores them."""
    found: set[MetricKey] = set()
    for line in lines:
        try:
            entry: Any = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or "_aws" not in entry:
            continue
        for directive in entry["_aws"]["CloudWatchMetrics"]:
            for dimension_set in directive["Dimensions"]:
                dimensions = frozenset((name, entry[name]) for name in dimension_set)
                found |= {
                    (directive["Namespace"], m["Name"], dimensions) for m in directive["Metrics"] if m["Name"] in entry
                }
    return found


def _new_lines(log_dir: Path, offsets: dict[Path, int]) -> list[str]:
    lines: list[str] = []
    for path in sorted(log_dir.glob("*.log")):
        with path.open("rb") as log:
            log.seek(offsets.get(path, 0))
            lines += log.read().decode(errors="replace").splitlines()
    return lines


def _refused_update(local, services) -> None:
    """A run whose worker 0's update of iteration 0 is replaced once stored, before its reducers read it (their reads
    of it held 6 s): they refuse it (RefusedObjects), its round is re-launched once, and the run completes."""
    run_id, key = f"{RUN}-refused", keys.update(f"{RUN}-refused", 0, 0)
    local.host.faults = Faults(s3_get_delay=Delay(probability=1, seconds=6), s3_get_delay_match=rf"^{re.escape(key)}$")
    try:
        train(services, SPEC.model_copy(update={"deadline_s": 120.0}), run_id)
        _wait_for(lambda: services.store.exists(key), "worker 0 never stored its update")
        stored = services.store.read(key)
        vector, samples = updates.decode(stored.body)
        _recreate(local, services, key, updates.encode(vector * -40, samples)[0], stored.metadata)
        run = finish(services, run_id)
    finally:
        local.host.faults = None
    assert run.status == "COMPLETED", run.reason


def test_every_metric_the_dashboard_graphs_is_emitted_with_its_dimensions(local, services, digits):
    expected = graphed()
    assert len(expected) == len(CUSTOM_STATISTICS)
    offsets = {path: path.stat().st_size for path in local.log_dir.glob("*.log")}
    _refused_update(local, services)
    with timeouts(local, DEADLINE_S), injecting(local, Faults.parse(f"late_worker=3:{2 * DEADLINE_S}")) as report:
        train(services, SPEC, RUN)
        # a message for a worker the run does not have: rejected (RejectedMessages), the run unharmed
        forged = WorkMessage(
            run_id=RUN, iteration=0, generation=0, worker=SPEC.workers + 5, workers=SPEC.workers, attempt=0
        )
        services.bus.publish(wiring.WORK, [forged])
        # a dropped model that cannot start (not a .keras archive): its run is registered FAILED (RefusedStarts)
        store = services.store
        store.s3.put_object(Bucket=store.bucket, Key="incoming/metrics-refused.keras", Body=b"not a keras archive")
        run = finish(services, RUN)
        assert run.status == "COMPLETED", run.reason
        # the straggler's reports come after the run completed: wait for them (and each invocation's metrics)
        deadline = time.monotonic() + 60
        while not expected <= emitted(_new_lines(local.log_dir, offsets)) and time.monotonic() < deadline:
            time.sleep(1)
    assert report["injected"]["late_worker"] >= 1
    assert all(r.fired_at_deadline for r in services.table.list_iterations(RUN))
    missing = expected - emitted(_new_lines(local.log_dir, offsets))
    assert not missing, f"graphed on the dashboard but never emitted: {sorted(missing, key=str)}"
