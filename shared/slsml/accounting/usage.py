"""Requests and cost, counted by the pipeline functions themselves.

Every client that ``slsml.aws.clients`` makes is instrumented with botocore event hooks (``instrument``):

- each HTTP attempt, retries included, counts one request of ``service:Operation``, the service as
  IAM names it (``s3:GetObject``, ``dynamodb:UpdateItem``, ``sns:PublishBatch``, ``states:SendTaskSuccess``);
- DynamoDB operations that accept it are sent with ``ReturnConsumedCapacity=TOTAL`` and their read
  and write units summed (``_dynamodb_units``);
- SNS publishes count billed publishes: each message, one per 64 KB chunk (``prices.sns_chunks``);
- S3 GetObject, PutObject and UploadPart bodies count bytes read and written.

A call whose HTTP attempts go out past its client's hooks (a ranged GET by pre-signed URL, ``slsml.aws.ranged``)
counts them itself the same way (``Sent``).

Counts go to the open scope: the work on one message, for one (run, iteration), within one Lambda
invocation (``invocation``, ``scope``). Requests made outside any scope (at import, between two
messages) go to the invocation's next scope; an invocation that opens none (a rejected message)
reports its time and requests with no run. Each scope ends in one log line through Powertools'
Logger, with key ``usage``: the function, start, end, duration and memory, the requests by
operation, the read and write units, billed publishes and bytes, and which part of the iteration the
message was (``about``: its worker or shard, attempt, a deadline's stage), where it names one. Its
duration runs from the end of the invocation's previous scope (its start, for the first), so a
message's scopes add up to its invocation's billed duration, bar what follows the last one.

What a container reads once to serve a run (``warming``: its run.json, the model it starts from, the dataset's
manifest and the shards of a split it keeps warm) is not an iteration's work, whichever iteration first brings the
run to that container: it is logged in a line of its own, for the run and no iteration, of no duration (its time
stays in the scope's line), so that it counts in the run's totals and not in the iteration's (a warm pool's
processes meet a run at any iteration).

``read_local`` and ``read_cloudwatch`` collect a run's records; ``figures`` prices them.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from aws_lambda_powertools import Logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slsml.accounting import capacity, prices
from slsml.accounting.prices import PriceTable
from slsml.spec.deployment import SERVICE_NAME

USAGE_KEY = "usage"  # the key of a usage log line
# which part of an iteration a message was, if it says
PART_FIELDS = ("worker", "pipeline_stage", "shard", "attempt", "stage")
_CALL = "slsml_usage"  # the key of a call's bookkeeping in botocore's request context
_DYNAMODB_READS = {"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"}

# named, not from POWERTOOLS_SERVICE_NAME: slsml.aws.clients imports this module before a local function's
# environment is set
logger = Logger(service=SERVICE_NAME, child=True)


class Streamed(BaseModel):
    """A worker's round as its stream of micro-batches saw it (``slsml.rounds.stream``): the micro-batch, how many
    it computed, their reads' seconds added up, the seconds compute waited for a read (the rest of the reading
    overlapped compute) and the seconds it computed."""

    model_config = ConfigDict(frozen=True)

    micro_batch: int
    micro_batches: int
    read_s: float
    waited_s: float
    compute_s: float


class UsageRecord(BaseModel):
    """One scope's usage line (``invocation``, the Lambda request id, and ``trace_id``, the X-Ray trace on
    AWS, come from the line around it)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    run_id: str | None
    iteration: int | None
    function: str
    start: float
    end: float
    duration_s: float
    memory_mb: int
    requests: dict[str, int]
    read_units: float = 0.0
    write_units: float = 0.0
    sns_billed: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    # the message's part of the iteration (``about``); logged only where the message names it
    worker: int | None = None
    pipeline_stage: int | None = Field(default=None, description="a worker's: the stage of its round (0: its first)")
    shard: int | None = None
    attempt: int | None = None
    stage: str | None = Field(default=None, description="a deadline's: the barrier it watched (work, reduce)")
    streamed: Streamed | None = Field(default=None, description="a worker's: its round's micro-batches")
    invocation: str | None = Field(default=None, exclude=True)
    trace_id: str | None = Field(default=None, exclude=True)


