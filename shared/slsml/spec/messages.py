"""The messages the pipeline functions exchange over SNS. Versioned: a reader accepts its own
``schema_version`` and rejects others with a clear error, so formats can grow without breaking runs.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal
from urllib.parse import unquote_plus

from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

from slsml.spec import keys

# the message attributes Lambda attaches to an event it dead-letters (a function's asynchronous-invocation DLQ):
# the HTTP status of the failed invocation, the error's message (its first KB) and the last invocation's id
DEAD_LETTER_ERROR_CODE = "ErrorCode"
DEAD_LETTER_ERROR_MESSAGE = "ErrorMessage"
DEAD_LETTER_REQUEST_ID = "RequestID"

BATCH_ENTRIES = 10  # SNS PublishBatch limits: 10 entries…
BATCH_BYTES = 256 * 1024  # …and 256 KiB in all
PARALLEL_BATCHES = 16  # PublishBatch calls of one publish in flight at once (slsml.pipeline.bus)
MAX_MESSAGE_BYTES = 128 * 1024  # the biggest real message, a Reduce for 1000 workers, is 81 KiB; SNS allows 256
# the ETag S3 gives an object stored whole (the MD5 of its bytes) or in parts (the MD5 of theirs, "-", their count),
# quoted: every GET (a ranged one too) answers it, so an object a message names by it is checked at no extra request
ETAG_PATTERN = r'^"[0-9a-f]{32}(-[0-9]+)?"$'
# the most values a WorkDone's metrics state holds (AUC: 4 per threshold): a WorkDone of them, at 25 JSON bytes a
# value at most, stays within MAX_MESSAGE_BYTES
MAX_METRIC_VALUES = 4096


class Message(BaseModel):
    # a float that is not finite (a metric's state: Keras gives NaN and Inf) travels as its name ("NaN", "Infinity")
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")

    schema_version: Literal[1] = 1
    run_id: str = Field(min_length=1, max_length=63)
    iteration: int = Field(ge=0)
    generation: int = Field(default=0, ge=0, description="how often the run was resumed when this was sent")
    proof: str = Field(
        default="",
        max_length=128,
        description="the kind of step that sent it and its ECDSA signature of the message without it, under that"
        " kind's key of its run (slsml.pipeline.proof)",
    )


class WorkMessage(Message):
    """WorkLauncher → Worker: compute your slice of the global batches of ``iteration``."""

    worker: int = Field(ge=0)
    workers: int = Field(ge=1, description="the workers the iteration was launched with (its slices)")
    attempt: int = Field(default=0, ge=0)
    resume: int = Field(
        default=0,
        ge=0,
        description="> 0: a continuation (the same attempt, in a fresh invocation): go on from the round's progress"
        " after this many micro-batches (keys.progress)",
    )
    waited: int = Field(
        default=0,
        ge=0,
        description="a pipeline stage's continuation handed on as it waited, having computed no pass: how many in a"
        " row after ``resume`` passes (slsml.pipeline.staged)",
    )
    ahead: bool = Field(
        default=False,
        description="launched as the reduce of the iteration before fired, its model not merged (stale_weights):"
        " train from the weights predicted from the last two models",
    )
    pipeline_stage: int = Field(
        default=0,
        ge=0,
        le=63,
        description="the pipeline stage of the worker's round this invocation computes (pipeline_stages > 1): stage 0"
        " reads the samples and stores the update, the others compute their stage's layers (slsml.pipeline.staged)",
    )
    update: int | None = Field(
        default=None,
        ge=0,
        description="ASP (staleness unbounded): the number of the update it computes, which names the synchronous"
        " run's slot and round whose batches it takes (barrier.asynchronous_updates)",
    )

    def staged(self, stages: int) -> list[WorkMessage]:
        """This message as one per pipeline stage of the worker's round (one stage: itself); the final model, past
        the run's iterations, is evaluated through the stages too."""
        return [self.model_copy(update={"pipeline_stage": stage}) for stage in range(stages)]


class WorkDone(Message):
    """Worker → ReduceLauncher: my update is in S3."""

    worker: int = Field(ge=0)
    attempt: int = Field(default=0, ge=0)
    samples: int = Field(ge=0)
    loss: float = Field(description="0 when the update is not finite (JSON has no NaN)")
    metrics: list[float] | None = Field(
        default=None,
        max_length=MAX_METRIC_VALUES,
        description="the state of the loss and compiled metrics over the worker's batches, on their forward passes"
        " (slsml.training.evaluation), NaN and Inf as Keras's metrics hold them; None when the update is not finite",
    )
    compute_s: float = Field(ge=0, description="gradient computation, excluding S3 and messaging")
    finite: bool = Field(default=True, description="False: the update holds NaN or Inf and must be left out")
    stale: bool = Field(
        default=False, description="computed on the weights one round stale (``stale_weights``), its model not merged"
    )
    etag: str = Field(
        pattern=ETAG_PATTERN,
        description="the update's ETag as S3 gave it: its readers take only the object of these bytes",
    )


