"""ObjectStore: create-only writes and scratch tagging, against moto's S3."""

from __future__ import annotations

import base64
import collections
import hashlib
import itertools
import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError

from slsml.aws.storage import MULTIPART_BYTES, PART_BYTES, ObjectStore, etag_of, stored_parts, upload_parts
from slsml.spec import keys
from slsml.spec.deployment import SCRATCH_TAG_KEY, SCRATCH_TAG_VALUE
from slsml.spec.errors import NotFoundError


def _tags(store: ObjectStore, key: str) -> dict[str, str]:
    tags = store.s3.get_object_tagging(Bucket="bucket", Key=key)["TagSet"]
    return {t["Key"]: t["Value"] for t in tags}


def test_put_new_never_overwrites(store: ObjectStore) -> None:
    assert store.put_new("runs/a/run.json", b"first")
    assert not store.put_new("runs/a/run.json", b"second")
    assert store.get("runs/a/run.json") == b"first"


def test_copy_new_is_made_by_s3_and_never_overwrites(store: ObjectStore) -> None:
    store.put_new(keys.model("a", 3), b"the final model", metadata={"done": "1"})
    calls: list[str] = []
    store.s3.meta.events.register("before-call.s3.*", lambda model, **_: calls.append(model.name))
    assert store.copy_new(keys.model("a", 3), keys.final_model("a"))
    assert "CopyObject" in calls and "GetObject" not in calls  # the bytes do not pass through this process
    assert store.get(keys.final_model("a")) == b"the final model" and store.head(keys.final_model("a")) == {}
    store.put_new(keys.model("a", 4), b"another model")
    assert not store.copy_new(keys.model("a", 4), keys.final_model("a"))
    assert store.get(keys.final_model("a")) == b"the final model"


def test_a_checked_copy_holds_the_bytes_named_or_is_not_kept(store: ObjectStore) -> None:
    """S3's SHA-256 of what it copied, in the copy's answer, is checked against the digest the copier expects: the
    copy of other bytes is deleted (None); the copy of those bytes kept, and a retry (or a second completer) keeps it
    where S3's checksum of it is the one expected, deleting nothing: a reader never finds the final model gone."""
    merged, untrained = b"the merged model", b"the initial model"
    store.put_new(keys.model("a", 3), untrained)  # another object where the merged model was stored
    assert store.copy_own(keys.model("a", 3), keys.final_model("a"), hashlib.sha256(merged).hexdigest()) is None
    assert not store.exists(keys.final_model("a"))
    store.replace(keys.model("a", 3), merged)
    digest = hashlib.sha256(merged).hexdigest()
    etag = store.copy_own(keys.model("a", 3), keys.final_model("a"), digest)
    assert etag == etag_of(merged) and store.get(keys.final_model("a")) == merged
    deleted: list[list[str]] = []
    store.delete = deleted.append  # type: ignore[method-assign]
    assert store.copy_own(keys.model("a", 3), keys.final_model("a"), digest) == etag  # a retry
    assert deleted == [] and store.sha256(keys.final_model("a")) == base64.b64encode(bytes.fromhex(digest)).decode()


def test_transient_scratch_carries_the_expiry_tag_and_carried_state_and_models_do_not(store: ObjectStore) -> None:
    transient = [
        keys.update("a", 3, 1),
        keys.update("a", 3, 1, attempt=2),
        keys.mean("a", 3, 0),
        keys.evaluation("a", 3, 1, "test"),
        keys.evaluation("a", 3, 0, "val"),
        keys.handed("a", 3, 1, 0, 1, 4, back=False),
        keys.handed("a", 3, 1, 0, 2, 4, back=True),
        keys.stage_part("a", 3, 1, 0, 2),
        keys.stage_progress("a", 3, 1, 0, 1, 7),
    ]
    kept = [
        keys.manifest("a", 3),
        keys.shard("a", 3, 0),
        keys.local_state("a", 2, 1),
        keys.residual("a", 2, 1),
        keys.model("a", 3),
        keys.run_config("a"),
        keys.final_model("a"),
    ]
    for key in transient + kept:
        store.put_new(key, b"x")
    assert [_tags(store, key) for key in transient] == [{SCRATCH_TAG_KEY: SCRATCH_TAG_VALUE}] * len(transient)
    assert [_tags(store, key) for key in kept] == [{}] * len(kept)
    # what a run entering iteration 3 carries: all of it untagged
    assert set(keys.carried("a", 3, reducers=1, slots=2, slot_state=True, residuals=True)) <= set(kept) | {
        keys.local_state("a", 2, 0),
        keys.residual("a", 2, 0),
    }