# ---- counting, in a function's process -----------------------------------------------------------


@dataclass
class _Counts:
    requests: Counter = field(default_factory=Counter)
    read_units: float = 0.0
    write_units: float = 0.0
    sns_billed: int = 0
    bytes_read: int = 0
    bytes_written: int = 0


@dataclass
class _Scope:
    run_id: str | None
    iteration: int | None
    counts: _Counts
    part: dict[str, Any] = field(default_factory=dict)  # of PART_FIELDS
    open: bool = True
    warm: _Counts = field(default_factory=_Counts)  # what it read to fill the container's warm cache (``warming``)
    streamed: Streamed | None = None


@dataclass
class _Invocation:
    function: str
    memory_mb: int
    mark: float  # when its previous scope ended (its start, before the first)
    scopes: int = 0
    bytes_read: int = 0  # S3 bytes of its scopes' lines, summed
    bytes_written: int = 0


@dataclass
class _Call:
    """What a call's hooks share: the scope it was made in and its parameters."""

    scope: _Scope | None
    params: dict[str, Any]
    warming: bool = False  # made within ``warming``
    publishes: dict[str, int] = field(default_factory=dict)  # SNS entry id → billed publishes
    body_bytes: int = 0  # an S3 PutObject's


_lock = threading.Lock()  # the hooks run in whatever thread makes the call (parallel S3 reads)
_scope: _Scope | None = None
_pending = _Counts()  # made outside any scope: for the next one
_invocation: _Invocation | None = None


class _Thread(threading.local):
    warming = False  # the calls this thread makes are ``warming``


_thread = _Thread()


def _counts(scope: _Scope | None, warming: bool = False) -> _Counts:
    """Where a call's counts go: its scope while that is open, else the open one, else the pending counts; a call
    made ``warming`` the scope's warm-up counts."""
    if scope is None or not scope.open:
        scope = _scope
    if scope is None:
        return _pending
    return scope.warm if warming else scope.counts


@contextmanager
def warming() -> Iterator[None]:
    """The calls this thread makes in the block fill the container's warm cache for the open scope's run: they
    count for the run, not for its iteration (see the module's description)."""
    _thread.warming = True
    try:
        yield
    finally:
        _thread.warming = False


@contextmanager
def invocation(function: str, memory_mb: int) -> Iterator[_Invocation]:
    """One Lambda invocation of ``function`` (its configured memory); scopes are opened within it. What it
    yields sums the S3 bytes of its scopes' lines (``bytes_read``, ``bytes_written``) once they are logged."""
    global _invocation
    _invocation = current = _Invocation(function, memory_mb, time.time())
    try:
        yield current
    finally:
        if current.scopes == 0:
            with scope(None, None):
                pass
        _invocation = None


def about(message: Any) -> dict[str, Any]:
    """Which part of its iteration a message is, for its scope: the fields of ``PART_FIELDS`` it has."""
    return {name: value for name in PART_FIELDS if (value := getattr(message, name, None)) is not None}


@contextmanager
def scope(run_id: str | None, iteration: int | None, **part: Any) -> Iterator[None]:
    """Count what is sent until the block ends for (``run_id``, ``iteration``), then log it with ``part``
    (``about``: worker, pipeline stage, shard, attempt, deadline stage)."""
    global _scope, _pending
    current = _invocation
    if current is None:
        raise RuntimeError("a usage scope must be opened within an invocation")
    with _lock:
        opened = _Scope(run_id, iteration, _pending, part)
        _scope, _pending = opened, _Counts()
    try:
        yield
    finally:
        with _lock:
            opened.open, _scope = False, None
        end = time.time()
        _log(opened, current, end)
        if opened.warm != _Counts():
            _log(_Scope(opened.run_id, None, opened.warm), current, end, start=end)
        current.mark, current.scopes = end, current.scopes + 1


