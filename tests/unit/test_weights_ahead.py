"""A worker under ``stale_weights``: while its round computes it reads the model its next round enters as soon as
that model's manifest is stored (before its own update is stored), its next round reads neither model it enters
from S3, and that round's update is the very bytes of one that read them."""

from __future__ import annotations

import threading
import time
import urllib.parse

import pytest
from botocore.awsrequest import AWSPreparedRequest

from slsml.aws import cache
from slsml.pipeline.services import Services
from slsml.pipeline.steps import worker as step
from slsml.spec import keys
from slsml.spec.messages import WorkMessage

from . import cloud

WAIT_S = 10
RUN = "ahead"


def _round(services: Services, iteration: int, attempt: int = 0) -> bytes:
    """Worker 0's round of ``iteration``, launched ahead (entering the model of the iteration before): its update."""
    message = WorkMessage(run_id=RUN, iteration=iteration, worker=0, workers=2, attempt=attempt, ahead=True)
    assert step.work(message, services) is not None
    return services.store.get(keys.update(RUN, iteration, 0, attempt))


def _sent(services: Services, operation: str, seen: list[str], hold: threading.Event | None = None) -> None:
    """Record the key of every ``operation`` request the store sends; hold those of updates until ``hold`` is set."""

    def sent(request: AWSPreparedRequest, **_: object) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(request.url).path).lstrip("/")
        key = path.removeprefix(f"{services.store.bucket}/")
        if hold is not None and "/updates/" in key:
            assert hold.wait(WAIT_S), "the update was stored before the next model was read"
        seen.append(key)

    services.store.s3.meta.events.register(f"before-send.s3.{operation}", sent, unique_id=operation)


def test_the_next_model_is_read_while_the_round_computes_and_the_next_round_reads_no_model(
    services: Services, model_bytes: bytes
) -> None:
    cloud.register_run(services, model_bytes, RUN, stale_weights=1)
    cloud.place_initial(services, RUN, 1)  # the model round 2 enters (ahead: from the models of 1 and 0)
    next_shards = keys.shards_prefix(RUN, 2)
    gets: list[tuple[str, str | None]] = []
    puts: list[str] = []
    read, stored = threading.Event(), threading.Event()

    def seen(key: str, byte_range: str | None) -> None:
        gets.append((key, byte_range))
        if key.startswith(keys.dataset_shards("d", "train")) and not stored.is_set():
            stored.set()  # the round reads its samples: the model it steps to is merged meanwhile
            threading.Thread(target=cloud.place_initial, args=(services, RUN, 2)).start()
        if key.startswith(next_shards) and sum(k.startswith(next_shards) for k, _ in gets) == 2:
            read.set()  # both shards of the next model read

    _sent(services, "PutObject", puts, hold=read)
    with cloud.watching_gets(services.store, seen):
        _round(services, 2)
    # the next model's shards were read before the round's update was stored
    assert read.is_set() and any(key.startswith(next_shards) for key, _ in gets)
    assert any("/updates/" in key for key in puts)
    with cloud.gets_sent(services.store) as later:
        warm = _round(services, 3)  # enters the model of 2, predicted from 2 and 1: both warm
    assert not [key for key, _ in later if key.startswith((keys.shards_prefix(RUN, 1), keys.shards_prefix(RUN, 2)))]
    cache.warm().bound(0)  # nothing warm: the same round reads both models from S3
    cache.warm().bound(None)
    with cloud.gets_sent(services.store) as cold:
        read_anew = _round(services, 3, attempt=1)
    for iteration in (1, 2):
        assert any(key.startswith(keys.shards_prefix(RUN, iteration)) for key, _ in cold)
    assert read_anew == warm  # bit for bit


@pytest.mark.parametrize("stale_weights", [0, 1])
def test_only_a_round_launched_ahead_looks_for_the_next_model(
    services: Services, model_bytes: bytes, stale_weights: int
) -> None:
    """A synchronous round's next model is merged after its update: it looks for none; a round of a run on stale
    weights launched ahead looks for its manifest until its invocation ends."""
    cloud.register_run(services, model_bytes, RUN, stale_weights=stale_weights)
    heads: list[str] = []
    _sent(services, "HeadObject", heads)
    if stale_weights:
        cloud.place_initial(services, RUN, 1)
        _round(services, 2)
    else:
        assert cloud.work(services, RUN, iteration=2) is not None
    looks = heads.count(keys.manifest(RUN, 3 - stale_weights))
    assert (looks > 0) == bool(stale_weights), heads


def test_a_round_that_follows_in_its_invocation_reads_no_samples_on_its_path(
    services: Services, model_bytes: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first micro-batches (here, its one: 8 samples) were read as the round before's last computed; its update
    is the one a round that reads them itself computes."""
    cloud.register_run(services, model_bytes, RUN, stale_weights=1, eval_every=0)
    for iteration in (1, 2):
        cloud.place_initial(services, RUN, iteration)
    phase, reads = ["2"], []
    read = step._batch

    def recorded(reader: object, indices: object, config: object) -> object:
        reads.append((phase[0], tuple(indices)))  # type: ignore[call-overload]
        return read(reader, indices, config)  # type: ignore[arg-type]

    monkeypatch.setattr(step, "_batch", recorded)
    _round(services, 2)  # its last micro-batch computing, the samples of round 3 are read
    deadline = time.monotonic() + WAIT_S
    while len(reads) < 2:  # its own, and the next round's
        assert time.monotonic() < deadline, reads
        time.sleep(0.01)
    phase[0] = "3"
    read_before = _round(services, 3)  # (its own last computing, round 4's are read)
    phase[0] = "3 anew"
    read_now = _round(services, 3, attempt=1)
    by_phase = {name: [indices for p, indices in reads if p == name] for name in ("2", "3", "3 anew")}
    own, following = by_phase["2"]
    assert following != own and following not in by_phase["3"] and following in by_phase["3 anew"]
    assert read_now == read_before  # bit for bit
