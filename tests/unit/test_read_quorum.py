"""Reads under a quorum: the read policy's settings, and ``ObjectStore.get_quorum`` leaving slow objects out."""

from __future__ import annotations

import io
import time

import pytest
from pydantic import ValidationError

from slsml.aws.storage import ObjectStore
from slsml.spec.errors import NotFoundError
from slsml.spec.reliability import READ_QUORUM_ENV, READ_TIMEOUT_ENV, ReadPolicy


def test_read_policy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(READ_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(READ_QUORUM_ENV, raising=False)
    assert ReadPolicy() == ReadPolicy(timeout_s=30.0, quorum=1.0)
    monkeypatch.setenv(READ_TIMEOUT_ENV, "2.5")
    monkeypatch.setenv(READ_QUORUM_ENV, "0.75")
    assert ReadPolicy() == ReadPolicy(timeout_s=2.5, quorum=0.75)
    assert ReadPolicy(timeout_s=0.5, quorum=0.5).environment() == {READ_TIMEOUT_ENV: "0.5", READ_QUORUM_ENV: "0.5"}
    monkeypatch.setenv(READ_QUORUM_ENV, "1.5")
    with pytest.raises(ValidationError, match="quorum"):
        ReadPolicy()


class SlowS3:
    """Objects named by their delay: ``"0.5"`` takes half a second to read; ``"missing"`` does not exist."""

    def get_object(self, Bucket: str, Key: str, Range: str | None = None) -> dict:
        if Key == "missing":
            raise NotFoundError(Key)
        time.sleep(float(Key))
        return {"Body": io.BytesIO(Key.encode())}


def _read(keys: list[str], need: int, timeout_s: float) -> tuple[list[bytes | None], float]:
    store = ObjectStore(SlowS3(), "bucket")
    started = time.perf_counter()
    results = store.get_quorum(keys, [None] * len(keys), need=need, timeout_s=timeout_s)
    return [None if r is None else r.body for r in results], time.perf_counter() - started


def test_everything_needed_waits_for_everything() -> None:
    results, took = _read(["0.0", "0.4", "0.0"], need=3, timeout_s=0.05)
    assert results == [b"0.0", b"0.4", b"0.0"] and took >= 0.4


def test_a_slow_object_is_dropped_after_its_timeout() -> None:
    results, took = _read(["0.0", "2.0", "0.05"], need=2, timeout_s=0.3)
    assert results == [b"0.0", None, b"0.05"]
    assert 0.3 <= took < 1.5


def test_a_read_within_its_timeout_is_waited_for() -> None:
    results, took = _read(["0.0", "0.3", "0.0"], need=1, timeout_s=2.0)
    assert results == [b"0.0", b"0.3", b"0.0"] and took < 1.0


def test_the_quorum_is_waited_for_even_past_the_timeout() -> None:
    results, took = _read(["0.6", "3.0", "0.0"], need=2, timeout_s=0.1)
    assert results == [b"0.6", None, b"0.0"]
    assert 0.6 <= took < 2.0


def test_a_failed_read_raises() -> None:
    with pytest.raises(NotFoundError):
        _read(["0.0", "missing", "0.0"], need=2, timeout_s=1.0)