def streamed(figures: Streamed) -> None:
    """Log the open scope's round of micro-batches with its usage line."""
    if _scope is not None:
        _scope.streamed = figures


def attribute(run_id: str | None, iteration: int | None = None) -> None:
    """Name the run (and iteration) of the open scope, for a message that names none (a dropped model)."""
    if _scope is not None:
        _scope.run_id, _scope.iteration = run_id, iteration


def scope_run() -> str | None:
    """The run the open scope counts for (None: no scope is open, or it names no run)."""
    return None if _scope is None else _scope.run_id


def so_far(table: PriceTable) -> float:
    """The dollars of the open scope so far, as its usage line will price them: its requests, DynamoDB units
    and share of the invocation's duration, and with the invocation's first scope its request."""
    if _scope is None or _invocation is None:
        raise RuntimeError("no usage scope is open")
    with _lock:
        counts = _scope.counts
        both = _Scope(_scope.run_id, _scope.iteration, _merged(counts, _scope.warm))
        record = _scope_record(both, _invocation, time.time())
    dollars = sum(cost([record], table).values())
    return dollars if _invocation.scopes == 0 else dollars - table.lambda_request


def _merged(first: _Counts, second: _Counts) -> _Counts:
    return _Counts(
        first.requests + second.requests,
        first.read_units + second.read_units,
        first.write_units + second.write_units,
        first.sns_billed + second.sns_billed,
        first.bytes_read + second.bytes_read,
        first.bytes_written + second.bytes_written,
    )


def _scope_record(opened: _Scope, current: _Invocation, end: float, start: float | None = None) -> UsageRecord:
    """The usage record of ``opened`` if it ended at ``end`` (and began at ``start``: default, where the
    invocation's previous scope ended)."""
    counts, start = opened.counts, current.mark if start is None else start
    return UsageRecord(
        run_id=opened.run_id,
        iteration=opened.iteration,
        function=current.function,
        start=round(start, 3),
        end=round(end, 3),
        duration_s=round(end - start, 4),
        memory_mb=current.memory_mb,
        requests=dict(sorted(counts.requests.items())),
        read_units=counts.read_units,
        write_units=counts.write_units,
        sns_billed=counts.sns_billed,
        bytes_read=counts.bytes_read,
        bytes_written=counts.bytes_written,
        streamed=opened.streamed,
        **opened.part,
    )


def _log(opened: _Scope, current: _Invocation, end: float, start: float | None = None) -> None:
    current.bytes_read += opened.counts.bytes_read
    current.bytes_written += opened.counts.bytes_written
    record = _scope_record(opened, current, end, start)
    unnamed = {name for name in (*PART_FIELDS, "streamed") if getattr(record, name) is None}  # no bytes for none
    logger.info(USAGE_KEY, extra={USAGE_KEY: record.model_dump(exclude=unnamed)})


def instrument(client: Any) -> None:
    """Count what ``client`` sends (see the module's description)."""
    service = client.meta.service_model.endpoint_prefix  # s3, dynamodb, sns, sqs, states
    service_id = client.meta.service_model.service_id.hyphenize()
    events = client.meta.events
    # after the handlers of boto3's DynamoDB resource, which serialize the parameters…
    events.register_last("before-parameter-build", _before_build)
    events.register("request-created", partial(_attempt, service))
    # …and before those that deserialize the response
    events.register_first(f"after-call.{service_id}", partial(_after_call, service))


