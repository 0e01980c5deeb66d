"""What the run table holds, and how it is encoded in DynamoDB.

One partition per run (``pk = RUN#<run>``). Per run a ``META`` item (its state, and its training spec
stored once, as JSON) and, in a run with a budget, a ``SPEND`` item (the dollars its functions spent so far,
which each of them adds to: ``slsml.pipeline.spend``); per iteration a counter item of
fixed size (``ITER#<i>``: launch, counts, who fired the reduce and the merge, test figures), one record
per worker that reported (``ITER#<i>#W#<w>``), the participants the reduce was fired with (``ITER#<i>#P``,
written once), a record per shard whose reducer left parts out (``ITER#<i>#S#<s>``), and, in runs that
clip by norm, each shard's sums of squares (``ITER#<i>#N#<s>``, see ``slsml.training.clipping``). No item on the
per-iteration path grows with the number of workers or reducers, so every report costs the same
write units whatever the fleet's size. The ``META`` item alone carries ``kind = "run"``: the key of the
sparse ``runs`` index (by ``created_at``) that lists the runs without reading anything else.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from slsml.spec.config import TrainingSpec
from slsml.spec.messages import Participant

DEADLINE_OWNER = -1  # reduce_fired_by when the watchdog fired the reduce at a deadline
MERGER_OWNER = -2  # ASP: when the Merger fired it, as it merged the version before, with the updates waiting
DEADLINE_LAUNCH = "deadline"  # launched_by when the watchdog launched an iteration whose own launch had not come


class Measurement(BaseModel):
    """The rounds measured at one worker count."""

    seconds: list[float] = Field(default_factory=list, description="the last rounds' durations")
    skipped: bool = Field(default=False, description="the first round at this count was left out")


class TunerState(BaseModel):
    """What the tuner keeps on the run between rounds."""

    tuned: int = Field(default=-1, description="the last round it decided for")
    measured: dict[int, Measurement] = Field(default_factory=dict)


class RunStatus(StrEnum):
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class PendingDeadline(BaseModel):
    """The deadline of a run's chain that is due next, as the watchdog that sent it recorded it: what the watchdog acts
    on when it comes (the message names only its run, generation and place in the chain)."""

    model_config = ConfigDict(extra="ignore")

    iteration: int
    stage: Literal["work", "reduce"]
    round: int
    due_at: float


class RunRecord(BaseModel):
    """A run's ``META`` item: the training spec it was started with (one JSON attribute) and its state."""

    model_config = ConfigDict(extra="ignore")

    run_id: str
    status: RunStatus
    training: TrainingSpec
    iteration: int = 0
    iteration_at: float | None = Field(default=None, description="when the model entering `iteration` was stored")
    heartbeat_at: float | None = Field(default=None, description="the last heartbeat sent to the run's execution")
    watched: int | None = Field(default=None, description="the deadline chain's position (see the watchdog)")
    pending: PendingDeadline | None = Field(default=None, description="the chain's deadline due next (JSON)")
    workers: int = Field(description="the workers the run trains with now (at first, the spec's)")
    workers_reason: str | None = Field(default=None, description="why the workers last changed (run scale, the tuner)")
    tuner: TunerState | None = Field(default=None, description="--workers auto: what the tuner measured (JSON)")
    dataset: str
    created_at: float
    updated_at: float
    reason: str | None = None
    final_key: str | None = None
    final_etag: str | None = Field(default=None, description="the final model's ETag when the run stored it")
    final_sha256: str | None = Field(default=None, description="and its SHA-256: what a reader of it checks")
    config_sha256: str | None = Field(
        default=None, description="the SHA-256 of run.json as the run registered it (RunConfig.config_digest)"
    )
    test_loss: float | None = None
    test_accuracy: float | None = None
    test: dict[str, float] | None = Field(
        default=None, description="the final model's loss and metrics on the test split, by Keras name"
    )
    val: dict[str, float] | None = Field(default=None, description="and on the validation samples")
    execution_arn: str | None = None
    task_token: str | None = None
    generation: int = Field(default=0, description="how often the run was resumed")

    @field_validator("training", "tuner", "pending", mode="before")
    @classmethod
    def _from_json(cls, value: object) -> object:
        return json.loads(value) if isinstance(value, str) else value

    @property
    def iterations(self) -> int:
        return self.training.iterations

    @property
    def reducers(self) -> int:
        return self.training.reducers

    @property
    def quorum(self) -> float:
        return self.training.quorum

    @property
    def deadline_s(self) -> float:
        return self.training.deadline_s

    @property
    def heartbeat_s(self) -> int:
        return self.training.heartbeat_s