def test_ranged_get_and_missing_keys(store: ObjectStore) -> None:
    store.put_new("runs/a/x", bytes(range(10)))
    assert store.get("runs/a/x", (2, 4)) == bytes([2, 3, 4])
    assert store.get_many(["runs/a/x", "runs/a/x"], [(0, 0), (9, 9)]) == [b"\x00", b"\x09"]
    with pytest.raises(NotFoundError, match="runs/a/missing does not exist"):
        store.get("runs/a/missing")
    assert store.head("runs/a/missing") is None


def test_a_read_tells_the_whole_objects_size_even_of_a_range(store: ObjectStore) -> None:
    store.put_new(keys.residual("a", 3, 1), b"x" * 100, metadata={"m": "1"})
    ranged = store.read(keys.residual("a", 3, 1), (10, 25))
    assert (ranged.body, ranged.metadata, ranged.size) == (b"x" * 16, {"m": "1"}, 100)
    assert store.read(keys.residual("a", 3, 1)).size == 100
    assert _tags(store, keys.residual("a", 3, 1)) == {}  # carried state: never expired by a rule


BIG = MULTIPART_BYTES + PART_BYTES // 2  # three parts: two whole, one half


def _big(seed: int) -> bytes:
    """``BIG`` bytes that differ in every part from another seed's."""
    block = hashlib.sha256(str(seed).encode()).digest()
    return block * (BIG // len(block)) + block[: BIG % len(block)]


def _calls(store: ObjectStore) -> collections.Counter[str]:
    calls: collections.Counter[str] = collections.Counter()
    store.s3.meta.events.register("before-call.s3.*", lambda model, **_: calls.update([model.name]))
    return calls


def test_a_large_object_of_an_iteration_is_a_create_only_multipart_upload(store: ObjectStore) -> None:
    key, data = keys.update("a", 3, 1, attempt=1), _big(1)
    calls = _calls(store)
    created = store.create(key, data, metadata={"m": "1"})
    assert dict(calls) == {"CreateMultipartUpload": 1, "UploadPart": 3, "CompleteMultipartUpload": 1}
    assert upload_parts(BIG) == stored_parts(key, BIG) == 3
    stored = store.read(key)
    assert (stored.body, stored.metadata, stored.etag) == (data, {"m": "1"}, created)
    assert created == etag_of(data, 3) and created.endswith('-3"')  # the ETag S3 stores: its parts' MD5s'
    assert _tags(store, key) == {SCRATCH_TAG_KEY: SCRATCH_TAG_VALUE}
    # the same bytes again (a retry) are found there; other bytes are not the writer's: replaced
    assert store.create(key, _big(2)) is None and store.get(key) == data
    assert store.put_own(key, data) == (False, created) and store.get(key) == data
    assert store.put_own(key, _big(2)) == (True, etag_of(_big(2), 3)) and store.get(key) == _big(2)
    assert store.s3.list_multipart_uploads(Bucket="bucket").get("Uploads", []) == []  # the refused ones aborted


def test_a_streamed_object_is_sent_a_bounded_number_of_parts_at_once_and_stored_create_only(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``put_own_streamed``: pieces of any size, joined into parts of PART_BYTES, the object the bytes they make, its
    ETag the one those bytes give (so that a retry finds its own); never more than UPLOADS_IN_FLIGHT parts sent at
    once; other bytes at the key replaced; pieces that are not the size announced store nothing."""
    from slsml.aws import storage

    key, data = keys.update("a", 3, 1), _big(1)
    cuts = [0, 5, PART_BYTES - 3, PART_BYTES + 11, 2 * PART_BYTES, len(data)]

    def pieces() -> list[memoryview]:
        return [memoryview(data)[a:b] for a, b in itertools.pairwise(cuts)]

    sending, most, lock = [0], [0], threading.Lock()
    send = store.s3.upload_part

    def counted(**params: Any) -> Any:
        with lock:
            sending[0] += 1
            most[0] = max(most[0], sending[0])
        try:
            return send(**params)
        finally:
            with lock:
                sending[0] -= 1

    calls = _calls(store)
    monkeypatch.setattr(store.s3, "upload_part", counted)
    monkeypatch.setattr(storage, "UPLOADS_IN_FLIGHT", 2)
    assert store.put_own_streamed(key, len(data), pieces, {"m": "1"}) == (True, etag_of(data, 3))
    stored = store.read(key)
    assert (stored.body, stored.metadata) == (data, {"m": "1"}) and 1 <= most[0] <= 2
    assert _tags(store, key) == {SCRATCH_TAG_KEY: SCRATCH_TAG_VALUE}
    sends = calls["UploadPart"]
    assert store.put_own_streamed(key, len(data), pieces, {"m": "1"}) == (False, etag_of(data, 3))  # a retry
    assert calls["UploadPart"] == sends  # found there: not sent again
    other = _big(2)
    assert store.put_own_streamed(key, len(other), lambda: [other], {}) == (True, etag_of(other, 3))
    assert store.get(key) == other
    with pytest.raises(ValueError, match=f"{len(data) - 5} bytes streamed, not the {len(data)} announced"):
        store.put_own_streamed(keys.update("a", 3, 2), len(data), lambda: pieces()[1:], {})
    assert not store.exists(keys.update("a", 3, 2))
    assert store.s3.list_multipart_uploads(Bucket="bucket").get("Uploads", []) == []
    small = b"a small update"  # one part: one PutObject
    assert store.put_own_streamed(keys.update("a", 4, 1), len(small), lambda: [small[:3], small[3:]], {}) == (
        True,
        etag_of(small),
    )


def test_a_small_object_and_a_large_model_are_one_put(store: ObjectStore) -> None:
    calls = _calls(store)
    small = b"x" * (MULTIPART_BYTES - 1)
    assert store.create(keys.update("a", 3, 1), small) == etag_of(small)
    model = _big(1)  # copied by S3 into the final model, whose ETag is its bytes' MD5: stored whole
    assert stored_parts(keys.model("a", 3), len(model)) == 1
    assert store.create(keys.model("a", 3), model) == etag_of(model)
    assert dict(calls) == {"PutObject": 2}


def test_a_multipart_upload_that_fails_is_aborted_and_stores_nothing(store: ObjectStore) -> None:
    key = keys.residual("a", 3, 1)

    def refuse_the_second(params: dict[str, Any], **_: Any) -> None:
        if params["PartNumber"] == 2:
            raise ClientError({"Error": {"Code": "InternalError", "Message": "injected"}}, "UploadPart")

    store.s3.meta.events.register("before-parameter-build.s3.UploadPart", refuse_the_second)
    calls = _calls(store)
    with pytest.raises(ClientError, match="injected"):
        store.create(key, _big(1))
    assert calls["AbortMultipartUpload"] == 1 and calls["CompleteMultipartUpload"] == 0
    assert store.head(key) is None
    assert store.s3.list_multipart_uploads(Bucket="bucket").get("Uploads", []) == []


def test_loggers_of_modules_imported_before_a_functions_environment_reach_the_services_handler() -> None:
    """The local host's fork server imports these before a function's environment (POWERTOOLS_SERVICE_NAME) is set:
    their child loggers must sit under the service's logger all the same, or their lines reach no handler."""
    from slsml.aws import storage
    from slsml.pipeline import services
    from slsml.spec.deployment import SERVICE_NAME
    from slsml.state import orchestration

    for module in (storage, services, orchestration):
        assert module.logger.name.startswith(f"{SERVICE_NAME}."), module.__name__
