"""Proof of origin: every pipeline message carries an HMAC-SHA256 of what it says, under its run's key, and a step
acts on a message only if its proof holds (``envelope.admit`` checks it before anything else). A forged message
(no key), one replayed from another run (another key) and one changed on its way (another body) are refused. An
object that launches a step and that steps trust for what it names (an iteration's manifest) carries the same proof,
of its key and bytes, in its user metadata (``OBJECT_PROOF``): one put over it is refused by its readers.

The key: 32 random bytes, made by the first step that sends a message of the run (its launch) with a create-once
PutItem in the run table (``RunTable.make_run_key``), and read once per container and run into the warm cache. It
lives as long as the run's records; each run has its own, so a key that leaked opens one run alone. Only the
pipeline's roles (and the deployment's owner) can read the run table (docs/reliability.md, "Messages that do not
belong to a run"). A running run that sent messages and finds its key gone (its item deleted) fails, naming it
(``KeyLost``), at the first step that needs the key: no key is made anew for it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import TypeVar

from slsml.accounting import usage
from slsml.aws import cache as warm_cache
from slsml.spec.errors import KeyLost, NotFoundError
from slsml.spec.messages import Message
from slsml.state.records import KEY, RunStatus
from slsml.state.runtable import RunTable

KEY_BYTES = 32
OBJECT_PROOF = "proof"  # the user metadata that holds a signed object's proof of origin
M = TypeVar("M", bound=Message)


def digest(message: Message, key: bytes) -> str:
    """The proof ``message`` carries: the HMAC of its type and its JSON without the proof, hex."""
    body = f"{type(message).__name__}\n{message.model_dump_json(exclude={'proof'})}".encode()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def object_digest(object_key: str, body: bytes, key: bytes) -> str:
    """The proof an object carries: the HMAC of its S3 key and its bytes, hex (one object's is no other key's)."""
    return hmac.new(key, f"{object_key}\n".encode() + body, hashlib.sha256).hexdigest()


class RunKeys:
    """Runs' message keys, read (or, to sign, made) once per container and run."""

    def __init__(self, table: RunTable) -> None:
        self.table = table

    def _cached(self, run_id: str) -> bytes | None:
        found: bytes | None = warm_cache.warm().get(("run-key", run_id))
        return found

    def _keep(self, run_id: str, key: bytes) -> bytes:
        return warm_cache.warm().put(("run-key", run_id), key, KEY_BYTES)

    def signing(self, run_id: str) -> bytes:
        """The run's key, made if it has none; KeyLost naming its key item if the run is running and sent messages
        before (``lost``): a key made anew would leave every message in flight unproven."""
        if (key := self.checking(run_id)) is None:
            with usage.warming():
                self.lost(run_id)
                key = self.table.make_run_key(run_id, secrets.token_bytes(KEY_BYTES))
            self._keep(run_id, key)
        return key

    def checking(self, run_id: str, fresh: bool = False) -> bytes | None:
        """The run's key (``fresh``: read again, not the one this container keeps); None if it has none (no step of
        it sent a message)."""
        if fresh or (key := self._cached(run_id)) is None:
            with usage.warming():
                key = self.table.run_key(run_id)
            if key is not None:
                self._keep(run_id, key)
        return key

    def lost(self, run_id: str) -> None:
        """KeyLost if run ``run_id``, running, has no key though its steps sent messages (its chain of deadlines
        started, or it went past its first iteration): its key item was deleted (read where a key is missing)."""
        try:
            run = self.table.get_run(run_id)
        except NotFoundError:
            return
        if run.status == RunStatus.RUNNING and (run.watched is not None or run.iteration > 0):
            raise KeyLost(
                f"run {run_id!r} lost its message key (its {KEY} item was deleted behind the pipeline's back): no"
                " message of the run can be proven"
            )

    def sign(self, message: M) -> M:
        """``message`` with its proof."""
        return message.model_copy(update={"proof": digest(message, self.signing(message.run_id))})

    def problem(self, message: Message) -> str | None:
        """Why ``message``'s proof does not hold, or None; KeyLost if its run lost its key (``lost``)."""
        if not message.proof:
            return "it carries no proof of origin: not sent by the pipeline"
        key = self.checking(message.run_id)
        if key is None:
            self.lost(message.run_id)
            return f"run {message.run_id!r} has no message key: no step of it sent a message"
        if hmac.compare_digest(message.proof, digest(message, key)):
            return None
        # the key this container keeps may be gone: a run failed for its lost key is ended under one made anew
        fresh = self.checking(message.run_id, fresh=True)
        if fresh is None or fresh == key or not hmac.compare_digest(message.proof, digest(message, fresh)):
            return f"its proof of origin does not hold under run {message.run_id!r}'s key: forged, changed or another's"
        return None

    def sign_object(self, run_id: str, object_key: str, body: bytes) -> dict[str, str]:
        """The user metadata that proves run ``run_id``'s pipeline stored ``body`` at ``object_key``."""
        return {OBJECT_PROOF: object_digest(object_key, body, self.signing(run_id))}

    def object_problem(self, run_id: str, object_key: str, body: bytes, metadata: Mapping[str, str]) -> str | None:
        """Why the object at ``object_key`` (its bytes and user metadata as read) is not the one run ``run_id``'s
        pipeline stored there, naming it; None if it is."""
        key = self.checking(run_id)
        proof = metadata.get(OBJECT_PROOF, "")
        if key is None or not hmac.compare_digest(proof, object_digest(object_key, body, key)):
            return (
                f"{object_key} is not the object the pipeline stored there: it was replaced behind the pipeline's back"
                " (its proof of origin does not hold)"
            )
        return None
