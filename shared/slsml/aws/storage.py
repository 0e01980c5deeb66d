"""S3 access for the pipeline: write-once objects, ranged reads."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import numpy as np
from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError

from slsml.aws.clients import error_code
from slsml.aws.ranged import RangedReads
from slsml.spec import keys
from slsml.spec.deployment import SCRATCH_TAG_KEY, SCRATCH_TAG_VALUE, SERVICE_NAME
from slsml.spec.errors import BadInputError, NotFoundError, RunFailed, SlsmlError
from slsml.training import bounds, npz

# named by the service explicitly: this module is imported before a function's environment is (the local host's
# fork server imports it), and a child logger named by an unset service would reach no handler
logger = Logger(service=SERVICE_NAME, child=True)

_MISSING = {"NoSuchKey", "404", "NotFound"}
_REPLACE_TRIES = 3
_MAX_READS = 64  # concurrent GETs of one get_quorum call
_POLL_S = 0.05  # how often reads still queued behind others are checked for having started
DELETE_BATCH = 1000  # keys of one DeleteObjects request
_EXISTS = {"PreconditionFailed", "ConditionalRequestConflict"}  # a create-only write onto a key that exists

# An object of a run's iterations of MULTIPART_BYTES or more is stored as a multipart upload of PART_BYTES parts (the
# last holds the rest), PARALLEL_PARTS of them sent at once: one connection carries ~85 MB/s, an instance's network
# many times that. S3's smallest part is 5 MiB.
PART_BYTES = 8 * 1024 * 1024
MULTIPART_BYTES = 2 * PART_BYTES
PARALLEL_PARTS = 16
UPLOADS_IN_FLIGHT = 4  # parts of a streamed upload (``put_own_streamed``) sent at once: what its writer holds of it


def upload_parts(size: int) -> int:
    """The parts ``ObjectStore.create`` stores an object of a run's iterations of ``size`` bytes in (1: one
    PutObject)."""
    return 1 if size < MULTIPART_BYTES else math.ceil(size / PART_BYTES)


def stored_parts(key: str, size: int) -> int:
    """The parts ``ObjectStore.create`` stores ``size`` bytes at ``key`` in: ``upload_parts`` of an object of a run's
    iterations (``keys.SCRATCH_OBJECTS``), 1 of any other. Models are stored whole: S3's copy of an object (the final
    model is one) gets the MD5 of its bytes as its ETag, which a multipart source's ETag is not."""
    return upload_parts(size) if fnmatchcase(key, keys.SCRATCH_OBJECTS) else 1


@dataclass(frozen=True)
class Stored:
    """An object (or a byte range of it) as read, with the object's user metadata."""

    body: bytes
    metadata: dict[str, str]
    size: int | None = None  # the whole object's bytes (of a ranged read: from its Content-Range)
    etag: str | None = None  # the object's (of a single-part upload: the MD5 of its bytes, quoted)