class Participant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    worker: int = Field(ge=0)
    attempt: int = Field(default=0, ge=0)
    samples: int = Field(ge=0)
    iteration: int | None = Field(
        default=None, ge=0, description="a late update folded in (bounded staleness): the iteration it is of"
    )
    etag: str = Field(pattern=ETAG_PATTERN, description="its update's ETag, as the worker reported it (WorkDone)")

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        """In JSON (a Reduce message lists up to thousands) without the defaults most participants have: attempt 0
        and no iteration; read back as those defaults."""
        fields: dict[str, Any] = handler(self)
        if info.mode_is_json():
            for name in ("attempt", "iteration"):
                if fields.get(name) == Participant.model_fields[name].default:
                    del fields[name]
        return fields


class ReduceMessage(Message):
    """ReduceLauncher → Reducer: average these workers' parts of your shard and step the optimizer."""

    shard: int = Field(ge=0)
    participants: tuple[Participant, ...] = Field(min_length=1)
    attempt: int = Field(default=0, ge=0, description="> 0: re-launched by the watchdog")
    squares: dict[str, float] | None = Field(
        default=None,
        description="runs that clip by norm: every shard's sums of squares are in, these are their"
        " totals; step with your stored average (see slsml.training.clipping)",
    )


class ReduceDone(Message):
    """Reducer → Merger: the new weights of my shard are in S3."""

    shard: int = Field(ge=0)
    updates: int = Field(
        default=1, ge=1, description="the updates the reduce applied (ASP: the model versions it advances)"
    )


class ModelMerged(Message):
    """Merger → WorkLauncher, on ModelUpdated: the manifest of the weights entering ``iteration`` is stored in the
    run's ``generation``: launch it. (The initial model, placed by the run's execution, launches iteration 0 by its S3
    event.)"""

    iteration: int = Field(ge=1)


class Deadline(Message):
    """WorkLauncher/Watchdog → Watchdog, through a delayed queue: look at ``iteration`` at ``due_at``.

    ``stage`` is the barrier being watched and ``round`` how many deadlines of that stage passed; ``end``, sent by a
    step that may not answer the run's execution (the Worker), asks the watchdog to, as the run's record says.
    """

    stage: Literal["work", "reduce", "end"]
    round: int = Field(ge=0)
    due_at: float = Field(ge=0, description="epoch seconds")
    resent: int = Field(default=0, ge=0, description="times it came early and was sent on (a new message each time)")
    link: int = Field(default=0, ge=0, description="its place in the run's chain of deadlines (one pending at a time)")


class _S3Object(BaseModel):
    model_config = ConfigDict(extra="ignore")
    key: str
    eTag: str | None = None
    sequencer: str | None = None


class _S3Entity(BaseModel):
    model_config = ConfigDict(extra="ignore")
    object: _S3Object


class _S3Record(BaseModel):
    model_config = ConfigDict(extra="ignore")
    eventName: str
    s3: _S3Entity


class S3Notification(BaseModel):
    """The body of a ModelUpdated message: an S3 event, or the test event S3 sends on configuration.

    Only the fields slsml reads are required, so any S3-compatible event source works.
    """

    model_config = ConfigDict(extra="ignore")

    Records: list[_S3Record] = Field(default_factory=list)
    Event: str | None = None


class ModelLanded(BaseModel):
    """One object created under a watched prefix (key URL-decoded)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    sequencer: str


def landed_objects(notification: S3Notification) -> list[ModelLanded]:
    return [
        ModelLanded(key=unquote_plus(r.s3.object.key), sequencer=r.s3.object.sequencer or r.s3.object.eTag or "")
        for r in notification.Records
        if r.eventName.startswith("ObjectCreated")
    ]


class Manifest(BaseModel):
    """The trigger of an iteration past the first (``keys.manifest``), stored by the Merger: the ETags of the R shards
    that hold the weights entering it, as it found them stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    iteration: int = Field(ge=1)
    shards: list[str]
    model_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="the SHA-256 of the model entering the iteration (models/<iteration>.keras), where the Merger"
        " stored it before the manifest (one a run may end on): the final copy of it is checked against it",
    )


class RunStarted(BaseModel):
    """Run state machine → WorkLauncher: the run is registered; report its end with this token."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    run_id: str = Field(min_length=1, max_length=63)
    task_token: str = Field(min_length=1)


# What the WorkLauncher receives: a run started (task token), a model merged (the Merger) or landed (S3 event).
LauncherEvent = Annotated[RunStarted | ModelMerged | S3Notification, Field(union_mode="left_to_right")]


def run_named(message: str) -> str | None:
    """The run a pipeline message names, whatever its type: its ``run_id``, or for an S3 event the run of
    a model it is about (None for a message of any other shape)."""
    try:
        parsed = json.loads(message)
    except (TypeError, ValueError):
        return None
    if not isinstance(parsed, dict):
        return None
    if isinstance(parsed.get("run_id"), str):
        return parsed["run_id"]
    records = parsed.get("Records")
    for record in records if isinstance(records, list) else []:
        try:
            key = keys.parse_model_key(unquote_plus(record["s3"]["object"]["key"]))  # S3 events encode keys
        except (KeyError, TypeError):
            continue
        if key:
            return key[0]
    return None
