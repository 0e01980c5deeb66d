"""A function's warm containers, each one process: one that dies ends only its own call and is replaced by a fresh
one, whether it died running a call or free; renewed containers let the calls running end in their processes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pytest

from slsml.local.containers import Container, Containers


def _pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def replaced() -> list[int]:
    return []


@pytest.fixture
def containers(replaced: list[int]) -> Iterator[Containers]:
    context = multiprocessing.get_context("spawn")

    def new() -> Container:
        return ProcessPoolExecutor(max_workers=1, mp_context=context)

    made = Containers(2, new, lambda: replaced.append(1))
    yield made
    made.close()


def test_a_killed_container_ends_its_own_call_alone_and_a_fresh_one_takes_the_next(containers, replaced) -> None:
    first, second = (f.result() for f in containers.start(os.getpid))
    killed = containers.submit(_pid_after, 60)
    other = containers.submit(_pid_after, 2)
    os.kill(first, signal.SIGKILL)  # the free containers are taken in turn: the first runs the first call
    with pytest.raises(BrokenProcessPool):
        killed.result(timeout=30)
    assert other.result(timeout=30) == second
    assert containers.submit(_pid_after, 0).result(timeout=30) not in {first, second}
    assert replaced == [1]


def test_a_container_that_died_while_free_is_replaced_for_the_next_call(containers, replaced) -> None:
    first, second = (f.result() for f in containers.start(os.getpid))
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _running(first):  # until its executor has seen it die and reaped it
        assert time.monotonic() < deadline, "the killed process was never reaped"
        time.sleep(0.01)
    pids = {containers.submit(_pid_after, 0.5).result(timeout=30) for _ in range(2)}
    assert first not in pids and second in pids
    assert replaced == [1]


def test_renewed_containers_let_a_running_call_end_and_run_the_next_in_fresh_processes(containers, replaced) -> None:
    old = {f.result() for f in containers.start(os.getpid)}
    running = containers.submit(_pid_after, 1)
    containers.renew()
    assert running.result(timeout=30) in old
    later = [containers.submit(_pid_after, 0.5) for _ in range(3)]
    assert not {f.result(timeout=30) for f in later} & old
    assert replaced == []
