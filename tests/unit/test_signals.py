"""A step Ctrl-C must not cut in two runs whole; the signal is handled as it ends, a second at once."""

from __future__ import annotations

import os
import signal

import pytest

from slsml.client.signals import held_until_done


@pytest.fixture(autouse=True)
def python_s_own_handlers():
    """Python's own Ctrl-C handler and the default SIGTERM action for each test, whatever an earlier test of the
    process installed (the CLI's ``main`` ends the process a few seconds after a Ctrl-C), restored after it."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_ctrl_c_during_a_held_step_is_handled_once_the_step_ends() -> None:
    done, handler = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), held_until_done():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("the rest of the step")
    assert done == ["the rest of the step"]
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_second_ctrl_c_during_a_held_step_is_handled_at_once() -> None:
    done, handler = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), held_until_done():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("after the first")
        os.kill(os.getpid(), signal.SIGINT)
        done.append("after the second")
    assert done == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is handler


def test_a_step_no_signal_reached_leaves_the_handlers_as_they_were() -> None:
    handler = signal.getsignal(signal.SIGTERM)
    with held_until_done():
        pass
    assert signal.getsignal(signal.SIGTERM) is handler
