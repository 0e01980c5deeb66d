"""Fault injection for the local runtime: duplicated and delayed deliveries, crashing and hanging
functions, a straggling worker and slow S3 reads, seeded and reproducible.

Every decision is a hash of the seed, the kind of fault and what it applies to: a message's
identity (its topic and the fields that name it: run, iteration, worker, shard, attempt; the object
keys of an S3 event), and for S3 reads also the key and byte range. The same run id, seed and
settings inject the same faults, however the messages interleave.

``Faults`` is what a user sets (``FunctionHost.faults``, ``Faults.parse`` for a command line). The
host turns it into an ``InvocationFaults`` for each invocation; inside the function process, hooks
on the AWS clients (``install``) act on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slsml.spec import keys
from slsml.spec.config import RegularExpression
from slsml.spec.errors import described

CRASH_KINDS = {"worker": "worker_crash", "reducer": "reducer_crash", "merger": "merger_crash"}
INJECTED_MARK = "InjectedFault"  # how an injected crash reads in an invocation's error
# where an invocation crashes: before any work, before announcing it, before writing a model; or it hangs
CrashPoint = Literal["start", "publish", "model_put", "hang"]


class InjectedFault(RuntimeError):
    """A crash that fault injection caused on purpose."""


class Delay(BaseModel):
    """With ``probability``, wait ``seconds``. Written ``probability:seconds`` (``0.2:1.5``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    probability: float = Field(ge=0, le=1)
    seconds: float = Field(ge=0)

    def __str__(self) -> str:
        return f"{self.probability:g}:{self.seconds:g}"


class SlowWorker(BaseModel):
    """Worker ``worker`` is ``seconds`` slow (or late) on every message. Written ``worker:seconds`` (``7:4``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    worker: int = Field(ge=0)
    seconds: float = Field(ge=0)

    def __str__(self) -> str:
        return f"{self.worker}:{self.seconds:g}"


# the faults of two values, written ``name=first:second``: their two fields and an example
_PAIRS = {
    "s3_get_delay": ("probability", "seconds", "0.2:1.5"),
    "sns_delay": ("probability", "seconds", "0.2:1.5"),
    "slow_worker": ("worker", "seconds", "7:4"),
    "late_worker": ("worker", "seconds", "7:4"),
}


class Faults(BaseModel):
    """What to inject into a local run. Probabilities are per message (per read for S3 delays)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(default=0, ge=0)
    duplicate: float = Field(default=0.0, ge=0, le=1, description="a message is delivered twice")
    worker_crash: float = Field(default=0.0, ge=0, le=1, description="a Worker fails on its first receive")
    reducer_crash: float = Field(default=0.0, ge=0, le=1, description="a Reducer fails on its first receive")
    worker_hang: float = Field(
        default=0.0, ge=0, le=1, description="a Worker hangs on its first receive until it times out (hang_s)"
    )
    hang_s: float = Field(
        default=30.0, gt=0, description="how long a hung invocation runs before it times out: the function's timeout"
    )
    crash_every_receive: bool = Field(
        default=False, description="worker and reducer crashes and worker hangs hit every receive, retries included"
    )
    slow_worker: SlowWorker | None = Field(
        default=None, description="this worker sleeps this long at the start of every invocation: a straggler"
    )
    late_worker: SlowWorker | None = Field(
        default=None,
        description="this worker's every message is held back this long before its invocation (a delivery or start"
        " that comes late): a straggler that no timeout ends",
    )
    merger_crash_once: bool = Field(
        default=False, description="the Merger fails once per run, just before it writes the run's first merged model"
    )
    s3_get_delay: Delay | None = Field(default=None, description="an S3 GetObject in a function is delayed")
    s3_get_delay_match: RegularExpression | None = Field(
        default=None, description="regular expression: only GETs of keys it matches are delayed"
    )
    sns_delay: Delay | None = Field(default=None, description="the host holds a received message back")
    sns_delay_match: RegularExpression | None = Field(
        default=None,
        description="regular expression: only messages whose identity (topic|run_id=…,iteration=…,worker=…, as the"
        " host names a message) it matches are held back",
    )

    @classmethod
    def parse(cls, text: str) -> Faults:
        """``"duplicate=0.5,worker_crash=0.25,s3_get_delay=0.2:1.5,merger_crash_once,seed=3"`` → Faults.
        Flags (``merger_crash_once``, ``crash_every_receive``) need no value; ``slow_worker=7:4`` and
        ``late_worker=7:4`` are worker:seconds.

        Raises ValueError naming the bad item. An empty string means no faults.
        """
        values: dict[str, Any] = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            name, has_value, value = (s.strip() for s in item.partition("="))
            if name not in cls.model_fields:
                known = ", ".join(cls.model_fields)
                raise ValueError(f"unknown fault {name!r} in {text!r} (known: {known})")
            if name in values:
                raise ValueError(f"fault {name!r} given twice in {text!r}")
            if not has_value:
                if cls.model_fields[name].annotation is not bool:
                    raise ValueError(f"fault {name!r} needs a value ({name}=...)")
                value = "true"
            if name in _PAIRS:
                first_name, second_name, example = _PAIRS[name]
                first, colon, second = value.partition(":")
                if not colon:
                    raise ValueError(
                        f"{name} is written {first_name}:{second_name}, e.g. {name}={example}, not {value!r}"
                    )
                values[name] = {first_name: first, second_name: second}
            else:
                values[name] = value
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            raise ValueError(f"invalid faults {text!r}: {described(error)}") from None

    def __str__(self) -> str:
        """The ``parse`` form of the faults that are set (``""`` when none are)."""
        items = [f"seed={self.seed}"] if self.seed and self.active else []
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if name != "seed" and value != field.default:
                items.append(name if value is True else f"{name}={value}")
        return ",".join(items)

    @property
    def active(self) -> bool:
        return bool(
            self.duplicate
            or self.worker_crash
            or self.reducer_crash
            or self.worker_hang
            or self.merger_crash_once
            or (self.s3_get_delay and self.s3_get_delay.probability)
            or (self.sns_delay and self.sns_delay.probability)
            or self.slow_worker
            or self.late_worker
        )

    # decisions (the host makes them)
    def happens(self, kind: str, probability: float, *subject: object) -> bool:
        return probability > 0 and chance(self.seed, kind, *subject) < probability

    def duplicates(self, identity: str) -> bool:
        return self.happens("duplicate", self.duplicate, identity)

    def held_back(self, identity: str, receives: int) -> float:
        """Seconds to hold a received message back before dispatching it (0: none)."""
        delay, match = self.sns_delay, self.sns_delay_match
        if match and not re.search(match, identity):
            return 0.0
        if delay and self.happens("sns_delay", delay.probability, identity, receives):
            return delay.seconds
        return 0.0

    def late(self, function: str, identity: str) -> float:
        """Seconds to hold a message of ``function`` back as the late worker's (0: none)."""
        late = self.late_worker
        return late.seconds if late and function == "worker" and _worker_of(identity) == late.worker else 0.0

    def for_invocation(self, function: str, identity: str, receives: int, merge_crash: bool) -> InvocationFaults:
        """What one invocation of ``function`` on a message gets; ``merge_crash``: the run's Merger has
        not crashed yet (the host keeps track)."""
        crash: CrashPoint | None = None
        if receives == 1 or self.crash_every_receive:
            probability = {"worker": self.worker_crash, "reducer": self.reducer_crash}.get(function, 0.0)
            if self.happens(f"{function}_crash", probability, identity):
                # before any work, or after the work is stored but before it is announced
                crash = "start" if chance(self.seed, "crash_point", identity) < 0.5 else "publish"
            elif function == "worker" and self.happens("worker_hang", self.worker_hang, identity):
                crash = "hang"
        if crash is None and receives == 1 and function == "merger" and self.merger_crash_once and merge_crash:
            crash = "model_put"
        slow = self.slow_worker
        slow_s = slow.seconds if slow and function == "worker" and _worker_of(identity) == slow.worker else 0.0
        return InvocationFaults(
            seed=self.seed,
            identity=identity,
            crash=crash,
            hang_s=self.hang_s,
            slow_s=slow_s,
            s3_get_delay=self.s3_get_delay,
            s3_get_delay_match=self.s3_get_delay_match,
        )


class InvocationFaults(BaseModel):
    """The faults of one invocation, sent to the function process with it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    identity: str = ""
    crash: CrashPoint | None = None
    hang_s: float = 30.0  # a "hang" crash: how long before the invocation times out
    slow_s: float = 0.0  # sleep before doing anything
    s3_get_delay: Delay | None = None
    s3_get_delay_match: str | None = None
    # a file the host creates once these faults are lifted or replaced (``FunctionHost.faults``): a delayed read
    # still waiting then ends at once, as one started after it would not be delayed
    lifted: str | None = None


def chance(seed: int, *subject: object) -> float:
    """A number in [0, 1) that depends only on ``seed`` and ``subject``."""
    text = "\x1f".join(str(part) for part in (seed, *subject))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64


_IDENTITY_FIELDS = ("run_id", "iteration", "worker", "shard", "attempt")


def _worker_of(identity: str) -> int | None:
    """The worker a message's identity names, if any."""
    fields = dict(part.split("=", 1) for part in identity.partition("|")[2].split(",") if "=" in part)
    worker = fields.get("worker", "")
    return int(worker) if worker.isdigit() else None


def message_identity(body: dict[str, Any]) -> str:
    """What names a queued SNS message across runs: its topic and the fields that say what it is
    about (not its id, timestamps or measurements)."""
    topic = str(body.get("TopicArn", "")).rsplit(":", 1)[-1]
    try:
        message = json.loads(body["Message"])
    except (KeyError, TypeError, ValueError):
        return f"{topic}|{body.get('MessageId', '')}"
    if not isinstance(message, dict):
        return f"{topic}|{message!r}"
    if isinstance(message.get("Records"), list):  # an S3 event
        objects = sorted(
            f"{r.get('eventName', '')}:{_object_key(r)}" for r in message["Records"] if isinstance(r, dict)
        )
        return f"{topic}|" + ",".join(objects)
    return f"{topic}|" + ",".join(f"{k}={message[k]}" for k in _IDENTITY_FIELDS if k in message)


def _object_key(record: dict[str, Any]) -> str:
    s3 = record.get("s3")
    obj = s3.get("object") if isinstance(s3, dict) else None
    return str(obj.get("key", "")) if isinstance(obj, dict) else ""


# ---- inside a function process ------------------------------------------------------------------

_lock = threading.Lock()
_current: tuple[InvocationFaults, Counter] | None = None


@contextmanager
def invocation(plan: InvocationFaults | None) -> Iterator[Counter]:
    """Apply ``plan`` to the AWS calls made until the block ends; yields the counts of what was injected."""
    global _current
    injected: Counter = Counter()
    with _lock:
        _current = (plan, injected) if plan is not None else None
    try:
        if plan is not None:
            time.sleep(plan.slow_s)
            if plan.crash == "start":
                _crash(plan, "before doing anything")
            if plan.crash == "hang":  # a hung invocation: it runs until its timeout, as Lambda reports one
                time.sleep(plan.hang_s)
                raise InjectedFault(f"Task timed out after {plan.hang_s:.2f} seconds (injected hang): {plan.identity}")
        yield injected
    finally:
        with _lock:
            _current = None


def install(s3: Any, sns: Any) -> None:
    """Hook fault injection into this process's S3 and SNS clients (the ones the functions use)."""
    s3.meta.events.register("before-parameter-build.s3.GetObject", _on_get_object, unique_id="slsml-faults-get")
    s3.meta.events.register("before-parameter-build.s3.PutObject", _on_put_object, unique_id="slsml-faults-put")
    for operation in ("Publish", "PublishBatch"):
        sns.meta.events.register(
            f"before-parameter-build.sns.{operation}", _on_publish, unique_id=f"slsml-faults-{operation}"
        )


def _crash(plan: InvocationFaults, where: str) -> None:
    raise InjectedFault(f"injected crash ({plan.crash}) {where}: {plan.identity}")


def _on_get_object(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    current = _current
    if current is None or context.get("is_presign_request"):  # a URL signed, nothing read (slsml.aws.ranged)
        return
    plan, injected = current
    delay, key = plan.s3_get_delay, params.get("Key", "")
    if delay is None or (plan.s3_get_delay_match and not re.search(plan.s3_get_delay_match, key)):
        return
    if delay.probability > 0 and chance(plan.seed, "s3_get_delay", plan.identity, key, params.get("Range")) < (
        delay.probability
    ):
        with _lock:
            injected["s3_get_delay"] += 1
        _wait_unless_lifted(delay.seconds, plan.lifted)


LIFT_POLL_S = 0.05  # how often a delayed read looks whether its faults were lifted


def _wait_unless_lifted(seconds: float, lifted: str | None) -> None:
    """Wait ``seconds``, or until the file ``lifted`` names exists (None: the whole time)."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        if lifted is not None and os.path.exists(lifted):
            return
        time.sleep(min(left, LIFT_POLL_S) if lifted is not None else left)


def _on_put_object(params: dict[str, Any], **_: Any) -> None:
    current = _current
    if current is not None and current[0].crash == "model_put" and keys.parse_model_key(params.get("Key", "")):
        _crash(current[0], f"before writing {params['Key']}")


def _on_publish(**_: Any) -> None:
    current = _current
    if current is not None and current[0].crash == "publish":
        _crash(current[0], "after its work was stored, before announcing it")