class WorkerReport(BaseModel):
    """One worker's report of one iteration; a record with no samples yet is a re-launch placeholder."""

    model_config = ConfigDict(extra="ignore")

    worker: int
    attempt: int = 0
    generation: int = 0
    samples: int | None = None
    loss: float = 0.0
    metrics: list[float] | None = None
    compute_s: float = 0.0
    finite: bool = True
    etag: str | None = Field(default=None, description="its update's ETag (WorkDone.etag)")
    folded_into: int | None = Field(default=None, description="late: the iteration whose reduce took it (SSP)")
    stale: bool = Field(default=False, description="computed on the weights one round stale (``stale_weights``)")
    continues_until: float | None = Field(
        default=None,
        description="not reported yet: its round was handed on to a fresh invocation, which stores its progress or"
        " its update by then (epoch seconds)",
    )

    @property
    def reported(self) -> bool:
        return self.samples is not None


class Counter(BaseModel):
    """An iteration's counter item: fixed size, written by every report (counts are hints: a duplicate
    may add twice, so a barrier checks the records before it fires)."""

    model_config = ConfigDict(extra="ignore")

    iteration: int
    generation: int = 0
    launched_at: float | None = None
    launched_by: str | None = None
    workers: int | None = Field(default=None, description="the workers the iteration was launched with")
    workers_reason: str | None = Field(default=None, description="why they differ from the iteration before's")
    spent_usd: float | None = Field(
        default=None, description="the run's spend when it was launched (a run with a budget)"
    )
    arrived: int = 0
    nonfinite_arrived: int = 0
    reduce_fired_by: int | None = None
    reduce_fired_at: float | None = None
    participant_count: int = 0
    train_loss: float | None = None
    train_state: list[float] | None = Field(
        default=None, description="the state of the participants' train metrics, summed (training.evaluation)"
    )
    train: dict[str, float] | None = Field(
        default=None, description="the loss and metrics over the iteration's batches, by Keras name, from train_state"
    )
    squares_in: int = Field(default=0, description="shards whose sums of squares are in (runs that clip by norm)")
    steps_released_by: int | None = Field(default=None, description="the shard that released the clipped steps")
    shards_in: int = 0
    merge_fired_by: int | None = None
    merged_at: float | None = None
    test_loss: float | None = None
    test_accuracy: float | None = None
    test: dict[str, float] | None = Field(
        default=None,
        description="the loss and metrics on the test split of the model this iteration merged, by Keras name",
    )
    val: dict[str, float] | None = Field(default=None, description="and on the validation samples, at an epoch's end")
    stale_attempts: int = Field(default=0, description="reports of superseded attempts, ignored")
    reduce_relaunches: int = Field(default=0, description="reducers the watchdog re-launched")
    stale_shards: set[int] = Field(
        default_factory=set, description="shards that kept their weights: no reducer finished in time"
    )
    redone: set[int] = Field(
        default_factory=set,
        description="workers whose round was re-launched once: a reducer refused the update they reported",
    )
    redone_rounds: set[str] = Field(
        default_factory=set,
        description='those re-launches as "<worker>:<attempt>" of the update refused: which round each was claimed for',
    )
    went_on: set[int] = Field(
        default_factory=set,
        description="stale_weights: workers whose invocation went on to this round from the round before",
    )
    published: set[int] = Field(default_factory=set, description="stale_weights: workers the launch sent Work to")

    @property
    def fired_at_deadline(self) -> bool:
        return self.reduce_fired_by == DEADLINE_OWNER