class Sent:
    """What one call sends past its client's hooks (``slsml.aws.ranged``), counted as the hooks count a client's
    call: for the scope it is made in (and its thread's ``warming``), one ``request`` (``service:Operation``) each
    HTTP attempt, retries included, and the bytes of an S3 GET's body."""

    def __init__(self, request: str) -> None:
        self._call = _Call(_scope, {}, _thread.warming)
        self._request = request

    def attempt(self) -> None:
        with _lock:
            _counts(self._call.scope, self._call.warming).requests[self._request] += 1

    def read(self, size: int) -> None:
        with _lock:
            _counts(self._call.scope, self._call.warming).bytes_read += size


_BODY_WRITES = {"PutObject", "UploadPart"}  # the S3 requests whose bodies are the bytes written


def _before_build(params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
    call = context[_CALL] = _Call(_scope, params, _thread.warming)
    if model.input_shape is not None and "ReturnConsumedCapacity" in model.input_shape.members:
        params.setdefault("ReturnConsumedCapacity", "TOTAL")
    if model.name == "PublishBatch":
        call.publishes = {e["Id"]: prices.sns_chunks(_publish_bytes(e)) for e in params["PublishBatchRequestEntries"]}
    elif model.name == "Publish":
        call.publishes = {"": prices.sns_chunks(_publish_bytes(params))}
    elif model.name in _BODY_WRITES:
        call.body_bytes = _body_bytes(params.get("Body"))


def _attempt(service: str, request: Any, operation_name: str, **_: Any) -> None:
    call = request.context.get(_CALL)
    with _lock:
        _counts(call.scope if call else _scope, call is not None and call.warming).requests[
            f"{service}:{operation_name}"
        ] += 1


def _after_call(
    service: str, http_response: Any, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
) -> None:
    call: _Call | None = context.get(_CALL)
    if call is None:
        return
    ok = http_response.status_code < 300
    operation = model.name
    with _lock:
        counts = _counts(call.scope, call.warming)
        if service == "dynamodb":
            units = _dynamodb_units(operation, call.params, parsed, ok)
            if operation in _DYNAMODB_READS:
                counts.read_units += units
            else:
                counts.write_units += units
        elif not ok:
            return
        elif operation == "GetObject":
            counts.bytes_read += parsed.get("ContentLength") or 0
        elif operation in _BODY_WRITES:
            counts.bytes_written += call.body_bytes
        elif operation == "PublishBatch":
            counts.sns_billed += sum(call.publishes.get(entry["Id"], 1) for entry in parsed.get("Successful", []))
        elif operation == "Publish":
            counts.sns_billed += call.publishes[""]


def _publish_bytes(entry: Mapping[str, Any]) -> int:
    """A published message's billed size: its body and its attributes."""
    attributes = entry.get("MessageAttributes") or {}
    return len(entry["Message"].encode()) + sum(
        len(name.encode())
        + len(value.get("DataType", ""))
        + len(str(value.get("StringValue", "")).encode())
        + len(value.get("BinaryValue", b""))
        for name, value in attributes.items()
    )


def _body_bytes(body: Any) -> int:
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    if isinstance(body, str):
        return len(body.encode())
    if hasattr(body, "seek") and hasattr(body, "tell"):
        position = body.tell()
        size = body.seek(0, 2) - position
        body.seek(position)
        return size
    return 0


# ---- DynamoDB capacity ---------------------------------------------------------------------------


def _dynamodb_units(operation: str, params: dict[str, Any], parsed: dict[str, Any], ok: bool) -> float:
    """The units one call consumed: the larger of what the response reports (``ConsumedCapacity``) and
    DynamoDB's rules (``slsml.accounting.capacity``) applied to the items the call carries.

    In AWS the reported figure is exact, and the rule, which sees only the items in the request and
    the response, stays at or below it. The embedded cloud (moto 5.2.5) reports fixed figures whatever
    the size (PutItem 1, DeleteItem 1, Query 1, Scan 1, GetItem 0.5, UpdateItem 0.5 even unasked),
    which the rule raises to DynamoDB's minimum and to a large item's size. A conditional write that
    fails reports nothing yet consumes units: counted by the rule alone; other errors consume none.
    """
    if not ok:
        failed_condition = parsed.get("Error", {}).get("Code") == "ConditionalCheckFailedException"
        return _write_units(operation, params, parsed) if failed_condition else 0.0
    reported = parsed.get("ConsumedCapacity") or []
    reported = sum(c.get("CapacityUnits", 0.0) for c in ([reported] if isinstance(reported, dict) else reported))
    if operation in {"GetItem", "Query", "Scan"}:
        items = [parsed["Item"]] if parsed.get("Item") else parsed.get("Items", [])
        rule = capacity.read_units(sum(map(wire_item_bytes, items)), bool(params.get("ConsistentRead")))
    elif operation in _DYNAMODB_READS:  # batches and transactions: as reported
        rule = 0.0
    else:
        rule = _write_units(operation, params, parsed)
    return max(float(reported), rule)


def _write_units(operation: str, params: dict[str, Any], parsed: dict[str, Any]) -> float:
    if operation == "PutItem":
        written = wire_item_bytes(params.get("Item", {}))
    elif operation in {"UpdateItem", "DeleteItem"}:  # what the request carries: a lower bound of the item
        names = sum(len(name.encode()) for name in (params.get("ExpressionAttributeNames") or {}).values())
        values = sum(_value_bytes(v) for v in (params.get("ExpressionAttributeValues") or {}).values())
        written = wire_item_bytes(params.get("Key", {})) + names + values
    else:
        return 0.0
    returned = (wire_item_bytes(parsed.get(key) or {}) for key in ("Attributes", "Item"))
    return float(capacity.write_units(written, *returned))


def wire_item_bytes(item: Mapping[str, Any]) -> int:
    """``capacity.item_bytes`` of an item in the wire form (``{"S": ...}``) that requests and responses carry."""
    return sum(len(name.encode()) + _value_bytes(value) for name, value in item.items())


def _value_bytes(value: Mapping[str, Any]) -> int:
    ((kind, content),) = value.items()
    if kind == "S":
        return len(content.encode())
    if kind == "N":
        return _number_bytes(content)
    if kind == "B":
        return len(content)
    if kind in {"BOOL", "NULL"}:
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in content)
    if kind == "NS":
        return sum(map(_number_bytes, content))
    if kind == "BS":
        return sum(map(len, content))
    if kind == "M":
        return 3 + sum(len(k.encode()) + _value_bytes(v) + 1 for k, v in content.items())
    return 3 + sum(_value_bytes(v) + 1 for v in content)  # L


