"""Run bookkeeping in DynamoDB (the items are described in ``slsml.state.records``).

A worker's report is its own record, written create-only, and adds one to the iteration's counter;
a barrier that the counter says may be complete reads the records and fires by a create-only write
of what it fired with. Every barrier fires once, and a duplicate or a retry changes nothing: it
finds its record, or the fire, already stored. A resumed run's iterations belong to its new generation:
every write of a report, count, fire or advance is conditional on the generation, so a late step of the
generation before neither counts in them nor fires them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

from botocore.exceptions import ClientError

from slsml.aws.clients import error_code
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import NotFoundError
from slsml.spec.messages import Participant, WorkDone
from slsml.state.records import (
    KEY,
    META,
    RUN_KIND,
    RUNS_INDEX,
    SPEND,
    WATCHED,
    Counter,
    IterationRecord,
    PendingDeadline,
    RunRecord,
    RunStatus,
    TunerState,
    WorkerReport,
    decode_participants,
    dynamo,
    encode_participants,
    iteration_of,
    iteration_record,
    iteration_sk,
    participants_sk,
    plain,
    saved_sk,
    shard_sk,
    squares_sk,
    waiting_sk,
    worker_sk,
)

BATCH_READ = 100  # keys of one BatchGetItem request
# a count or a fire goes into the counter its generation's launch claimed: an earlier generation's late report or
# fire neither counts in a resumed run's counter nor recreates one that the resume deleted (with counts or fires
# the new generation would keep, and wait on)
_SAME_GENERATION = "generation = :generation"
# a worker's record an earlier generation left (a late report landing after the resume deleted the records)
# gives way to this generation's report or re-launch
_EARLIER_GENERATION = "generation < :generation"


class SealedKey(NamedTuple):
    """A signing kind's key pair of a run: its public key (DER) and its private key sealed by KMS."""

    public: bytes
    sealed: bytes


class RunKeyItem(NamedTuple):
    """A run's signing keys by kind, and the KMS ciphertext that vouches for their public keys (None: the item holds
    none; ``slsml.pipeline.proof``)."""

    keys: dict[str, SealedKey]
    vouched: bytes | None


def conditional(write: Callable[[], Any]) -> Any | None:
    """``write()``'s result, or None if its condition failed (someone else's write came first)."""
    try:
        return write()
    except ClientError as error:
        if error_code(error) == "ConditionalCheckFailedException":
            return None
        raise


def _set(values: dict[str, Any], keep_first: frozenset[str] = frozenset()) -> tuple[str, dict, dict]:
    """A ``SET`` clause for ``values`` (those in ``keep_first`` only if not set yet), with its names and values."""
    clauses = [f"#{k} = if_not_exists(#{k}, :{k})" if k in keep_first else f"#{k} = :{k}" for k in values]
    return "SET " + ", ".join(clauses), {f"#{k}": k for k in values}, {f":{k}": dynamo(v) for k, v in values.items()}


