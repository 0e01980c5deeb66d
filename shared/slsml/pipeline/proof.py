"""Proof of origin: every pipeline message carries a signature of what it says by the kind of step that sent it, under
that kind's signing key of its run, and a step acts on a message only if its proof holds (``envelope.admit`` checks
it before anything else): the signer is one of the kinds that send that message (``wiring.senders``) and the
signature verifies with its public key. A forged message (no key), one replayed from another run (another key), one
changed on its way (another body) and one made by a kind that does not send it (a Worker's ReduceDone) are refused.
An object that launches a step and that steps trust for what it names (an iteration's manifest) carries the same
proof, of its key and bytes, in its user metadata (``OBJECT_PROOF``), by a kind that writes it (``wiring.writers``):
one put over it is refused by its readers.

The keys: one ECDSA P-256 key pair per run and signing kind (``wiring.SIGNERS``), made by KMS as the run is launched
(``GenerateDataKeyPairWithoutPlaintext``, by the step that launches it: ``wiring.Function.makes_run_keys``) so that
no step ever holds another kind's private key. Each private key is sealed under the deployment's KMS key with the
encryption context {run, kind}; each role may unseal (``kms:Decrypt``) only with its own kind in the context (the
deployment's key policy, ``deployment.key_policy_statements``), once per container and run, into the warm cache. The
public keys and sealed private keys are one create-once item of the run table (``RunTable.make_run_keys``), read once
per container and run. The step that makes them vouches for the public keys: it has KMS encrypt their digest
(``keys_digest``) under the encryption context {run, kind: ``VOUCH``} (``kms:Encrypt``, which the key's policy denies
every other role), stored with them; whoever reads the item unseals that (``kms:Decrypt`` of the ``VOUCH`` kind, open
to every role) and takes its keys only if the digest is theirs, once per container and run, as it reads them:
verifying a message takes no request. An item that a role able to write the run table put (before the launch, or over
the one it made) fails the run naming it (``KeyForged``): no role but the launcher's can vouch for keys. Each run has
its own keys, so a key that leaked opens one kind of one run alone.

A run that sent messages and finds its keys gone (its KEY item deleted) gets none made anew: while it runs, the
first step that needs them fails it, naming the item (``KeyLost``); once it ended, what its steps send carries no
proof and is refused, but for the watchdog's end of its execution (``ends_execution``), which acts on the run's
record alone.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from botocore.exceptions import ClientError
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_der_private_key, load_der_public_key

from slsml.accounting import usage
from slsml.aws import cache as warm_cache
from slsml.spec import wiring
from slsml.spec.deployment import KEY_PAIR_SPEC, VOUCH
from slsml.spec.errors import KeyForged, KeyLost, NotFoundError, SlsmlError
from slsml.spec.messages import Deadline, Message
from slsml.state.records import KEY, RunStatus
from slsml.state.runtable import RunKeyItem, RunTable, SealedKey

OBJECT_PROOF = "proof"  # the user metadata that holds a signed object's proof of origin
KEY_BYTES = 512  # what a run's public keys or one private key hold in the warm cache, about
# deterministic (RFC 6979): a message signed twice (a retry's) carries the same proof, as it says the same
_SIGNATURE = ec.ECDSA(hashes.SHA256(), deterministic_signing=True)
M = TypeVar("M", bound=Message)


def message_body(message: Message) -> bytes:
    """What a message's proof signs: its type and its JSON without the proof."""
    return f"{type(message).__name__}\n{message.model_dump_json(exclude={'proof'})}".encode()


def object_body(object_key: str, body: bytes) -> bytes:
    """What an object's proof signs: its S3 key and its bytes (one object's is no other key's)."""
    return f"{object_key}\n".encode() + body


def context(run_id: str, kind: str) -> dict[str, str]:
    """The KMS encryption context a kind's private key of a run is sealed with."""
    return {"run": run_id, "kind": kind}


def keys_digest(run_id: str, keys: Mapping[str, SealedKey]) -> bytes:
    """The SHA-256 of run ``run_id``'s public keys, by kind: what the launcher vouches for."""
    listed = b"".join(f"{kind}\n".encode() + keys[kind].public + b"\n" for kind in sorted(keys))
    return hashlib.sha256(f"{run_id}\n".encode() + listed).digest()


def proof(kind: str, signature: bytes) -> str:
    """A proof: the kind that signed and its signature (base64url)."""
    return f"{kind}:{base64.urlsafe_b64encode(signature).decode()}"


