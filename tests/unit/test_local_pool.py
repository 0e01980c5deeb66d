"""The local runtime's pool of warm processes: its size from the machine or SLSML_POOL, every function's processes
bounded by it whatever the concurrency asked for, and a runtime sized for a run (``fit``'s, ``run start --local``'s,
a search's) holding its every Worker invocation."""

from __future__ import annotations

import pytest

from slsml.local import runtime
from slsml.local.runtime import POOL_ENV, LocalRuntime, default_pool, sized_for
from slsml.spec.config import TrainingSpec
from slsml.spec.deployment import DEFAULT_FUNCTIONS


def test_the_pool_is_set_by_the_environment_or_derived_from_cores_and_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_ENV, "7")
    assert default_pool() == 7
    monkeypatch.delenv(POOL_ENV)
    monkeypatch.setattr(runtime, "_cores", lambda: 2)
    monkeypatch.setattr(runtime, "_available_memory_mb", lambda: 24 * 1024)  # this machine: bound by its cores
    assert default_pool() == 2 * runtime.PROCESSES_PER_CORE
    monkeypatch.setattr(runtime, "_cores", lambda: 64)
    assert default_pool() == 32  # a big machine: bound by memory, half of 24 GB at 375 MB a slot
    monkeypatch.setattr(runtime, "_available_memory_mb", lambda: 100)
    assert default_pool() == 1


def test_every_function_gets_at_most_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOL_ENV, "3")
    assert LocalRuntime(workers=256, reducers=8).concurrency == {
        "work_launcher": 1,
        "worker": 3,
        "reduce_launcher": 3,
        "reducer": 3,
        "merger": 1,
        "watchdog": 1,
        "run_starter": 1,
        "dead_letters": 1,
    }
    assert LocalRuntime(workers=2, reducers=1, pool=40).concurrency["worker"] == 2


def test_a_function_gets_at_most_its_reserved_concurrency_and_the_watchdog_its_own_processes() -> None:
    concurrency = LocalRuntime(workers=1000, reducers=1000, pool=5000).concurrency
    for name in ("worker", "reduce_launcher", "reducer"):  # a run's width multiplies them
        assert concurrency[name] == DEFAULT_FUNCTIONS[name].reserved_concurrency, name
    assert concurrency["watchdog"] >= 1 and concurrency["dead_letters"] >= 1


@pytest.mark.parametrize(("workers", "stages", "parallel"), [(2, 2, 1), (3, 1, 1), (2, 3, 2)])
def test_a_runtime_sized_for_a_run_in_stages_takes_its_every_stage(workers: int, stages: int, parallel: int) -> None:
    """A worker's stages wait on each other: W×S Worker invocations at once (the runtime ``slsml.fit`` starts for
    ``workers=2, pipeline_stages=2`` refused its run, holding W); one report each reaches the ReduceLauncher."""
    spec = TrainingSpec(workers=workers, reducers=2, global_batch=64, pipeline_stages=stages)
    local = LocalRuntime(**sized_for(spec, parallel), pool=64)
    assert local.concurrency["worker"] == parallel * workers * stages
    assert local.concurrency["reduce_launcher"] == parallel * workers
    assert local.limits.stages_refusal(spec, parallel * workers) is None
    # one worker more than it was sized for would wait on a stage no process takes (a run of one stage never does)
    assert (local.limits.stages_refusal(spec, parallel * workers + 1) is None) == (stages == 1)
