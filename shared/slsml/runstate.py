"""Run bookkeeping in DynamoDB: one ``META`` item per run and one ``ITER#<i>`` item per iteration.

Counting is by set-add (a duplicate adds nothing) and every barrier fires through a conditional
write that records who fired it: only that message (or a retry of it) publishes downstream.
"""

from __future__ import annotations

import time
from decimal import Decimal
from enum import StrEnum
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

from slsml.aws import error_code
from slsml.errors import NotFoundError
from slsml.messages import Participant, WorkDone

ITERATION_TTL_S = 14 * 24 * 3600
DEADLINE_OWNER = -1  # reduce_fired_by when the watchdog fired the reduce at a deadline


class RunStatus(StrEnum):
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    run_id: str
    status: RunStatus
    iterations: int
    iteration: int = 0
    workers: int
    reducers: int
    quorum: float
    deadline_s: float = 120.0
    dataset: str
    created_at: float
    updated_at: float
    reason: str | None = None
    final_key: str | None = None
    test_loss: float | None = None
    test_accuracy: float | None = None
    execution_arn: str | None = None
    task_token: str | None = None
    generation: int = Field(default=0, description="how often the run was resumed")


class WorkerReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    worker: int
    attempt: int = 0
    samples: int
    loss: float
    accuracy: float | None = None
    compute_s: float = 0.0


class IterationRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    iteration: int
    generation: int = 0
    launched_at: float | None = None
    launched_by: str | None = None
    done: set[int] = Field(default_factory=set)
    reports: dict[int, WorkerReport] = Field(default_factory=dict)
    reduce_fired_by: int | None = None
    reduce_fired_at: float | None = None
    participants: list[Participant] = Field(default_factory=list)
    shards: set[int] = Field(default_factory=set)
    merge_fired_by: int | None = None
    merged_at: float | None = None
    moved: dict[str, tuple[int, int]] = Field(
        default_factory=dict, description="S3 bytes (read, written) by each step of the iteration, first report kept"
    )
    test_loss: float | None = None
    test_accuracy: float | None = None
    nonfinite: set[int] = Field(default_factory=set, description="workers whose update had NaN or Inf")
    dropped_parts: set[str] = Field(
        default_factory=set, description='"<shard>:<worker>": parts a reducer left out after its read timeout'
    )
    relaunched: dict[int, int] = Field(
        default_factory=dict, description="worker → the attempt the watchdog re-launched it with"
    )
    stale_attempts: int = Field(default=0, description="reports of superseded attempts, ignored")
    reduce_relaunches: int = Field(default=0, description="reducers the watchdog re-launched")
    stale_shards: set[int] = Field(
        default_factory=set, description="shards that kept their weights: no reducer finished in time"
    )

    @property
    def fired_at_deadline(self) -> bool:
        return self.reduce_fired_by == DEADLINE_OWNER

    @property
    def late(self) -> set[int]:
        """Workers that reported after the reduce fired without them."""
        if self.reduce_fired_by is None:
            return set()
        return self.done - {p.worker for p in self.participants}

    @property
    def bytes_read(self) -> int:
        return sum(read for read, _ in self.moved.values())

    @property
    def bytes_written(self) -> int:
        return sum(written for _, written in self.moved.values())

    @property
    def train_loss(self) -> float | None:
        return _weighted([(r.loss, r.samples) for r in self._included()])

    @property
    def train_accuracy(self) -> float | None:
        return _weighted([(r.accuracy, r.samples) for r in self._included() if r.accuracy is not None])

    def _included(self) -> list[WorkerReport]:
        chosen = {p.worker for p in self.participants} or self.done - self.nonfinite
        return [r for w, r in self.reports.items() if w in chosen]


def _weighted(pairs: list[tuple[float, int]]) -> float | None:
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None


def _plain(value: Any) -> Any:
    """DynamoDB's Decimals and sets → Python numbers and sets."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return {_plain(v) for v in value}
    return value


def _dynamo(value: Any) -> Any:
    """Python floats → Decimals (DynamoDB rejects floats)."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _dynamo(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_dynamo(v) for v in value]
    return value