def _number_bytes(number: str) -> int:
    """1 byte per two significant digits, plus 1."""
    digits = number.lstrip("+-").lower().split("e")[0].replace(".", "").strip("0") or "0"
    return (len(digits) + 1) // 2 + 1


# ---- reading and pricing a run's records ---------------------------------------------------------


def _record(line: str, run_id: str) -> UsageRecord | None:
    """The usage record of ``run_id`` in one log line, if it holds one."""
    start = line.find("{")
    if start < 0:
        return None
    try:
        entry = json.loads(line[start:])
        usage = entry.get(USAGE_KEY) if isinstance(entry, dict) else None
        if not isinstance(usage, dict) or usage.get("run_id") != run_id:
            return None
        return UsageRecord.model_validate(
            {**usage, "invocation": entry.get("function_request_id"), "trace_id": entry.get("xray_trace_id")}
        )
    except (ValueError, ValidationError):
        return None


def read_local(log_dir: Path, run_id: str) -> list[UsageRecord]:
    """The run's records in a local runtime's function logs, ``<log_dir>/<function>.log``."""
    records: list[UsageRecord] = []
    for path in sorted(log_dir.glob("*.log")):
        with path.open() as log:
            records += filter(None, (_record(line, run_id) for line in log if run_id in line and USAGE_KEY in line))
    return records