class RunTable:
    def __init__(self, table: Any) -> None:
        self.table = table

    @staticmethod
    def _key(run_id: str, sort: str) -> dict[str, str]:
        return {"pk": f"RUN#{run_id}", "sk": sort}

    def _query(self, run_id: str, prefix: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {}
        while True:
            page = self.table.query(
                KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
                ExpressionAttributeValues={":pk": f"RUN#{run_id}", ":prefix": prefix},
                ConsistentRead=True,
                **kwargs,
            )
            items += page["Items"]
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    # runs
    def get_run(self, run_id: str) -> RunRecord:
        item = self.table.get_item(Key=self._key(run_id, META), ConsistentRead=True).get("Item")
        if item is None:
            raise NotFoundError(f"no run named {run_id!r}")
        return RunRecord.model_validate(plain(item))

    def list_runs(self) -> list[RunRecord]:
        """Every run, oldest first: a query of the sparse runs index (only runs' META items are in it), page by
        page; it reads no iteration item."""
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {}
        while True:
            page = self.table.query(
                IndexName=RUNS_INDEX.name,
                KeyConditionExpression="#kind = :kind",
                ExpressionAttributeNames={"#kind": RUNS_INDEX.partition.name},
                ExpressionAttributeValues={":kind": RUN_KIND},
                **kwargs,
            )
            items += page["Items"]
            if "LastEvaluatedKey" not in page:
                return [RunRecord.model_validate(plain(i)) for i in items]
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def register_refused(self, run_id: str, dataset: str, training: TrainingSpec, reason: str) -> bool:
        """Register ``run_id`` as a FAILED run with ``reason`` (a start that could not be made); False, and nothing
        written, if a run of that id is registered already."""
        now = time.time()
        item = {
            **self._key(run_id, META),
            RUNS_INDEX.partition.name: RUN_KIND,
            "run_id": run_id,
            "status": RunStatus.FAILED.value,
            "dataset": dataset,
            "training": training.model_dump_json(),
            "workers": training.initial_workers,
            "iteration": 0,
            "generation": 0,
            "created_at": now,
            "iteration_at": now,
            "updated_at": now,
            "reason": reason,
        }
        return (
            conditional(lambda: self.table.put_item(Item=dynamo(item), ConditionExpression="attribute_not_exists(pk)"))
            is not None
        )

    def _update_run(
        self,
        run_id: str,
        values: dict[str, Any],
        only_if_running: bool = True,
        condition: str = "",
        condition_values: dict[str, Any] | None = None,
    ) -> RunRecord | None:
        """SET ``values`` on the run; the updated run, or None if it was not running (or is unknown, or
        ``condition`` failed)."""
        expression, names, bound = _set({**values, "updated_at": time.time()})
        conditions = ["#status = :running" if only_if_running else "attribute_exists(pk)"]
        conditions += [condition] if condition else []
        if only_if_running:
            names["#status"], bound[":running"] = "status", RunStatus.RUNNING.value
        item = conditional(
            lambda: self.table.update_item(
                Key=self._key(run_id, META),
                UpdateExpression=expression,
                ConditionExpression=" AND ".join(conditions),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={**bound, **(condition_values or {})},
                ReturnValues="ALL_NEW",
            )
        )
        return None if item is None else RunRecord.model_validate(plain(item["Attributes"]))

    def advance(self, run_id: str, iteration: int, generation: int) -> RunRecord | None:
        """The model entering ``iteration`` is about to be stored (the run's heartbeat); None if the run is
        not running, has its final model (early stopping ended it while an iteration was under way), is past
        ``iteration`` already (a late retry never moves it back), or was resumed since ``generation`` (whose late
        Merger then stores nothing)."""
        # a run registered before runs carried their generation has none until it is resumed
        same = f"({_SAME_GENERATION} OR attribute_not_exists(generation))" if generation == 0 else _SAME_GENERATION
        return self._update_run(
            run_id,
            {"iteration": iteration, "iteration_at": time.time()},
            condition=f"#iteration <= :iteration AND attribute_not_exists(final_key) AND {same}",
            condition_values={":generation": generation},
        )

    def mark_heartbeat(self, run_id: str) -> None:
        self._update_run(run_id, {"heartbeat_at": time.time()})

    def watch(
        self, run_id: str, expected: int | None, position: int, pending: PendingDeadline | None
    ) -> RunRecord | None:
        """Move the deadline chain from ``expected`` to ``position``, whose deadline is ``pending`` (None: the chain
        sent none); None if another message moved it."""
        values = {"watched": position, "pending": None if pending is None else pending.model_dump_json()}
        if expected is None:
            return self._update_run(run_id, values, condition="attribute_not_exists(watched)")
        return self._update_run(
            run_id, values, condition="watched = :expected", condition_values={":expected": expected}
        )

    def attach_task_token(self, run_id: str, token: str) -> RunRecord | None:
        """Record the token of the run's execution, whatever the run's status (None: unknown run)."""
        return self._update_run(run_id, {"task_token": token}, only_if_running=False)

    def record_outcome(
        self,
        run_id: str,
        final_key: str,
        test: dict[str, float] | None,
        val: dict[str, float] | None = None,
        reason: str | None = None,
        final_etag: str | None = None,
        final_sha256: str | None = None,
    ) -> RunRecord | None:
        """The budget is spent (or ``reason`` ended the run early): the final model (its key, ETag and SHA-256) and
        its test and validation figures (the execution marks COMPLETED)."""
        values = {
            "final_key": final_key,
            "final_etag": final_etag,
            "final_sha256": final_sha256,
            **_test_figures(test),
            "val": val,
            "reason": reason,
        }
        return self._update_run(run_id, {k: v for k, v in values.items() if v is not None})

    def stop(self, run_id: str, reason: str) -> RunRecord | None:
        """Mark a running run STOPPED: no new iteration starts; the stopped run, or None if it was not running."""
        return self._update_run(run_id, {"status": RunStatus.STOPPED.value, "reason": reason[:2000]})

    def fail(self, run_id: str, reason: str) -> RunRecord | None:
        """Mark a running run FAILED, keeping the first reason; the failed run, or None if it was not running."""
        return self._update_run(run_id, {"status": RunStatus.FAILED.value, "reason": reason[:2000]})

    def resume(self, run_id: str, iteration: int, training: TrainingSpec | None = None) -> RunRecord | None:
        """Make a STOPPED or FAILED run RUNNING again from the model entering ``iteration``, in a new
        generation (with ``training``, its spec with options changed, if given); the resumed run, or None if it
        was neither stopped nor failed."""
        changed = {} if training is None else {":training": training.model_dump_json()}
        item = conditional(
            lambda: self.table.update_item(
                Key=self._key(run_id, META),
                UpdateExpression="SET #status = :running, iteration = :i, iteration_at = :now, updated_at = :now,"
                " generation = if_not_exists(generation, :zero) + :one"
                + (", training = :training" if changed else "")
                # no execution answers for the run until the new one records itself: the old one's last
                # states (MarkFailed) then find it superseded, however late they run
                + " REMOVE reason, task_token, final_key, final_etag, final_sha256, watched, pending, execution_arn",
                ConditionExpression="#status IN (:stopped, :failed)",
                ExpressionAttributeNames={"#status": "status"},
                ExpressionAttributeValues={
                    ":running": RunStatus.RUNNING.value,
                    ":stopped": RunStatus.STOPPED.value,
                    ":failed": RunStatus.FAILED.value,
                    ":i": iteration,
                    ":now": dynamo(time.time()),
                    ":zero": 0,
                    ":one": 1,
                    **changed,
                },
                ReturnValues="ALL_NEW",
            )
        )
        return None if item is None else RunRecord.model_validate(plain(item["Attributes"]))

    # spend: the dollars a run's functions spent so far (runs with a budget)
    def add_spend(self, run_id: str, dollars: float) -> None:
        """Add ``dollars`` to the run's spend: an atomic counter of its own item, whatever the run's status."""
        self.table.update_item(
            Key=self._key(run_id, SPEND),
            UpdateExpression="ADD spent_usd :dollars",
            ExpressionAttributeValues={":dollars": dynamo(float(dollars))},
        )

    def spent(self, run_id: str) -> float:
        """The dollars the run's functions spent so far (0.0 before any was counted)."""
        item = self.table.get_item(Key=self._key(run_id, SPEND), ConsistentRead=True).get("Item") or {}
        return float(item.get("spent_usd", 0))

    # the run's signing keys: each signing kind's public key and sealed private key (slsml.pipeline.proof)
    def run_keys(self, run_id: str) -> RunKeyItem | None:
        """The run's signing keys; None if none were made (the run was not launched yet)."""
        item = self.table.get_item(Key=self._key(run_id, KEY), ConsistentRead=True).get("Item")
        if item is None:
            return None
        keys = {
            kind: SealedKey(public=bytes(item["public"][kind]), sealed=bytes(item["sealed"][kind]))
            for kind in item["public"]
        }
        return RunKeyItem(keys, bytes(item["vouched"]) if "vouched" in item else None)

    def make_run_keys(self, run_id: str, made: RunKeyItem) -> RunKeyItem:
        """Store ``made`` as the run's signing keys unless it has some: the keys that are stored either way."""
        item = {
            **self._key(run_id, KEY),
            "public": {kind: key.public for kind, key in made.keys.items()},
            "sealed": {kind: key.sealed for kind, key in made.keys.items()},
            **({} if made.vouched is None else {"vouched": made.vouched}),
        }
        stored = conditional(lambda: self.table.put_item(Item=item, ConditionExpression="attribute_not_exists(sk)"))
        if stored is not None:
            return made
        found = self.run_keys(run_id)
        assert found is not None  # a key item is never deleted while its run is
        return found

    # iterations: reading
    def get_counter(self, run_id: str, iteration: int) -> Counter:
        item = self.table.get_item(Key=self._key(run_id, iteration_sk(iteration)), ConsistentRead=True).get("Item")
        return Counter.model_validate({**plain(item or {}), "iteration": iteration})

    def get_iteration(self, run_id: str, iteration: int) -> IterationRecord:
        return iteration_record(iteration, self._query(run_id, iteration_sk(iteration)))

    def list_iterations(self, run_id: str) -> list[IterationRecord]:
        """The run's training iterations: not the round past its budget whose workers evaluate the final model."""
        meta = self.table.get_item(Key=self._key(run_id, META), ConsistentRead=True).get("Item")
        budget = RunRecord.model_validate(plain(meta)).iterations if meta else None
        by_iteration: dict[int, list[dict[str, Any]]] = {}
        for item in self._query(run_id, "ITER#"):
            by_iteration.setdefault(iteration_of(item["sk"]), []).append(item)
        return [iteration_record(i, items) for i, items in sorted(by_iteration.items()) if budget is None or i < budget]

    def worker_reports(self, run_id: str, iteration: int, workers: int, generation: int) -> list[WorkerReport]:
        """The reports of ``iteration`` in this generation (re-launch placeholders left out)."""
        items = self._get_by_keys([self._key(run_id, worker_sk(iteration, w)) for w in range(workers)])
        reports = [WorkerReport.model_validate(plain(i)) for i in items]
        return sorted((r for r in reports if r.reported and r.generation == generation), key=lambda r: r.worker)

    def _get_by_keys(self, keys: list[dict[str, str]]) -> list[dict[str, Any]]:
        """The items of these keys that exist, read by key (``BATCH_READ`` keys a request) rather than by a
        query, whose cost grows with the partition."""
        client, name = self.table.meta.client, self.table.name  # the resource's client: plain values
        items: list[dict[str, Any]] = []
        while keys:
            batch, keys = keys[:BATCH_READ], keys[BATCH_READ:]
            request = {name: {"Keys": batch, "ConsistentRead": True}}
            while request:
                response = client.batch_get_item(RequestItems=request)
                items += response["Responses"].get(name, [])
                request = response.get("UnprocessedKeys") or {}
        return items

    def forget_iterations(self, run_id: str, first: int) -> None:
        """Delete the items of iterations from ``first`` on, and their watched figures (a resumed run runs them
        again)."""
        with self.table.batch_writer() as batch:
            for item in self._query(run_id, "ITER#"):
                if iteration_of(item["sk"]) >= first:
                    batch.delete_item(Key={"pk": item["pk"], "sk": item["sk"]})
        watched = self.table.get_item(Key=self._key(run_id, WATCHED), ConsistentRead=True).get("Item") or {}
        forgotten = [key for key in watched if "@" in key and int(key.rsplit("@", 1)[1]) >= first]
        if forgotten:
            self.table.update_item(
                Key=self._key(run_id, WATCHED),
                UpdateExpression="REMOVE " + ", ".join(f"#w{n}" for n in range(len(forgotten))),
                ExpressionAttributeNames={f"#w{n}": key for n, key in enumerate(forgotten)},
            )

    # iterations: the work barrier
    def scale_workers(self, run_id: str, workers: int, reason: str) -> RunRecord | None:
        """Set the workers the run's next launched iteration takes (a STOPPED or FAILED run's: the first once it
        is resumed); None if the run is COMPLETED."""
        item = conditional(
            lambda: self.table.update_item(
                Key=self._key(run_id, META),
                UpdateExpression="SET workers = :workers, workers_reason = :reason",
                ConditionExpression="attribute_exists(#status) AND #status <> :completed",
                ExpressionAttributeNames={"#status": "status"},
                ExpressionAttributeValues={
                    ":workers": workers,
                    ":reason": reason,
                    ":completed": RunStatus.COMPLETED.value,
                },
                ReturnValues="ALL_NEW",
            )
        )
        return None if item is None else RunRecord.model_validate(plain(item["Attributes"]))

    def tune(
        self, run_id: str, iteration: int, state: TunerState, was: int, workers: int, reason: str | None
    ) -> RunRecord | None:
        """Store the tuner's decision for ``iteration``: its state, and the workers with the reason if they
        change from ``was``. Once per iteration, and only if the workers are still ``was`` (a ``run scale``
        meanwhile stands); None if it was not stored or the run is not RUNNING."""
        values = {"tuner": state.model_dump_json(), "tuned": iteration, "workers": workers, "workers_reason": reason}
        expression, names, bound = _set({k: v for k, v in values.items() if v is not None})
        item = conditional(
            lambda: self.table.update_item(
                Key=self._key(run_id, META),
                UpdateExpression=expression,
                ConditionExpression="#status = :running AND #workers = :was"
                " AND (attribute_not_exists(#tuned) OR #tuned < :tuned)",
                ExpressionAttributeNames={**names, "#status": "status"},
                ExpressionAttributeValues={**bound, ":running": RunStatus.RUNNING.value, ":was": was},
                ReturnValues="ALL_NEW",
            )
        )
        return None if item is None else RunRecord.model_validate(plain(item["Attributes"]))

    def claim_launch(
        self,
        run_id: str,
        iteration: int,
        trigger_id: str,
        generation: int = 0,
        workers: int | None = None,
        reason: str | None = None,
        spent: float | None = None,
    ) -> Counter | None:
        """Claim the launch of ``iteration`` for ``trigger_id`` with ``workers`` workers (a change of the fleet
        with its ``reason``; ``spent``: the run's spend the launch saw, with a budget): the iteration's counter,
        with the time and workers the first claim set (a retry of the same trigger launches the same ones), or None if
        another trigger of this generation or a later one launched it. An earlier generation's claim (its
        watchdog's, landing after a resume deleted the counter) gives way: the counter starts anew."""
        now = time.time()
        claim = {
            "launched_by": trigger_id,
            "launched_at": now,
            "generation": generation,
            "workers": workers,
            "workers_reason": reason,
            "spent_usd": spent,
        }
        values = {k: v for k, v in claim.items() if v is not None}
        first = frozenset({"launched_at", "workers", "workers_reason", "spent_usd"})
        expression, names, bound = _set(values, keep_first=first)
        key = self._key(run_id, iteration_sk(iteration))
        item = conditional(
            lambda: self.table.update_item(
                Key=key,
                UpdateExpression=expression,
                ConditionExpression="attribute_not_exists(launched_by) OR launched_by = :launched_by",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=bound,
                ReturnValues="ALL_NEW",
            )
        )
        if item is not None:
            return Counter.model_validate({**plain(item["Attributes"]), "iteration": iteration})
        fresh = {**key, **dynamo(values)}
        taken = conditional(
            lambda: self.table.put_item(
                Item=fresh,
                ConditionExpression=_EARLIER_GENERATION,
                ExpressionAttributeValues={":generation": generation},
            )
        )
        return None if taken is None else Counter.model_validate({**plain(fresh), "iteration": iteration})

    def record_worker(self, done: WorkDone) -> Counter | None:
        """Store ``done``'s report (once) and count it; the counter after, or None if the report is stale:
        an attempt the watchdog superseded, or an earlier generation of a resumed run (counted in
        ``stale_attempts`` instead). A report stored before (a duplicate, or a retry after a crash)
        is counted again: counts are hints that barriers check against the records."""
        report = WorkerReport.model_validate(done.model_dump())
        key = self._key(done.run_id, worker_sk(done.iteration, done.worker))
        stored = conditional(
            lambda: self.table.put_item(
                Item={**key, **dynamo(report.model_dump())},
                ConditionExpression=f"attribute_not_exists(sk) OR {_EARLIER_GENERATION}"
                " OR (attribute_not_exists(samples) AND attempt <= :attempt)",
                ExpressionAttributeValues={":attempt": done.attempt, ":generation": done.generation},
            )
        )
        if stored is None:
            existing = WorkerReport.model_validate(plain(self.table.get_item(Key=key, ConsistentRead=True)["Item"]))
            if (existing.attempt, existing.generation) != (done.attempt, done.generation):
                self._add(done.run_id, done.iteration, "stale_attempts")
                return None
        counter_key = self._key(done.run_id, iteration_sk(done.iteration))
        item = conditional(
            lambda: self.table.update_item(
                Key=counter_key,
                UpdateExpression="ADD arrived :one" + ("" if done.finite else ", nonfinite_arrived :one"),
                ConditionExpression=_SAME_GENERATION,
                ExpressionAttributeValues={":one": 1, ":generation": done.generation},
                ReturnValues="ALL_NEW",
            )
        )
        if item is None:
            self._add(done.run_id, done.iteration, "stale_attempts")
            return None
        return Counter.model_validate({**plain(item["Attributes"]), "iteration": done.iteration})

    def go_on(self, run_id: str, iteration: int, worker: int, generation: int) -> bool:
        """``stale_weights``: take ``worker``'s round of ``iteration`` for the invocation that computed its round
        before, unless the iteration's launch sent that round to a fresh invocation (``send_work``): whether it was
        taken. The one write decides, whichever of the two comes first."""
        free = "(attribute_not_exists({0}) OR NOT contains({0}, :worker))"
        return (
            conditional(
                lambda: self.table.update_item(
                    Key=self._key(run_id, iteration_sk(iteration)),
                    UpdateExpression="ADD went_on :workers",
                    ConditionExpression=" AND ".join(
                        (
                            free.format("published"),
                            free.format("went_on"),
                            "(attribute_not_exists(generation) OR generation = :generation)",
                        )
                    ),
                    ExpressionAttributeValues={":workers": {worker}, ":worker": worker, ":generation": generation},
                )
            )
            is not None
        )

    def send_work(self, run_id: str, iteration: int, workers: int) -> list[int]:
        """``stale_weights``: of the ``workers`` rounds of ``iteration``, those no invocation went on to compute
        (``go_on``), now taken for Work messages of the iteration's launch (a retry of it takes them again)."""
        while True:
            went_on = self.get_counter(run_id, iteration).went_on
            sent = [w for w in range(workers) if w not in went_on]
            if not sent:
                return []
            # the set only grows: its size as read says no invocation went on since
            unchanged = "size(went_on) = :seen" if went_on else "attribute_not_exists(went_on)"
            seen = {":seen": len(went_on)} if went_on else {}
            sending = partial(
                self.table.update_item,
                Key=self._key(run_id, iteration_sk(iteration)),
                UpdateExpression="ADD published :sent",
                ConditionExpression=unchanged,
                ExpressionAttributeValues={":sent": set(sent), **seen},
            )
            if conditional(sending):
                return sent

    def _add(self, run_id: str, iteration: int, counter: str, amount: int | set[int] = 1) -> None:
        """Add to one of the iteration's summary counts, if its counter is there: a count that comes after a
        resume deleted the counter is dropped, not stored in an item of its own."""
        conditional(
            lambda: self.table.update_item(
                Key=self._key(run_id, iteration_sk(iteration)),
                UpdateExpression=f"ADD {counter} :n",
                ConditionExpression="attribute_exists(sk)",
                ExpressionAttributeValues={":n": amount},
            )
        )

    def late_reports(self, run_id: str, iteration: int, staleness: int, generation: int) -> list[Participant]:
        """The finite updates of the ``staleness`` iterations before ``iteration`` that came after their
        reduce fired and no other reduce took (or ``iteration``'s did): one query per iteration looked at."""
        late: list[Participant] = []
        for source in range(max(0, iteration - staleness), iteration):
            record = self.get_iteration(run_id, source)
            if record.reduce_fired_by is None or record.generation != generation:
                continue
            late += [
                Participant(worker=r.worker, attempt=r.attempt, samples=r.samples or 0, etag=r.etag, iteration=source)
                for w, r in sorted(record.reports.items())
                if w in record.late and r.finite and r.folded_into in (None, iteration)
            ]
        return late

    def fold(self, run_id: str, participant: Participant, into: int) -> bool:
        """Claim a late update for the reduce of ``into`` (again, for the same one); False if another took it."""
        assert participant.iteration is not None
        key = self._key(run_id, worker_sk(participant.iteration, participant.worker))
        return (
            conditional(
                lambda: self.table.update_item(
                    Key=key,
                    UpdateExpression="SET folded_into = :into",
                    ConditionExpression=(
                        "attempt = :attempt AND (attribute_not_exists(folded_into) OR folded_into = :into)"
                    ),
                    ExpressionAttributeValues={":into": into, ":attempt": participant.attempt},
                )
            )
            is not None
        )

    def unfold(self, run_id: str, participant: Participant, into: int) -> None:
        """Give back a late update claimed for a reduce that fired without it."""
        assert participant.iteration is not None
        key = self._key(run_id, worker_sk(participant.iteration, participant.worker))
        conditional(
            lambda: self.table.update_item(
                Key=key,
                UpdateExpression="REMOVE folded_into",
                ConditionExpression="folded_into = :into",
                ExpressionAttributeValues={":into": into},
            )
        )

    def wait(self, done: WorkDone) -> None:
        """ASP: ``done``'s update waits to be applied (again, for a duplicate: the fold that applies it is once)."""
        waiting = Participant(
            worker=done.worker, attempt=done.attempt, samples=done.samples, iteration=done.iteration, etag=done.etag
        )
        item = {**self._key(done.run_id, waiting_sk(done.worker)), **dynamo(waiting.model_dump())}
        conditional(  # a late copy of an applied update leaves its worker's next one waiting
            lambda: self.table.put_item(
                Item={**item, "generation": done.generation},
                ConditionExpression="attribute_not_exists(sk) OR #i <= :i OR generation < :g",
                ExpressionAttributeNames={"#i": "iteration"},
                ExpressionAttributeValues={":i": done.iteration, ":g": done.generation},
            )
        )

    def waiting(self, run_id: str, workers: int, generation: int) -> list[Participant]:
        """ASP: the updates of ``generation`` that wait to be applied, the oldest (the model it read) first: the
        entries of the run's ``workers``, read by key (a query's cost grows with the partition, which a version's
        chain reads on every reduce it fires)."""
        items = [plain(i) for i in self._get_by_keys([self._key(run_id, waiting_sk(w)) for w in range(workers)])]
        fields = Participant.model_fields
        found = [
            Participant.model_validate({k: v for k, v in i.items() if k in fields})
            for i in items
            if i.get("generation", 0) == generation
        ]
        return sorted(found, key=lambda p: (p.iteration or 0, p.worker))

    def applied(self, run_id: str, update: Participant) -> None:
        """ASP: ``update`` was applied (or taken before): it waits no more (a later update of its worker stays)."""
        conditional(
            lambda: self.table.delete_item(
                Key=self._key(run_id, waiting_sk(update.worker)),
                ConditionExpression="#i = :i AND attempt = :a",
                ExpressionAttributeNames={"#i": "iteration"},
                ExpressionAttributeValues={":i": update.iteration, ":a": update.attempt},
            )
        )

    def freeze_participants(
        self, run_id: str, iteration: int, owner: int, participants: list[Participant], generation: int
    ) -> tuple[int, list[Participant]] | None:
        """Fire the reduce of ``iteration`` in ``generation`` with ``participants``, once: returns who fired it
        and with whom (``owner`` and ``participants`` if this call, or an earlier one of ``owner``'s, did), or
        None if a later generation fired it (an earlier generation's firing gives way to this one)."""
        key = self._key(run_id, participants_sk(iteration))
        item = {**key, "owner": owner, "participants": encode_participants(participants), "generation": generation}
        if conditional(
            lambda: self.table.put_item(
                Item=item,
                ConditionExpression=f"attribute_not_exists(sk) OR {_EARLIER_GENERATION}",
                ExpressionAttributeValues={":generation": generation},
            )
        ):
            return owner, participants
        stored = plain(self.table.get_item(Key=key, ConsistentRead=True)["Item"])
        if stored.get("generation", 0) != generation:
            return None
        return stored["owner"], decode_participants(stored["participants"])

    def frozen_participants(self, run_id: str, iteration: int) -> tuple[int, list[Participant]] | None:
        """(owner, participants) of the reduce of ``iteration`` as ``freeze_participants`` fired it; None before it
        fired."""
        item = self.table.get_item(Key=self._key(run_id, participants_sk(iteration)), ConsistentRead=True).get("Item")
        if item is None:
            return None
        stored = plain(item)
        return stored["owner"], decode_participants(stored["participants"])

    def open_version(self, run_id: str, iteration: int, generation: int) -> None:
        """ASP: the counter of model version ``iteration`` in ``generation``, unless its launch claimed it already:
        the Merger that made the version may fire its reduce before the version's launch comes."""
        conditional(
            lambda: self.table.put_item(
                Item={**self._key(run_id, iteration_sk(iteration)), "generation": generation},
                ConditionExpression="attribute_not_exists(sk)",
            )
        )

    def made_by(self, run_id: str, iteration: int, workers: int) -> list[Participant]:
        """ASP: the updates applied by the reduce that made model version ``iteration`` (> 0): that of the version
        their count before it (at most ``workers``), read by key; [] before it fired."""
        items = self._get_by_keys(
            [self._key(run_id, participants_sk(v)) for v in range(max(0, iteration - workers), iteration)]
        )
        for item in items:
            participants = decode_participants(plain(item)["participants"])
            if iteration_of(item["sk"]) + len(participants) == iteration:
                return participants
        return []

    def mark_reduce_fired(
        self,
        run_id: str,
        iteration: int,
        owner: int,
        participants: list[Participant],
        reports: list[WorkerReport],
        generation: int,
    ) -> None:
        """Note on the counter of ``generation`` that the reduce fired (late reports then skip the barrier),
        with the sum of the participants' train metrics states and the loss it gives (without them where a
        participant sent none)."""
        chosen = {p.worker for p in participants if p.iteration is None}  # late ones trained on another's batches
        state = _summed([r.metrics for r in reports if r.worker in chosen])
        values = {
            "reduce_fired_by": owner,
            "reduce_fired_at": time.time(),
            "participant_count": len(participants),
            "train_state": state,
            "train_loss": state[0] / state[1] if state and state[1] > 0 else None,
        }
        values = {k: v for k, v in values.items() if v is not None}
        expression, names, bound = _set(values, keep_first=frozenset(values))
        conditional(
            lambda: self.table.update_item(
                Key=self._key(run_id, iteration_sk(iteration)),
                UpdateExpression=expression,
                ConditionExpression=_SAME_GENERATION,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={**bound, ":generation": generation},
            )
        )

    def relaunch_workers(self, run_id: str, iteration: int, generation: int, attempts: dict[int, int]) -> None:
        """Supersede these workers' earlier attempts (worker → new attempt): their reports are ignored."""
        for worker, attempt in attempts.items():
            report = WorkerReport(worker=worker, attempt=attempt, generation=generation)
            conditional(
                partial(
                    self.table.put_item,
                    Item={**self._key(run_id, worker_sk(iteration, worker)), **dynamo(report.model_dump())},
                    ConditionExpression=f"attribute_not_exists(samples) OR {_EARLIER_GENERATION}",
                    ExpressionAttributeValues={":generation": generation},
                )
            )

    def redo_round(self, run_id: str, iteration: int, generation: int, worker: int, attempt: int) -> Counter | None:
        """Claim the one re-launch of ``worker``'s round of ``iteration``, whose update (of ``attempt``) a reducer
        refused after the reduce fired: its report is superseded by the next attempt's, whose report fires the reduce
        again (``redo_participant``). The counter after, or None if the round was re-launched so before."""
        claimed = conditional(
            lambda: self.table.update_item(
                Key=self._key(run_id, iteration_sk(iteration)),
                UpdateExpression="ADD redone :workers, redone_rounds :round",
                ConditionExpression=f"{_SAME_GENERATION}"
                " AND (attribute_not_exists(redone) OR NOT contains(redone, :w))",
                ExpressionAttributeValues={
                    ":workers": {worker},
                    ":round": {f"{worker}:{attempt}"},
                    ":w": worker,
                    ":generation": generation,
                },
                ReturnValues="ALL_NEW",
            )
        )
        if claimed is None:
            return None
        report = WorkerReport(worker=worker, attempt=attempt + 1, generation=generation)
        self.table.put_item(Item={**self._key(run_id, worker_sk(iteration, worker)), **dynamo(report.model_dump())})
        return Counter.model_validate({**plain(claimed["Attributes"]), "iteration": iteration})

    def redo_participant(
        self, run_id: str, iteration: int, generation: int, redone: Participant
    ) -> list[Participant] | None:
        """The participants of ``iteration``'s reduce with ``redone`` (the update of a round ``redo_round`` re-launched)
        in the place of its worker's refused one, stored; None if it is there already (a duplicate report) or the
        reduce fired in another generation."""
        key = self._key(run_id, participants_sk(iteration))
        stored = plain(self.table.get_item(Key=key, ConsistentRead=True)["Item"])
        before = decode_participants(stored["participants"])
        after = [
            redone if (p.worker, p.iteration) == (redone.worker, None) and p.attempt < redone.attempt else p
            for p in before
        ]
        if stored.get("generation", 0) != generation or after == before:
            return None
        swaps = stored.get("swaps", 0)  # two rounds re-launched at once: each swap sees the other's
        if conditional(
            lambda: self.table.update_item(
                Key=key,
                UpdateExpression="SET participants = :after, swaps = :next",
                ConditionExpression="attribute_not_exists(swaps) OR swaps = :swaps",
                ExpressionAttributeValues={
                    ":after": encode_participants(after),
                    ":next": swaps + 1,
                    ":swaps": swaps,
                },
            )
        ):
            return after
        return self.redo_participant(run_id, iteration, generation, redone)

    def record_continuation(
        self, run_id: str, iteration: int, worker: int, attempt: int, generation: int, until: float
    ) -> bool:
        """``worker``'s round (its ``attempt``) was handed on to a fresh invocation, which stores its progress or its
        update by ``until``; False (nothing recorded) if the attempt is superseded: re-launched, reported, or the
        record is of another generation."""
        expression, names, values = _set(
            {"worker": worker, "attempt": attempt, "generation": generation, "continues_until": until}
        )
        return (
            conditional(
                lambda: self.table.update_item(
                    Key=self._key(run_id, worker_sk(iteration, worker)),
                    UpdateExpression=expression,
                    ConditionExpression="attribute_not_exists(sk) OR (attribute_not_exists(samples)"
                    " AND #generation = :generation AND #attempt <= :attempt)",
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                )
            )
            is not None
        )

    def record_reduce_relaunch(self, run_id: str, iteration: int, shards: int) -> None:
        self._add(run_id, iteration, "reduce_relaunches", shards)

    def record_stale_shard(self, run_id: str, iteration: int, shard: int) -> None:
        """No reducer of ``shard`` finished ``iteration`` in time: the shard kept its weights."""
        self._add(run_id, iteration, "stale_shards", {shard})

    def record_dropped_parts(self, run_id: str, iteration: int, shard: int, workers: list[int]) -> None:
        """Reducer ``shard`` averaged ``iteration`` without these workers' parts (their reads timed out)."""
        if workers:
            self.table.put_item(
                Item={**self._key(run_id, shard_sk(iteration, shard)), "shard": shard, "dropped": workers}
            )

    # iterations: the norm exchange (runs that clip by norm; see slsml.training.clipping)
    def record_squares(
        self, run_id: str, iteration: int, shard: int, generation: int, squares: dict[str, float]
    ) -> Counter | None:
        """Store ``shard``'s sums of squares (once: they come from its stored average) and count them; the
        counter after (None: an earlier generation's)."""
        item = {**self._key(run_id, squares_sk(iteration, shard)), "shard": shard, "squares": dynamo(squares)}
        conditional(lambda: self.table.put_item(Item=item, ConditionExpression="attribute_not_exists(sk)"))
        return self._count(run_id, iteration, "squares_in", generation)

    def shard_squares(self, run_id: str, iteration: int, reducers: int) -> list[dict[str, float]]:
        """The sums of squares stored so far for ``iteration``, one mapping per shard that stored them, in
        shard order (so that every reducer adds them up alike)."""
        items = self._get_by_keys([self._key(run_id, squares_sk(iteration, r)) for r in range(reducers)])
        return [plain(item["squares"]) for item in sorted(items, key=lambda item: int(item["shard"]))]

    def release_steps(self, run_id: str, iteration: int, shard: int, generation: int) -> bool:
        """Claim the release of ``iteration``'s steps in ``generation`` once every shard's squares are in (True
        for ``shard``'s message, again on its retry)."""
        return (
            conditional(
                lambda: self.table.update_item(
                    Key=self._key(run_id, iteration_sk(iteration)),
                    UpdateExpression="SET steps_released_by = :shard",
                    ConditionExpression="(attribute_not_exists(steps_released_by) OR steps_released_by = :shard)"
                    f" AND {_SAME_GENERATION}",
                    ExpressionAttributeValues={":shard": shard, ":generation": generation},
                )
            )
            is not None
        )

    # iterations: the merge barrier
    def record_shard(self, run_id: str, iteration: int, generation: int) -> Counter | None:
        """Count a finished shard; the counter after (None: an earlier generation's)."""
        return self._count(run_id, iteration, "shards_in", generation)

    def _count(self, run_id: str, iteration: int, counter: str, generation: int) -> Counter | None:
        """Add one to ``counter`` of the iteration of this generation; the counter item after, or None."""
        item = conditional(
            lambda: self.table.update_item(
                Key=self._key(run_id, iteration_sk(iteration)),
                UpdateExpression=f"ADD {counter} :one",
                ConditionExpression=_SAME_GENERATION,
                ExpressionAttributeValues={":one": 1, ":generation": generation},
                ReturnValues="ALL_NEW",
            )
        )
        return None if item is None else Counter.model_validate({**plain(item["Attributes"]), "iteration": iteration})

    def record_evaluation(
        self, run_id: str, iteration: int, split: str, figures: dict[str, float], monitors: Iterable[str] = ()
    ) -> None:
        """The figures on ``split`` (test, val) of the model ``iteration`` merged (the same whoever computes them,
        however often); those of ``monitors`` (``val_auc``: the validation split's auc) on that split also in the
        run's watched figures (``watched``)."""
        values = {
            k: v for k, v in (_test_figures(figures) if split == "test" else {split: figures}).items() if v is not None
        }
        expression, names, bound = _set(values)
        self.table.update_item(
            Key=self._key(run_id, iteration_sk(iteration)),
            UpdateExpression=expression,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=bound,
        )
        watched = {
            f"{monitor}@{iteration}": figures[name]
            for monitor in monitors
            for watched_split, name in [monitor.split("_", 1)]
            if watched_split == split and name in figures
        }
        if watched:
            self.table.update_item(
                Key=self._key(run_id, WATCHED),
                UpdateExpression="SET " + ", ".join(f"#w{n} = :w{n}" for n in range(len(watched))),
                ExpressionAttributeNames={f"#w{n}": key for n, key in enumerate(watched)},
                ExpressionAttributeValues={f":w{n}": dynamo(value) for n, value in enumerate(watched.values())},
            )

    def record_saved(self, run_id: str, iteration: int, sha256: str) -> None:
        """The Merger saved the model entering ``iteration`` with the SHA-256 ``sha256`` (a resumed run's save again
        replaces it)."""
        self.table.put_item(Item={**self._key(run_id, saved_sk(iteration)), "sha256": sha256})

    def saved_sha256(self, run_id: str, iteration: int) -> str | None:
        """The SHA-256 of the model entering ``iteration`` as the Merger saved it; None: it saved none."""
        item = self.table.get_item(Key=self._key(run_id, saved_sk(iteration)), ConsistentRead=True).get("Item")
        return None if item is None else str(item["sha256"])

    def watched(self, run_id: str, monitor: str) -> list[tuple[int, float]]:
        """``monitor``'s figure of each evaluation so far, with the iteration whose merged model it is, in order: one
        item read by key, one request whatever the run's length (an early-stopping check at every epoch's end costs
        the same at the 40th as at the 3rd)."""
        item = self.table.get_item(Key=self._key(run_id, WATCHED), ConsistentRead=True).get("Item") or {}
        prefix = f"{monitor}@"
        return sorted(
            (int(key.removeprefix(prefix)), float(value)) for key, value in item.items() if key.startswith(prefix)
        )

    def fire_merge(
        self, run_id: str, iteration: int, shard: int, generation: int, train: dict[str, float] | None = None
    ) -> bool:
        """Claim the merge of ``iteration`` in ``generation`` (True for ``shard``'s message, again on its retry,
        which keeps the first claim's ``merged_at``), recording ``train``: the figures over its batches."""
        values: dict[str, Any] = {"merge_fired_by": shard, "merged_at": time.time()}
        if train is not None:
            values["train"] = train
        expression, names, bound = _set(values, frozenset({"merged_at"}))
        return (
            conditional(
                lambda: self.table.update_item(
                    Key=self._key(run_id, iteration_sk(iteration)),
                    UpdateExpression=expression,
                    ConditionExpression="(attribute_not_exists(merge_fired_by) OR merge_fired_by = :merge_fired_by)"
                    f" AND {_SAME_GENERATION}",
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues={**bound, ":generation": generation},
                )
            )
            is not None
        )


def _test_figures(test: dict[str, float] | None) -> dict[str, Any]:
    """A model's test figures as the run table keeps them: all by name, the loss and accuracy on their own too."""
    if test is None:
        return {}
    return {"test": test, "test_loss": test.get("loss"), "test_accuracy": test.get("accuracy")}


def _summed(states: list[list[float] | None]) -> list[float] | None:
    """The sum of metrics states of one size (None if there are none, one is missing or they differ in size); a
    column that holds NaN or Inf sums to NaN or Inf, as float arithmetic gives it."""
    if not states or any(s is None or len(s) != len(states[0] or ()) for s in states):
        return None
    return [
        math.fsum(column) if all(map(math.isfinite, column)) else sum(column) for column in zip(*states, strict=True)
    ]