class IterationRecord(Counter):
    """An iteration with its records: what the watchdog and the run summary read."""

    reports: dict[int, WorkerReport] = Field(default_factory=dict, description="workers that reported")
    relaunched: dict[int, int] = Field(
        default_factory=dict, description="worker → the attempt the watchdog re-launched it with"
    )
    continuing: dict[int, float] = Field(
        default_factory=dict, description="worker → when the invocation its round was handed on to ends at the latest"
    )
    participants: list[Participant] = Field(default_factory=list)
    dropped_parts: set[str] = Field(
        default_factory=set, description='"<shard>:<worker>": parts a reducer left out after its read timeout'
    )

    @property
    def done(self) -> set[int]:
        return set(self.reports)

    @property
    def nonfinite(self) -> set[int]:
        return {w for w, r in self.reports.items() if not r.finite}

    @property
    def late(self) -> set[int]:
        """Workers that reported after the reduce fired without them."""
        if self.reduce_fired_by is None:
            return set()
        return self.done - {p.worker for p in self.participants if p.iteration is None}

    @property
    def folded(self) -> set[int]:
        """Late workers whose updates a later reduce took (bounded staleness)."""
        return {w for w, r in self.reports.items() if r.folded_into is not None}

    @property
    def stale(self) -> set[int]:
        """Workers whose update was computed on the weights one round stale (``stale_weights``)."""
        return {w for w, r in self.reports.items() if r.stale}


def plain(value: Any) -> Any:
    """DynamoDB's Decimals and sets → Python numbers and sets."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, set):
        return {plain(v) for v in value}
    return value


def dynamo(value: Any) -> Any:
    """Python floats → Decimals (DynamoDB rejects floats), one that is not finite (a metric's NaN or Inf, which no
    DynamoDB number holds) → its name ("nan", "inf", "-inf"), which the records' float fields read back; None-valued
    fields left out."""
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {k: dynamo(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [dynamo(v) for v in value]
    return value


# sort keys
META = "META"
SPEND = "SPEND"
KEY = "KEY"  # the run's signing keys (``RunTable.run_keys``): public keys, and private keys sealed by KMS
# the figures a run watches (``TrainingSpec.monitors``) of each evaluation, "<monitor>@<iteration>" → value: what
# early stopping and keep_best decide on, read as one item whatever the run's length
WATCHED = "WATCHED"


# ---- the table: one definition, which the CDK app (infra/storage.py) and the local runtime
# (slsml.local.cloud) both create the table from


@dataclass(frozen=True)
class KeyAttribute:
    name: str
    type: Literal["S", "N"]


@dataclass(frozen=True)
class Index:
    """A global secondary index, projecting every attribute."""

    name: str
    partition: KeyAttribute
    sort: KeyAttribute


PARTITION_KEY, SORT_KEY = KeyAttribute("pk", "S"), KeyAttribute("sk", "S")
# DynamoDB TTL: only the message records of ``slsml.state.idempotency`` carry it. A run's items are its history,
# which ``run status``, the summary and the report read whatever the run's status, and which nothing supersedes:
# they are kept as long as the run (its models are kept in S3 for good), so none can expire under a running,
# stopped or failed run.
TTL_ATTRIBUTE = "expires_at"
# Runs by creation time: only a run's META item carries ``kind`` (= RUN_KIND), so the index is sparse and a
# listing of runs is one query (a page per MB), whatever the number of iteration items in the table
RUNS_INDEX = Index("runs", KeyAttribute("kind", "S"), KeyAttribute("created_at", "N"))
RUN_KIND = "run"
INDEXES = (RUNS_INDEX,)


def run_item(
    run_id: str, dataset: str, training: TrainingSpec, created_at: float, config_sha256: str | None = None
) -> dict[str, Any]:
    """A new run's ``META`` item as the run state machine's RegisterRun writes it (``slsml.state.orchestration``),
    for runs registered without an execution (benchmarks, tests); ``config_sha256``: its run.json's digest."""
    return dynamo(
        {
            PARTITION_KEY.name: f"RUN#{run_id}",
            SORT_KEY.name: META,
            RUNS_INDEX.partition.name: RUN_KIND,
            "run_id": run_id,
            "status": RunStatus.RUNNING.value,
            "dataset": dataset,
            "training": training.model_dump_json(),
            "workers": training.initial_workers,
            "iteration": 0,
            "created_at": created_at,
            "iteration_at": created_at,
            "updated_at": created_at,
            "generation": 0,
            **({"config_sha256": config_sha256} if config_sha256 else {}),
        }
    )