def read_cloudwatch(logs: Any, log_groups: Iterable[str], run_id: str, since: float) -> list[UsageRecord]:
    """The run's records in the functions' CloudWatch log groups, from ``since`` (epoch seconds) on.

    The filter pattern selects the run's usage lines in AWS; each line is checked here as well.
    """
    records: list[UsageRecord] = []
    pattern = f'{{ $.{USAGE_KEY}.run_id = "{run_id}" }}'
    for group in log_groups:
        pages = logs.get_paginator("filter_log_events").paginate(
            logGroupName=group, startTime=int(since * 1000), filterPattern=pattern
        )
        records += filter(None, (_record(event["message"], run_id) for page in pages for event in page["events"]))
    return records


def lambda_usage(records: Iterable[UsageRecord]) -> tuple[float, int]:
    """Lambda GB-seconds (each invocation's duration, rounded up to the ms, × its memory) and invocations."""
    invocations: dict[Any, list[float]] = {}
    for index, record in enumerate(records):
        spent = invocations.setdefault(record.invocation or index, [0.0, record.memory_mb])
        spent[0] += record.duration_s
    return sum(prices.gb_seconds(duration, int(memory)) for duration, memory in invocations.values()), len(invocations)


def cost(records: Iterable[UsageRecord], table: PriceTable) -> dict[str, float]:
    """Dollars by service: requests (SNS publishes as billed), DynamoDB units, Lambda GB-seconds and invocations."""
    records = list(records)
    requests: Counter = Counter()
    for record in records:
        requests.update(record.requests)
    priced = {op: n for op, n in requests.items() if not op.startswith("sns:Publish")}
    billed = sum(r.sns_billed for r in records)
    if billed:
        priced["sns:Publish"] = billed
    lambda_gb_s, invocations = lambda_usage(records)
    return table.cost(
        priced,
        read_units=sum(r.read_units for r in records),
        write_units=sum(r.write_units for r in records),
        gb_seconds=lambda_gb_s,
        invocations=invocations,
    )


def _typical(per_iteration: list[Counter], operations: list[str]) -> dict[str, float]:
    """The median count of each operation over the iterations; operations most iterations do not make
    (a deadline or a heartbeat every few minutes) are left out: they count in the cost."""
    medians = {op: statistics.median(c[op] for c in per_iteration) for op in operations}
    return {op: int(m) if m == int(m) else m for op, m in medians.items() if m}


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def figures(records: list[UsageRecord], iterations: int, table: PriceTable) -> dict[str, Any]:
    """A run's usage figures (``RunSummary`` fields). Per iteration: the median over the iterations
    ``0 … iterations-1`` of what was done for each; records of no iteration (a run starting, the run
    completing after its last one) count in the totals only."""
    by_iteration: dict[int, list[UsageRecord]] = defaultdict(list)
    for record in records:
        if record.iteration is not None and record.iteration < iterations:
            by_iteration[record.iteration].append(record)
    counted = [by_iteration[i] for i in range(iterations)]
    per_iteration: list[Counter[str]] = [Counter() for _ in counted]
    for counter, done in zip(per_iteration, counted, strict=True):
        for record in done:
            counter.update(record.requests)
    operations = sorted(set().union(*per_iteration)) if per_iteration else []
    by_service = cost(records, table)
    return {
        "requests_per_iteration": _typical(per_iteration, operations),
        "bytes_read_per_iteration": _median(sum(r.bytes_read for r in done) for done in counted),
        "bytes_written_per_iteration": _median(sum(r.bytes_written for r in done) for done in counted),
        "gb_seconds": round(lambda_usage(records)[0], 3),
        "cost_usd": sum(by_service.values()),
        "cost_per_iteration_usd": statistics.median(sum(cost(d, table).values()) for d in counted) if counted else None,
        "cost_by_service_usd": by_service,
    }