def _iteration_record(iteration: int, item: dict[str, Any]) -> IterationRecord:
    item = _plain(item)
    reports = {
        int(name[2:]): WorkerReport.model_validate(value) for name, value in item.items() if name.startswith("w#")
    }
    relaunched = {int(name[2:]): value for name, value in item.items() if name.startswith("a#")}
    moved = {name[3:]: tuple(value) for name, value in item.items() if name.startswith(_MOVED)}
    return IterationRecord(iteration=iteration, reports=reports, relaunched=relaunched, moved=moved, **item)


_MOVED = "io#"


def _moved(step: str, bytes_moved: tuple[int, int]) -> tuple[str, dict[str, str], dict[str, Any]]:
    """An update clause recording the bytes ``step`` moved, once: a retried or duplicated step that
    reports again (perhaps only what its second look cost) leaves the first report in place."""
    return (
        "#moved = if_not_exists(#moved, :moved)",
        {"#moved": f"{_MOVED}{step}"},
        {":moved": list(bytes_moved)},
    )


def _attempt_attr(worker: int) -> str:
    return f"a#{worker:05d}"


class RunTable:
    def __init__(self, table: Any) -> None:
        self.table = table

    @staticmethod
    def _key(run_id: str, sort: str) -> dict[str, str]:
        return {"pk": f"RUN#{run_id}", "sk": sort}

    @staticmethod
    def _iter_sk(iteration: int) -> str:
        return f"ITER#{iteration:06d}"

    def _is_conflict(self, error: ClientError) -> bool:
        return error_code(error) == "ConditionalCheckFailedException"

    # runs
    def get_run(self, run_id: str) -> RunRecord:
        item = self.table.get_item(Key=self._key(run_id, "META"), ConsistentRead=True).get("Item")
        if item is None:
            raise NotFoundError(f"no run named {run_id!r}")
        return RunRecord.model_validate(_plain(item))

    def list_runs(self) -> list[RunRecord]:
        items, kwargs = [], {}
        while True:
            page = self.table.scan(**kwargs)
            items += [i for i in page["Items"] if i["sk"] == "META"]
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return sorted((RunRecord.model_validate(_plain(i)) for i in items), key=lambda r: r.created_at)

    def _update_run(self, run_id: str, values: dict[str, Any], only_if_running: bool = True) -> RunRecord | None:
        """SET ``values`` on the run; the updated run, or None if it was not running (or is unknown)."""
        values = {**values, "updated_at": time.time()}
        names = {f"#{k}": k for k in values}
        try:
            item = self.table.update_item(
                Key=self._key(run_id, "META"),
                UpdateExpression="SET " + ", ".join(f"#{k} = :{k}" for k in values),
                ConditionExpression="#status = :running" if only_if_running else "attribute_exists(pk)",
                ExpressionAttributeNames={**names, **({"#status": "status"} if only_if_running else {})},
                ExpressionAttributeValues={
                    **{f":{k}": _dynamo(v) for k, v in values.items()},
                    **({":running": RunStatus.RUNNING.value} if only_if_running else {}),
                },
                ReturnValues="ALL_NEW",
            )["Attributes"]
        except ClientError as error:
            if self._is_conflict(error):
                return None
            raise
        return RunRecord.model_validate(_plain(item))

    def advance(self, run_id: str, iteration: int) -> RunRecord | None:
        """The model entering ``iteration`` exists (the run's heartbeat)."""
        return self._update_run(run_id, {"iteration": iteration})

    def attach_task_token(self, run_id: str, token: str) -> RunRecord | None:
        """Record the token of the run's execution, whatever the run's status (None: unknown run)."""
        return self._update_run(run_id, {"task_token": token}, only_if_running=False)

    def record_outcome(
        self, run_id: str, final_key: str, test_loss: float | None, test_accuracy: float | None
    ) -> RunRecord | None:
        """The budget is spent: the final model and its test figures (the execution marks COMPLETED)."""
        values = {"final_key": final_key, "test_loss": test_loss, "test_accuracy": test_accuracy}
        return self._update_run(run_id, {k: v for k, v in values.items() if v is not None})

    def stop(self, run_id: str, reason: str) -> RunRecord | None:
        """Mark a running run STOPPED: no new iteration starts; the stopped run, or None if it was not running."""
        return self._update_run(run_id, {"status": RunStatus.STOPPED.value, "reason": reason[:2000]})

    def resume(self, run_id: str, iteration: int) -> RunRecord | None:
        """Make a STOPPED or FAILED run RUNNING again from the model entering ``iteration``, in a new
        generation; the resumed run, or None if it was neither stopped nor failed."""
        try:
            item = self.table.update_item(
                Key=self._key(run_id, "META"),
                UpdateExpression="SET #status = :running, iteration = :i, updated_at = :now,"
                " generation = if_not_exists(generation, :zero) + :one REMOVE reason, task_token, final_key",
                ConditionExpression="#status IN (:stopped, :failed)",
                ExpressionAttributeNames={"#status": "status"},
                ExpressionAttributeValues={
                    ":running": RunStatus.RUNNING.value, ":stopped": RunStatus.STOPPED.value,
                    ":failed": RunStatus.FAILED.value, ":i": iteration, ":now": _dynamo(time.time()),
                    ":zero": 0, ":one": 1,
                },
                ReturnValues="ALL_NEW",
            )["Attributes"]
        except ClientError as error:
            if self._is_conflict(error):
                return None
            raise
        return RunRecord.model_validate(_plain(item))

    def fail(self, run_id: str, reason: str) -> RunRecord | None:
        """Mark a running run FAILED, keeping the first reason; the failed run, or None if it was not running."""
        return self._update_run(run_id, {"status": RunStatus.FAILED.value, "reason": reason[:2000]})

    # iterations
    def get_iteration(self, run_id: str, iteration: int) -> IterationRecord:
        item = self.table.get_item(Key=self._key(run_id, self._iter_sk(iteration)), ConsistentRead=True).get("Item")
        return _iteration_record(iteration, item or {})

    def list_iterations(self, run_id: str) -> list[IterationRecord]:
        records, kwargs = [], {}
        while True:
            page = self.table.query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :iter)",
                ExpressionAttributeValues={":pk": f"RUN#{run_id}", ":iter": "ITER#"},
                ConsistentRead=True,
                **kwargs,
            )
            records += [_iteration_record(int(i["sk"][5:]), i) for i in page["Items"]]
            if "LastEvaluatedKey" not in page:
                return records
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def forget_iterations(self, run_id: str, first: int) -> None:
        """Delete the records of iterations from ``first`` on (a resumed run runs them again)."""
        for record in self.list_iterations(run_id):
            if record.iteration >= first:
                self.table.delete_item(Key=self._key(run_id, self._iter_sk(record.iteration)))

    def _fire(self, run_id: str, iteration: int, owner_attr: str, owner: Any, extra: dict[str, Any]) -> bool:
        """Set ``owner_attr`` once. True if this call set it or ``owner`` had set it before (a retry)."""
        values = {owner_attr: owner, **extra}
        try:
            self.table.update_item(
                Key=self._key(run_id, self._iter_sk(iteration)),
                UpdateExpression="SET " + ", ".join(f"#{k} = :{k}" for k in values),
                ConditionExpression=f"attribute_not_exists(#{owner_attr}) OR #{owner_attr} = :{owner_attr}",
                ExpressionAttributeNames={f"#{k}": k for k in values},
                ExpressionAttributeValues={f":{k}": _dynamo(v) for k, v in values.items()},
            )
        except ClientError as error:
            if self._is_conflict(error):
                return False
            raise
        return True

    def claim_launch(self, run_id: str, iteration: int, trigger_id: str, generation: int = 0) -> bool:
        return self._fire(
            run_id,
            iteration,
            "launched_by",
            trigger_id,
            {"launched_at": time.time(), "expires_at": int(time.time()) + ITERATION_TTL_S, "generation": generation},
        )

    def record_worker(self, done: WorkDone, bytes_moved: tuple[int, int]) -> IterationRecord | None:
        """Count ``done`` (in ``nonfinite`` too if its update is); None if it is stale: an attempt the
        watchdog superseded, or an earlier generation of a resumed run (it is counted in
        ``stale_attempts`` instead)."""
        report = WorkerReport.model_validate(done.model_dump()).model_dump()
        key = self._key(done.run_id, self._iter_sk(done.iteration))
        moved, moved_names, moved_values = _moved(f"w{done.worker:05d}", bytes_moved)
        try:
            item = self.table.update_item(
                Key=key,
                UpdateExpression=f"ADD done :w{'' if done.finite else ', nonfinite :w'} SET #report = :report, {moved}",
                ConditionExpression="(attribute_not_exists(#attempt) OR #attempt <= :attempt)"
                " AND (attribute_not_exists(generation) OR generation = :generation)",
                ExpressionAttributeNames={
                    "#report": f"w#{done.worker:05d}", "#attempt": _attempt_attr(done.worker), **moved_names,
                },
                ExpressionAttributeValues={
                    ":w": {done.worker},
                    ":report": _dynamo(report),
                    ":attempt": done.attempt,
                    ":generation": done.generation,
                    **moved_values,
                },
                ReturnValues="ALL_NEW",
            )["Attributes"]
        except ClientError as error:
            if self._is_conflict(error):
                self.table.update_item(Key=key, UpdateExpression="ADD stale_attempts :one",
                                       ExpressionAttributeValues={":one": 1})
                return None
            raise
        return _iteration_record(done.iteration, item)

    def relaunch_workers(self, run_id: str, iteration: int, attempts: dict[int, int]) -> bool:
        """Supersede these workers' earlier attempts (worker → new attempt) unless the reduce fired."""
        names = {f"#a{w}": _attempt_attr(w) for w in attempts}
        try:
            self.table.update_item(
                Key=self._key(run_id, self._iter_sk(iteration)),
                UpdateExpression="SET " + ", ".join(f"#a{w} = :a{w}" for w in attempts),
                ConditionExpression="attribute_not_exists(reduce_fired_by)",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={f":a{w}": a for w, a in attempts.items()},
            )
        except ClientError as error:
            if self._is_conflict(error):
                return False
            raise
        return True

    def record_reduce_relaunch(self, run_id: str, iteration: int, shards: int) -> None:
        self.table.update_item(
            Key=self._key(run_id, self._iter_sk(iteration)),
            UpdateExpression="ADD reduce_relaunches :n",
            ExpressionAttributeValues={":n": shards},
        )

    def record_stale_shard(self, run_id: str, iteration: int, shard: int) -> None:
        """No reducer of ``shard`` finished ``iteration`` in time: the shard kept its weights."""
        self.table.update_item(
            Key=self._key(run_id, self._iter_sk(iteration)),
            UpdateExpression="ADD stale_shards :s",
            ExpressionAttributeValues={":s": {shard}},
        )

    def fire_reduce(self, run_id: str, iteration: int, worker: int, participants: list[Participant]) -> bool:
        return self._fire(
            run_id,
            iteration,
            "reduce_fired_by",
            worker,
            {"participants": [p.model_dump() for p in participants], "reduce_fired_at": time.time()},
        )

    def record_shard(self, run_id: str, iteration: int, shard: int, bytes_moved: tuple[int, int]) -> IterationRecord:
        moved, moved_names, moved_values = _moved(f"s{shard:04d}", bytes_moved)
        item = self.table.update_item(
            Key=self._key(run_id, self._iter_sk(iteration)),
            UpdateExpression=f"ADD shards :s SET {moved}",
            ExpressionAttributeNames=moved_names,
            ExpressionAttributeValues={":s": {shard}, **moved_values},
            ReturnValues="ALL_NEW",
        )["Attributes"]
        return _iteration_record(iteration, item)

    def fire_merge(self, run_id: str, iteration: int, shard: int) -> bool:
        return self._fire(run_id, iteration, "merge_fired_by", shard, {})

    def record_merge(
        self, run_id: str, iteration: int, bytes_moved: tuple[int, int], test: tuple[float, float | None] | None
    ) -> None:
        moved, moved_names, moved_values = _moved("merge", bytes_moved)
        values: dict[str, Any] = {":now": time.time(), **moved_values}
        expression = f"SET merged_at = :now, {moved}"
        if test is not None:
            expression += ", test_loss = :tl"
            values[":tl"] = test[0]
            if test[1] is not None:
                expression += ", test_accuracy = :ta"
                values[":ta"] = test[1]
        self.table.update_item(
            Key=self._key(run_id, self._iter_sk(iteration)),
            UpdateExpression=expression,
            ExpressionAttributeNames=moved_names,
            ExpressionAttributeValues=_dynamo(values),
        )

    def record_dropped_parts(self, run_id: str, iteration: int, shard: int, workers: list[int]) -> None:
        """Reducer ``shard`` averaged ``iteration`` without these workers' parts (their reads timed out)."""
        if workers:
            self.table.update_item(
                Key=self._key(run_id, self._iter_sk(iteration)),
                UpdateExpression="ADD dropped_parts :p",
                ExpressionAttributeValues={":p": {f"{shard}:{w}" for w in workers}},
            )