class ObjectStore:
    """One bucket. Every write is create-only (``If-None-Match: *``): nothing stored is overwritten."""

    def __init__(self, s3: Any, bucket: str) -> None:
        self.s3 = s3
        self.bucket = bucket
        self._ranged: RangedReads | None = None

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        return self.read(key, byte_range).body

    def get_range(self, key: str, byte_range: tuple[int, int]) -> Stored:
        """Bytes ``byte_range`` (inclusive) of the object with the object's ETag, without its metadata: one GET by the
        object's pre-signed URL (``slsml.aws.ranged``), for many small reads of one object."""
        if self._ranged is None:
            self._ranged = RangedReads(self.s3, self.bucket)
        with self._found(key):
            body, etag = self._ranged.get(key, *byte_range)
        return Stored(body, {}, etag=etag)

    def read(self, key: str, byte_range: tuple[int, int] | None = None) -> Stored:
        """The object (or its bytes ``byte_range``, inclusive) with its metadata: one GET."""
        extra = {"Range": f"bytes={byte_range[0]}-{byte_range[1]}"} if byte_range else {}
        response = self._get_object(key, **extra)
        total = response.get("ContentRange", "").rpartition("/")[2]
        size = int(total) if total.isdigit() else None if byte_range else response.get("ContentLength")
        return Stored(response["Body"].read(), response.get("Metadata", {}), size, response.get("ETag"))

    def get_bounded(self, key: str, bound: int, what: str) -> bytes:
        """The object, refused (BadInputError, its body unread) if it is larger than ``bound`` bytes (``what``: the
        bound, in words): one GET, whose length is known before its body is read."""
        response = self._get_object(key)
        try:
            bounds.check_size(key, int(response["ContentLength"]), bound, what)
        except BadInputError:
            response["Body"].close()
            raise
        return response["Body"].read()

    def opened(self, key: str, chunk: int, sha256: str | None = None) -> tuple[str, RangedObject]:
        """The object's SHA-256 (hex), and the object as a seekable file of the bytes it was computed from (each read
        a ranged GET of the same object, by its ETag). Where S3 keeps the object's SHA-256 (stored with one: a run's
        source model) and it is ``sha256``, that is taken, and the object is not read for it; else it is computed,
        the object read ``chunk`` bytes a GET (no more of it held at once)."""
        if sha256 is not None:
            with self._found(key):
                head = self.s3.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
            kept = head.get("ChecksumSHA256")
            if kept is not None and base64.b64decode(kept).hex() == sha256:
                return sha256, RangedObject(self, key, int(head["ContentLength"]), head["ETag"])
        first = self.read(key, (0, chunk - 1))
        size, etag = first.size if first.size is not None else len(first.body), first.etag
        opened = RangedObject(self, key, size, etag)
        digest = hashlib.sha256(first.body)
        for start in range(len(first.body), size, chunk):
            digest.update(opened.range(start, min(start + chunk, size)))
        return digest.hexdigest(), opened

    def _get_object(self, key: str, **extra: str) -> dict[str, Any]:
        with self._found(key):
            return self.s3.get_object(Bucket=self.bucket, Key=key, **extra)

    @contextmanager
    def _found(self, key: str) -> Iterator[None]:
        """A GET of ``key`` in the block: NotFoundError where the object does not exist."""
        try:
            yield
        except ClientError as error:
            if error_code(error) in _MISSING:
                raise NotFoundError(f"s3://{self.bucket}/{key} does not exist") from None
            raise

    def get_many(self, keys: Iterable[str], ranges: Iterable[tuple[int, int] | None] | None = None) -> list[bytes]:
        """Parallel GETs, results in the order of ``keys``."""
        return [found.body for found in self.read_many(keys, ranges)]

    def read_many(self, keys: Iterable[str], ranges: Iterable[tuple[int, int] | None] | None = None) -> list[Stored]:
        """Parallel GETs with the objects' metadata, results in the order of ``keys``."""
        keys = list(keys)
        ranges = list(ranges) if ranges is not None else [None] * len(keys)
        if len(keys) <= 1:
            return [self.read(k, r) for k, r in zip(keys, ranges, strict=True)]
        with ThreadPoolExecutor(max_workers=min(16, len(keys))) as pool:
            return list(pool.map(self.read, keys, ranges))

    def get_quorum(
        self, keys: Iterable[str], ranges: Iterable[tuple[int, int] | None], need: int, timeout_s: float
    ) -> list[Stored | None]:
        """Parallel GETs that may leave slow objects out: results (with their metadata) in the order of
        ``keys``, None for a dropped one.

        Returns once at least ``need`` objects are read and every read still running has taken
        longer than ``timeout_s`` (each read's clock starts when it starts). Until ``need`` are
        read it waits, however long. Reads left behind finish in the background. A read that fails raises.
        """
        keys, ranges = list(keys), list(ranges)
        if need >= len(keys):  # every one is needed
            if len(keys) <= 1:
                return [self.read(k, r) for k, r in zip(keys, ranges, strict=True)]
            with ThreadPoolExecutor(max_workers=min(16, len(keys))) as pool:
                return list(pool.map(self.read, keys, ranges))
        started: list[float | None] = [None] * len(keys)

        def read(index: int) -> Stored:
            started[index] = time.monotonic()
            return self.read(keys[index], ranges[index])

        results: list[Stored | None] = [None] * len(keys)
        pool = ThreadPoolExecutor(max_workers=min(_MAX_READS, len(keys)))
        futures: dict[Future, int] = {pool.submit(read, i): i for i in range(len(keys))}
        pending, read_count = set(futures), 0
        try:
            while pending:
                wait_s = None  # fewer than need read: wait for the next one, however long
                if read_count >= need:
                    starts = [started[futures[f]] for f in pending]
                    clocks = [start for start in starts if start is not None]
                    if len(clocks) < len(starts):  # queued behind other reads: its clock has not started
                        wait_s = _POLL_S
                    else:
                        wait_s = max(clocks) + timeout_s - time.monotonic()
                        if wait_s <= 0:
                            break  # every read still running is overdue
                done, pending = wait(pending, timeout=wait_s, return_when=FIRST_COMPLETED)
                for future in done:
                    results[futures[future]] = future.result()  # a failed read raises here
                    read_count += 1
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return results

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def head(self, key: str) -> dict[str, str] | None:
        """The object's user metadata, or None if it does not exist."""
        try:
            return self.s3.head_object(Bucket=self.bucket, Key=key)["Metadata"]
        except ClientError as error:
            if error_code(error) in _MISSING:
                return None
            raise

    def etag(self, key: str) -> str | None:
        """The object's ETag, or None if it does not exist."""
        try:
            return self.s3.head_object(Bucket=self.bucket, Key=key)["ETag"]
        except ClientError as error:
            if error_code(error) in _MISSING:
                return None
            raise

    def sha256(self, key: str) -> str | None:
        """The SHA-256 (base64) S3 keeps of the object, stored with one (``ChecksumAlgorithm``); None if it has none
        or does not exist."""
        try:
            return self.s3.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED").get("ChecksumSHA256")
        except ClientError as error:
            if error_code(error) in _MISSING:
                return None
            raise

    def put_own(self, key: str, data: bytes | bytearray, metadata: dict[str, str] | None = None) -> tuple[bool, str]:
        """Create ``key`` with ``data``, which its writer computes the same way each time it tries (a retry writes
        the same bytes): whether it created it (False: those bytes are there already), and the ETag S3 gave them. An
        object of other bytes at the key is not this writer's (a forged or pre-placed one): it is not trusted for
        sitting at the expected key, but deleted (``delete_if``: not one another writer put in its place meanwhile)
        and ``data`` created in its place."""
        expected = stored_etag(key, data)
        for _ in range(_REPLACE_TRIES):
            if (created := self.create(key, data, metadata)) is not None:
                return True, created
            found = self.etag(key)
            if found == expected:
                return False, expected
            if found is not None:  # (None: deleted meanwhile, by another writer that replaces it)
                logger.warning("an object not written by its step was replaced", extra={"key": key})
                self.delete_if(key, found)
        raise SlsmlError(f"s3://{self.bucket}/{key} is written by something else as soon as it is deleted")

    def put_own_streamed(
        self, key: str, size: int, pieces: Callable[[], Iterable[bytes | memoryview]], metadata: dict[str, str]
    ) -> tuple[bool, str]:
        """``put_own`` of the ``size`` bytes that ``pieces()`` yields in turn (the same bytes each time it is called):
        stored in ``stored_parts`` parts, of which the writer holds ``UPLOADS_IN_FLIGHT`` at once as they are sent
        (and the one it fills), whatever the object's size. Where the key holds an object already (a duplicate's or a
        retry's), the ETag its bytes would make is computed first, and they are not sent again if it is that one."""
        parts = stored_parts(key, size)
        if parts == 1:
            return self.put_own(key, b"".join(pieces()), metadata)
        found = self.etag(key)
        if found is not None and found == _multipart_etag(
            [hashlib.md5(p, usedforsecurity=False).digest() for p in _in_parts(pieces())]
        ):
            return False, found
        for _ in range(_REPLACE_TRIES):
            created, expected = self._stream_in_parts(key, size, parts, pieces(), metadata)
            if created is not None:
                return True, created
            found = self.etag(key)
            if found == expected:
                return False, expected
            if found is not None:
                logger.warning("an object not written by its step was replaced", extra={"key": key})
                self.delete_if(key, found)
        raise SlsmlError(f"s3://{self.bucket}/{key} is written by something else as soon as it is deleted")

    def _stream_in_parts(
        self, key: str, size: int, parts: int, pieces: Iterable[bytes | memoryview], metadata: dict[str, str]
    ) -> tuple[str | None, str]:
        """A multipart upload of ``pieces`` (``size`` bytes) in ``parts`` parts of ``PART_BYTES``, completed
        create-only: its ETag (None if ``key`` exists, the upload aborted) and the ETag its bytes make."""
        tagging = {"Tagging": f"{SCRATCH_TAG_KEY}={SCRATCH_TAG_VALUE}"} if keys.is_transient(key) else {}
        upload = self.s3.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata=metadata, **tagging)["UploadId"]
        digests: list[bytes] = []
        streamed = 0

        def send(number: int, body: bytes) -> dict[str, Any]:
            sent = self.s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=body)
            return {"PartNumber": number, "ETag": sent["ETag"]}

        try:
            sent: list[dict[str, Any]] = []
            with ThreadPoolExecutor(max_workers=UPLOADS_IN_FLIGHT) as pool:
                in_flight: deque[Future[dict[str, Any]]] = deque()
                for body in _in_parts(pieces):
                    digests.append(hashlib.md5(body, usedforsecurity=False).digest())
                    streamed += len(body)
                    if len(in_flight) == UPLOADS_IN_FLIGHT:
                        sent.append(in_flight.popleft().result())
                    in_flight.append(pool.submit(send, len(digests), body))
                sent.extend(future.result() for future in in_flight)
            if streamed != size or len(sent) != parts:
                raise ValueError(f"s3://{self.bucket}/{key}: {streamed} bytes streamed, not the {size} announced")
            created = self.s3.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": sent}, IfNoneMatch="*"
            )
        except BaseException as error:
            self._abort(key, upload)
            if isinstance(error, ClientError) and error_code(error) in _EXISTS:
                return None, _multipart_etag(digests)
            raise
        return str(created["ETag"]), _multipart_etag(digests)

    def replace(self, key: str, data: bytes | bytearray, metadata: dict[str, str] | None = None) -> str:
        """Delete ``key`` and create it anew, create-only (If-None-Match: the bucket's policy refuses any other write
        under runs/): its ETag; SlsmlError if something else keeps creating it meanwhile."""
        for _ in range(_REPLACE_TRIES):
            self.delete([key])
            if (created := self.create(key, data, metadata)) is not None:
                return created
        raise SlsmlError(f"s3://{self.bucket}/{key} is written by something else as soon as it is deleted")

    def delete_if(self, key: str, etag: str | None) -> bool:
        """Delete ``key`` while it is the object of ``etag`` (S3's conditional delete, If-Match): False, and nothing
        deleted, where it is another one or none."""
        try:
            self.s3.delete_object(Bucket=self.bucket, Key=key, IfMatch=etag or "")
        except ClientError as error:
            if error_code(error) in _MISSING | _EXISTS:
                return False
            raise
        return True

    def put_new(self, key: str, data: bytes | bytearray, metadata: dict[str, str] | None = None) -> bool:
        """Create ``key``; False (and nothing written) if it already exists."""
        return self.create(key, data, metadata) is not None

    def create(self, key: str, data: bytes | bytearray, metadata: dict[str, str] | None = None) -> str | None:
        """Create ``key`` (``put_new``): the ETag S3 gave it, None (and nothing written) if it already exists. An
        object of ``stored_parts`` > 1 goes as a multipart upload (``_create_in_parts``)."""
        # transient scratch carries the tag the bucket's lifecycle rule expires by; carried state does not
        tagging = {"Tagging": f"{SCRATCH_TAG_KEY}={SCRATCH_TAG_VALUE}"} if keys.is_transient(key) else {}
        parts = stored_parts(key, len(data))
        if parts > 1:
            return self._create_in_parts(key, data, parts, {"Metadata": metadata or {}, **tagging})
        # a run's source model: S3 keeps its SHA-256, which a reader checks it by without reading it (``opened``)
        checked = {"ChecksumAlgorithm": "SHA256"} if fnmatchcase(key, keys.SOURCE_MODEL_OBJECTS) else {}
        try:
            created = self.s3.put_object(
                Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*", Metadata=metadata or {}, **tagging, **checked
            )
        except ClientError as error:
            if error_code(error) in _EXISTS:
                return None
            raise
        return str(created["ETag"])

    def _create_in_parts(self, key: str, data: bytes | bytearray, parts: int, extra: dict[str, Any]) -> str | None:
        """``create`` as a multipart upload of ``parts`` parts of ``PART_BYTES``, ``PARALLEL_PARTS`` sent at once,
        completed create-only (If-None-Match): its ETag, or None if ``key`` exists. Aborted (nothing stored) if it
        does, or if anything fails."""
        upload = self.s3.create_multipart_upload(Bucket=self.bucket, Key=key, **extra)["UploadId"]
        view = memoryview(data)

        def send(number: int) -> dict[str, Any]:
            body = _Part(view[(number - 1) * PART_BYTES : number * PART_BYTES])
            sent = self.s3.upload_part(Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=body)
            return {"PartNumber": number, "ETag": sent["ETag"]}

        try:
            pool = ThreadPoolExecutor(max_workers=min(PARALLEL_PARTS, parts))
            try:
                sent = list(pool.map(send, range(1, parts + 1)))
            finally:
                pool.shutdown(cancel_futures=True)
            created = self.s3.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": sent}, IfNoneMatch="*"
            )
        except BaseException as error:
            self._abort(key, upload)
            if isinstance(error, ClientError) and error_code(error) in _EXISTS:
                return None
            raise
        return str(created["ETag"])

    def _abort(self, key: str, upload: str) -> None:
        """Abort the multipart upload ``upload`` of ``key``, its parts deleted; if that fails too, the bucket's
        lifecycle rule (``AbortIncompleteUploads``) aborts it a day after it began."""
        try:
            self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
        except ClientError as error:
            logger.warning("a multipart upload was not aborted", extra={"key": key, "error": error_code(error)})

    def copy_new(self, source: str, destination: str) -> bool:
        """Create ``destination`` as a copy of ``source``, made by S3 (its bytes do not pass through this process,
        whatever their size), without ``source``'s metadata; False (and nothing written) if it already exists."""
        return not self.exists(destination) and self._copy(source, destination) is not None

    def _copy(self, source: str, destination: str, checked: bool = False) -> tuple[str, str | None] | None:
        """The copy's ETag and, if ``checked``, the SHA-256 (base64) S3 computed of what it copied; None if
        ``destination`` exists. S3 refuses the copy onto an existing key (If-None-Match); moto checks that on a PUT
        only, so callers look first."""
        try:
            copied = self.s3.copy_object(
                Bucket=self.bucket,
                Key=destination,
                CopySource={"Bucket": self.bucket, "Key": source},
                IfNoneMatch="*",
                MetadataDirective="REPLACE",
                Metadata={},
                **({"ChecksumAlgorithm": "SHA256"} if checked else {}),
            )
        except ClientError as error:
            if error_code(error) in _EXISTS:
                return None
            raise
        result = copied["CopyObjectResult"]
        return result["ETag"], result.get("ChecksumSHA256")

    def copy_own(self, source: str, destination: str, sha256: str | None = None) -> str | None:
        """``destination`` as a server-side copy of ``source`` (``copy_new``); found there already with ``source``'s
        bytes (a retry), it stays; an object of other bytes there is not trusted for sitting at the key, but
        deleted and copied over. Returns the copy's ETag (of a single-part object: the MD5 of its bytes). With
        ``sha256`` (hex), what S3 copied must have that SHA-256 (its own checksum of the copy, in the same request):
        if not, the copy is deleted and None returned (``source`` is not the object expected)."""
        expected = None if sha256 is None else base64.b64encode(bytes.fromhex(sha256)).decode()
        for _ in range(_REPLACE_TRIES):
            found = self.etag(destination)
            if found is None:
                copied = self._copy(source, destination, checked=sha256 is not None)
                if copied is None:
                    continue
                etag, checksum = copied
                if expected is not None and checksum != expected:
                    self.delete([destination])
                    return None
                return etag
            at_source = self.etag(source)
            # a retry's copy (or another completer's) stays where S3's checksum of it is the one expected: deleting it
            # would leave a completed run without its final model until it is copied again
            if found == at_source and (expected is None or self.sha256(destination) == expected):
                return found
            if found != at_source:
                logger.warning("an object not written by its step was replaced", extra={"key": destination})
            self.delete([destination])  # (a retry's copy, checked: copied again, for S3's checksum of it)
        raise SlsmlError(f"s3://{self.bucket}/{destination} is written by something else as soon as it is deleted")

    def restamp(self, key: str, metadata: dict[str, str]) -> None:
        """Store ``key`` again in place, its bytes unchanged, with ``metadata``: a new ObjectCreated event for it."""
        self.s3.copy_object(
            Bucket=self.bucket,
            Key=key,
            CopySource={"Bucket": self.bucket, "Key": key},
            Metadata=metadata,
            MetadataDirective="REPLACE",
        )

    def etags(self, prefix: str) -> dict[str, str]:
        """The keys under ``prefix`` with their ETags (one LIST request per thousand)."""
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return {obj["Key"]: obj["ETag"] for page in pages for obj in page.get("Contents", [])}

    def list_keys(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]

    def delete(self, keys: Iterable[str]) -> None:
        """Delete the objects ``keys`` (those that do not exist too), ``DELETE_BATCH`` a request; SlsmlError naming
        the first that S3 did not delete (the bucket's policy refused it)."""
        keys = list(keys)
        for start in range(0, len(keys), DELETE_BATCH):
            objects = [{"Key": key} for key in keys[start : start + DELETE_BATCH]]
            answer = self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
            for error in answer.get("Errors", [])[:1]:
                raise SlsmlError(
                    f"s3://{self.bucket}/{error['Key']} was not deleted: {error.get('Code')} {error.get('Message')}"
                )

    # typed helpers
    def get_json(self, key: str) -> Any:
        return json.loads(self.get(key))

    def put_json_new(self, key: str, value: Any) -> bool:
        return self.put_new(key, json.dumps(value, indent=1).encode())

    def get_arrays(self, key: str) -> dict[str, np.ndarray]:
        return npz.decode(self.get(key))

    def put_arrays_new(self, key: str, arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bool:
        return self.put_new(key, npz.encode(**arrays), metadata)


class _Seekable(io.RawIOBase):
    """A read-only seekable file of ``_size`` bytes, read from ``_at`` on by ``readinto``."""

    _size = 0
    _at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at


class _Part(_Seekable):
    """A part of an object's bytes, read in place as a seekable file (no copy of it is made while it is sent)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view, self._size = view, len(view)

    def readinto(self, buffer: Any) -> int:
        count = max(0, min(len(buffer), self._size - self._at))
        buffer[:count] = self._view[self._at : self._at + count]
        self._at += count
        return count


class RangedObject(_Seekable):
    """An object read in place as a seekable file, each read a ranged GET: RunFailed, naming it, where the object
    answering a read is not the one it was opened on (another ETag: replaced meanwhile)."""

    def __init__(self, store: ObjectStore, key: str, size: int, etag: str | None) -> None:
        super().__init__()
        self._store, self._key, self._size, self._etag = store, key, size, etag

    def range(self, start: int, stop: int) -> bytes:
        """Bytes ``start`` to ``stop`` (exclusive) of the object."""
        if start >= stop:
            return b""
        read = self._store.read(self._key, (start, stop - 1))
        if read.etag != self._etag or len(read.body) != stop - start:
            raise RunFailed(f"{self._key} was replaced while it was read")
        return read.body

    def readinto(self, buffer: Any) -> int:
        body = self.range(self._at, min(self._at + len(buffer), self._size))
        buffer[: len(body)] = body
        self._at += len(body)
        return len(body)


def stored_etag(key: str, data: bytes | bytearray) -> str:
    """The ETag S3 gives ``data`` stored at ``key`` by ``ObjectStore.create`` (in its ``stored_parts``)."""
    return etag_of(data, stored_parts(key, len(data)))


def etag_of(data: bytes | bytearray, parts: int = 1) -> str:
    """The ETag S3 gives an object of ``data`` (unencrypted or SSE-S3) uploaded in one part: its MD5, quoted; in
    ``parts`` > 1 parts of ``PART_BYTES``: the MD5 of its parts' MD5s, then "-" and their count."""
    if parts == 1:
        return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'
    view = memoryview(data)
    return _multipart_etag(
        [
            hashlib.md5(view[start : start + PART_BYTES], usedforsecurity=False).digest()
            for start in range(0, len(data), PART_BYTES)
        ]
    )


def _multipart_etag(digests: list[bytes]) -> str:
    """The ETag of a multipart upload of parts of MD5s ``digests``."""
    return f'"{hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"'


def _in_parts(pieces: Iterable[bytes | memoryview]) -> Iterator[bytes]:
    """``pieces`` joined and cut again into parts of ``PART_BYTES`` (the last: the rest)."""
    filling = bytearray()
    for piece in pieces:
        view = memoryview(piece).cast("B")
        while len(view):
            taken = min(len(view), PART_BYTES - len(filling))
            filling += view[:taken]
            view = view[taken:]
            if len(filling) == PART_BYTES:
                yield bytes(filling)
                filling.clear()
    if filling:
        yield bytes(filling)