def parsed(found: str) -> tuple[str, bytes] | None:
    """A proof's kind and signature; None if it is not one."""
    kind, _, signature = found.partition(":")
    try:
        return kind, base64.urlsafe_b64decode(signature.encode())
    except ValueError:
        return None


@dataclass(frozen=True)
class _Public:
    """A run's public keys, by kind."""

    keys: dict[str, ec.EllipticCurvePublicKey]

    def holds(self, kind: str, signature: bytes, body: bytes) -> bool:
        key = self.keys.get(kind)
        if key is None:
            return False
        try:
            key.verify(signature, body, _SIGNATURE)
        except InvalidSignature:
            return False
        return True


class RunKeys:
    """Runs' keys: the signing key of this step's kind (``kind``; None: the deployment's owner, who signs as the first
    kind that sends what it signs) and every kind's public key, read (or, by the step that launches runs, made) once
    per container and run."""

    def __init__(self, table: RunTable, kms: Any, sealing_key: str | None, kind: str | None) -> None:
        self.table, self.kms, self.sealing_key, self.kind = table, kms, sealing_key, kind

    def _public(self, run_id: str) -> _Public | None:
        found: _Public | None = warm_cache.warm().get(("run-public-keys", run_id))
        if found is None:
            with usage.warming():
                item = self.table.run_keys(run_id)
                if item is None:
                    return None
                found = self._keep_public(run_id, self._vouched(run_id, item))
        return found

    def _vouched(self, run_id: str, item: RunKeyItem) -> dict[str, SealedKey]:
        """The run's keys in ``item``, once the launcher's vouch for them holds (one KMS Decrypt); KeyForged naming the
        item if it does not."""
        if not self.sealing_key:
            raise SlsmlError(f"{wiring.SIGNING_KEY_ENV} is not set: is this function deployed by slsml?")
        digest = None
        if item.vouched is not None:
            try:
                digest = self.kms.decrypt(
                    KeyId=self.sealing_key, CiphertextBlob=item.vouched, EncryptionContext=context(run_id, VOUCH)
                )["Plaintext"]
            except ClientError as error:
                if error.response["Error"]["Code"] != "InvalidCiphertextException":
                    raise
        if digest != keys_digest(run_id, item.keys):
            raise KeyForged(
                f"run {run_id!r}'s signing keys (its {KEY} item) are not the ones its launch made: the item was put"
                " behind the pipeline's back (no vouch of the launch holds for its public keys)"
            )
        return item.keys

    def _keep_public(self, run_id: str, sealed: Mapping[str, SealedKey]) -> _Public:
        public = _Public({kind: _public_key(key.public) for kind, key in sealed.items()})
        return warm_cache.warm().put(("run-public-keys", run_id), public, KEY_BYTES * len(sealed))

    def _made(self, run_id: str) -> RunKeyItem:
        """Every signing kind's key pair of the run, made by KMS, private keys sealed, and the vouch for their public
        keys: the ones stored either way."""
        if self.kind is not None and not wiring.function(self.kind).makes_run_keys:
            raise RuntimeError(f"run {run_id!r} has no signing keys: the step that launches it makes them")
        made = {}
        for kind in wiring.SIGNERS:
            pair = self.kms.generate_data_key_pair_without_plaintext(
                KeyId=self.sealing_key, KeyPairSpec=KEY_PAIR_SPEC, EncryptionContext=context(run_id, kind)
            )
            made[kind] = SealedKey(public=pair["PublicKey"], sealed=pair["PrivateKeyCiphertextBlob"])
        vouched = self.kms.encrypt(
            KeyId=self.sealing_key, Plaintext=keys_digest(run_id, made), EncryptionContext=context(run_id, VOUCH)
        )["CiphertextBlob"]
        return self.table.make_run_keys(run_id, RunKeyItem(made, vouched))

    def _signing(self, run_id: str, kind: str) -> ec.EllipticCurvePrivateKey | None:
        """``kind``'s private key of the run, unsealed (the run's keys made if it has none); None if the run lost its
        keys and ended, KeyLost if it lost them running (``lost``)."""
        warm = warm_cache.warm()
        key: ec.EllipticCurvePrivateKey | None = warm.get(("signing-key", run_id, kind))
        if key is None:
            if not self.sealing_key:
                raise SlsmlError(f"{wiring.SIGNING_KEY_ENV} is not set: is this function deployed by slsml?")
            with usage.warming():
                item = self.table.run_keys(run_id)
                if item is None and self.lost(run_id):
                    return None
                sealed = self._vouched(run_id, item or self._made(run_id))
                self._keep_public(run_id, sealed)
                plain = self.kms.decrypt(
                    KeyId=self.sealing_key, CiphertextBlob=sealed[kind].sealed, EncryptionContext=context(run_id, kind)
                )["Plaintext"]
            unsealed = load_der_private_key(plain, password=None)
            assert isinstance(unsealed, ec.EllipticCurvePrivateKey)
            key = warm.put(("signing-key", run_id, kind), unsealed, KEY_BYTES)
        return key

    def _sign(self, run_id: str, kinds: tuple[str, ...], body: bytes) -> str:
        """A proof of ``body`` by this step's kind; none ("") if the run lost its keys and ended."""
        kind = self.kind if self.kind is not None else (kinds or wiring.SIGNERS)[0]
        key = self._signing(run_id, kind)
        return "" if key is None else proof(kind, key.sign(body, _SIGNATURE))

    def lost(self, run_id: str) -> bool:
        """Whether run ``run_id``, which has no keys, lost them: its steps sent messages (its chain of deadlines
        started, or it went past its first iteration), so its KEY item was deleted; KeyLost, naming it, if it is
        running."""
        try:
            run = self.table.get_run(run_id)
        except NotFoundError:
            return False
        if run.watched is None and run.iteration == 0:
            return False
        if run.status == RunStatus.RUNNING:
            raise KeyLost(
                f"run {run_id!r} lost its signing keys (its {KEY} item was deleted behind the pipeline's back): no"
                " message of the run can be proven"
            )
        return True

    def sign(self, message: M) -> M:
        """``message`` with its proof."""
        signed = self._sign(message.run_id, wiring.senders(type(message).__name__), message_body(message))
        return message.model_copy(update={"proof": signed})

    def problem(self, message: Message) -> str | None:
        """Why ``message``'s proof does not hold, or None; KeyLost if its run lost its keys running (``lost``). The
        watchdog's end of the execution of a run that lost its keys and ended is admitted without proof
        (``ends_execution``): none can hold, and the end does what the run's record says alone."""
        unproven = self._unproven(message)
        if unproven is None or not ends_execution(message):
            return unproven
        # this container may keep the keys the run lost
        return None if self.table.run_keys(message.run_id) is None and self.lost(message.run_id) else unproven

    def _unproven(self, message: Message) -> str | None:
        if not message.proof:
            return "it carries no proof of origin: not sent by the pipeline"
        found = parsed(message.proof)
        kind = "" if found is None else found[0]
        name = type(message).__name__
        if kind not in (senders := wiring.senders(name)):
            return (
                f"its proof of origin names {kind or 'no kind'!r}, which does not send {name}: {', '.join(senders)} do"
            )
        public = self._public(message.run_id)
        if public is None:
            if self.lost(message.run_id):
                return f"run {message.run_id!r} lost its signing keys: no message of the run can be proven"
            return f"run {message.run_id!r} has no signing keys: no step of it sent a message"
        assert found is not None
        if not public.holds(kind, found[1], message_body(message)):
            return (
                f"its proof of origin does not hold under run {message.run_id!r}'s {kind} key: forged, changed or"
                " another's"
            )
        return None

    def sign_object(self, run_id: str, object_key: str, body: bytes) -> dict[str, str]:
        """The user metadata that proves run ``run_id``'s pipeline stored ``body`` at ``object_key``."""
        return {OBJECT_PROOF: self._sign(run_id, wiring.writers(object_key), object_body(object_key, body))}

    def object_problem(self, run_id: str, object_key: str, body: bytes, metadata: Mapping[str, str]) -> str | None:
        """Why the object at ``object_key`` (its bytes and user metadata as read) is not the one run ``run_id``'s
        pipeline stored there, naming it; None if it is."""
        found = parsed(metadata.get(OBJECT_PROOF, ""))
        if (public := self._public(run_id)) is None:
            self.lost(run_id)  # KeyLost if the run lost its keys running: not an object replaced
        if (
            found is None
            or public is None
            or found[0] not in wiring.writers(object_key)
            or not public.holds(found[0], found[1], object_body(object_key, body))
        ):
            return (
                f"{object_key} is not the object the pipeline stored there: it was replaced behind the pipeline's back"
                " (its proof of origin does not hold)"
            )
        return None


def ends_execution(message: Message) -> bool:
    """Whether ``message`` is the watchdog's end of a run's execution, asked by a step that failed the run
    (``Services.ask_watchdog``): it reads the run's record and nothing of the message but its run and generation."""
    return isinstance(message, Deadline) and message.stage == "end"


def _public_key(der: bytes) -> ec.EllipticCurvePublicKey:
    loaded = load_der_public_key(der)
    assert isinstance(loaded, ec.EllipticCurvePublicKey)
    return loaded