def _key_schema(partition: KeyAttribute, sort: KeyAttribute) -> list[dict[str, str]]:
    return [{"AttributeName": partition.name, "KeyType": "HASH"}, {"AttributeName": sort.name, "KeyType": "RANGE"}]


def create_table_arguments(table: str) -> dict[str, Any]:
    """DynamoDB CreateTable's arguments for the run table named ``table`` (on demand; set its TTL with
    ``TTL_ATTRIBUTE`` after)."""
    keys = [PARTITION_KEY, SORT_KEY, *(key for index in INDEXES for key in (index.partition, index.sort))]
    return {
        "TableName": table,
        "KeySchema": _key_schema(PARTITION_KEY, SORT_KEY),
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": kind} for name, kind in {k.name: k.type for k in keys}.items()
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": index.name,
                "KeySchema": _key_schema(index.partition, index.sort),
                "Projection": {"ProjectionType": "ALL"},
            }
            for index in INDEXES
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }


def iteration_sk(iteration: int) -> str:
    return f"ITER#{iteration:06d}"


def worker_sk(iteration: int, worker: int) -> str:
    return f"{iteration_sk(iteration)}#W#{worker:05d}"


def waiting_sk(worker: int) -> str:
    """ASP: the update of ``worker`` that waits to be applied (one at most: a worker is launched again once its
    update is applied)."""
    return f"ASP#{worker:05d}"


def saved_sk(iteration: int) -> str:
    """The item of the SHA-256 of the model entering ``iteration`` that the Merger saved (``models/<i>.keras``): what
    a reader of it checks its bytes against; one item a model, so that a run's saves do not grow one item."""
    return f"SAVED#{iteration:06d}"


def participants_sk(iteration: int) -> str:
    return f"{iteration_sk(iteration)}#P"


def shard_sk(iteration: int, shard: int) -> str:
    return f"{iteration_sk(iteration)}#S#{shard:04d}"


def squares_sk(iteration: int, shard: int) -> str:
    return f"{iteration_sk(iteration)}#N#{shard:04d}"


def iteration_of(sk: str) -> int:
    return int(sk[5:11])


def encode_participants(participants: list[Participant]) -> list[list[int | str]]:
    """Compact: [worker, attempt, samples, etag] per participant (about 50 bytes each), and the iteration of a late
    update folded in."""
    return [
        [p.worker, p.attempt, p.samples, p.etag, *([] if p.iteration is None else [p.iteration])] for p in participants
    ]


def decode_participants(rows: list[list[Any]]) -> list[Participant]:
    return [
        Participant(worker=w, attempt=a, samples=n, etag=e, iteration=i[0] if i else None)
        for w, a, n, e, *i in plain(rows)
    ]


def iteration_record(iteration: int, items: list[dict[str, Any]]) -> IterationRecord:
    """An iteration's items (counter, worker records, participants, shard records) → one record."""
    fields: dict[str, Any] = {"iteration": iteration}
    reports: dict[int, WorkerReport] = {}
    relaunched: dict[int, int] = {}
    continuing: dict[int, tuple[int, float]] = {}  # worker → (generation, until)
    dropped: set[str] = set()
    participants: list[Participant] = []
    generation = None
    for item in items:
        item = plain(item)
        kind = item["sk"][len(iteration_sk(iteration)) :]
        if kind == "":
            fields.update(item)
            generation = item.get("generation", 0)
        elif kind.startswith("#W#"):
            record = WorkerReport.model_validate(item)
            if record.reported:
                reports[record.worker] = record
            if record.attempt:
                relaunched[record.worker] = record.attempt
            if not record.reported and record.continues_until is not None:
                continuing[record.worker] = (record.generation, record.continues_until)
        elif kind == "#P":
            participants = decode_participants(item["participants"])
        elif kind.startswith("#S#"):
            dropped |= {f"{item['shard']}:{w}" for w in item.get("dropped", [])}
    if generation is not None:  # records an earlier generation left behind do not count
        reports = {w: r for w, r in reports.items() if r.generation == generation}
        continuing = {w: c for w, c in continuing.items() if c[0] == generation}
    return IterationRecord(
        **{k: v for k, v in fields.items() if k not in {"pk", "sk"}},
        reports=reports,
        relaunched=relaunched,
        continuing={w: until for w, (_, until) in continuing.items()},
        participants=participants,
        dropped_parts=dropped,
    )
