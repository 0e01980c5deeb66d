"""The plan's quota checks: Lambda's concurrency, burst, memory and duration, message and item sizes, DynamoDB's
partition writes, S3's request rates per prefix and the package sizes, each with its use and what to do past it."""

from __future__ import annotations

import math
from collections.abc import Callable

from slsml.cost.datatraffic import DataTraffic
from slsml.cost.gpuworker import LAUNCHED_INSTANCES, fleet_vcpus
from slsml.cost.messages import listed
from slsml.cost.parameters import Parameters, Quotas
from slsml.cost.plan import QuotaCheck
from slsml.cost.workerround import MicroBatches, step_in_words
from slsml.cost.workload import MEMORY_CHOICES_MB, Workload
from slsml.spec import keys
from slsml.spec.messages import MAX_MESSAGE_BYTES


def quota_checks(
    w: Workload,
    p: Parameters,
    q: Quotas,
    n: int,
    largest: tuple[int, int],
    critical: dict[str, float],
    memory_needed: dict[str, float],
    worker_steps: Callable[[int], MicroBatches],
    spreads: dict[str, float],
    reduce_read: float,
    weights_read: float,
    chain_s: float,
    floor_s: float,
    counter_units: int,
    data: DataTraffic | None = None,
    writes: tuple[int, int] = (1, 1),
) -> list[QuotaCheck]:
    """Each quota against an iteration of ``w``: ``n`` participants, the ``largest`` Reduce message (participants,
    bytes), each function's ``critical`` seconds and ``memory_needed``, a worker's micro-batches at a memory
    (``worker_steps``), the launchers' publishing ``spreads``, the reads on the path, the chain, its DynamoDB floor
    and the counter's write units, the workers' ``data`` reads, and the requests that ``writes`` an update and a
    shard."""
    W, R = w.workers, w.reducers
    checks: list[QuotaCheck] = []

    def add(name: str, value: float, limit: float, unit: str, detail: str, hard: bool = False) -> None:
        checks.append(
            QuotaCheck(name=name, value=value, limit=limit, unit=unit, ok=value <= limit, hard=hard, detail=detail)
        )

    # Workers run while the WorkLauncher still publishes (when a worker outlasts the launch), reducers likewise. GPU
    # workers run on Lambda Managed Instances, whose environments take none of the account's concurrency and start
    # no burst: their fleet counts against the EC2 quota of G instances instead.
    workers_in_flight = (
        0
        if w.accelerator is not None
        else W
        if critical["worker"] >= spreads["work"]
        else math.ceil(W * critical["worker"] / spreads["work"])
    )
    stage = (
        f"{workers_in_flight} workers in flight while the WorkLauncher publishes (+1)"
        if workers_in_flight >= R
        else f"{R} reducers in flight while the ReduceLauncher publishes (+1)"
    )
    add(
        "Lambda concurrency",
        max(workers_in_flight, R) + 1,
        q.lambda_concurrency,
        "executions",
        f"{stage}; throttled invocations wait and retry",
    )
    if w.accelerator is None:
        add(
            "Lambda burst (first iteration)",
            W * 10 / max(10.0, spreads["work"]),
            q.lambda_burst_per_10s,
            "new workers / 10 s",
            f"{W} cold workers start within {spreads['work']:.1f} s",
        )
    elif q.ec2_g_vcpus is not None:
        add(
            "EC2 G instances (vCPUs)",
            fleet_vcpus(w),
            max(q.ec2_g_vcpus, 1e-9),
            "vCPUs",
            f"the fleet's {w.accelerator.instance} instances (at least {LAUNCHED_INSTANCES}) against the account's"
            " Running On-Demand G and VT instances quota (L-DB2E81BA): Lambda cannot launch past it; raise it in"
            " Service Quotas",
            hard=True,
        )
    for name in ("worker", "reducer", "merger"):
        need, have = memory_needed[name], w.memory_mb[name]
        detail = f"{name} needs ~{need:,.0f} MB and has {have:,} MB"
        if name == "worker":
            steps = worker_steps(have)
            detail += f" for a step {step_in_words(steps.size, steps.per_step)}" + (
                "" if steps.size <= steps.fitting else f" ({steps.fitting} fit)" if steps.fitting else " (not one fits)"
            )
        if need > have:  # the least memory that fits (a worker's need grows with it: its warm cache is a share)
            give = next(
                (
                    mb
                    for mb in MEMORY_CHOICES_MB
                    if (worker_steps(mb).needed_mb if name == "worker" else need) <= mb <= q.lambda_memory_mb
                ),
                None,
            )
            detail += f": over by {need - have:,.0f} MB" + (
                f", beyond Lambda's {q.lambda_memory_mb:,} MB: {_RELIEF[name]}"
                if give is None
                else f" (--memory {name}={give})"
            )
        add(f"memory: {name}", need, min(have, q.lambda_memory_mb), "MB", detail, hard=True)
    for name in ("worker", "reducer", "merger"):
        timeout = min(w.timeout_s[name], q.lambda_timeout_s)
        seconds = critical[name]
        add(
            f"duration: {name}",
            seconds,
            timeout,
            "s",
            f"{name} runs {seconds:,.1f} s of its {timeout} s timeout"
            + (
                ""
                if seconds <= timeout
                else f": over by {seconds - timeout:,.1f} s"
                + (
                    f", beyond Lambda's {q.lambda_timeout_s} s"
                    if seconds > q.lambda_timeout_s
                    else " (raise the deployment's functions.<name>.timeout_s)"
                )
            ),
        )
    message_limit = min(q.sns_message_bytes, MAX_MESSAGE_BYTES)
    participants, largest_bytes = largest
    add(
        "Reduce message size",
        largest_bytes,
        message_limit,
        "B",
        f"the largest Reduce message lists {listed(w.run_spec, participants)}: {largest_bytes:,} B; SNS allows"
        f" {q.sns_message_bytes:,} B, slsml's functions take {MAX_MESSAGE_BYTES:,} B"
        + (f": over by {largest_bytes - message_limit:,} B" if largest_bytes > message_limit else ""),
        hard=True,
    )
    item = n * p.participant_bytes
    add(
        "DynamoDB item size",
        item,
        q.dynamodb_item_bytes,
        "B",
        f"the participants item of {n} workers is ~{item:,.0f} B"
        + (
            f": over DynamoDB's {q.dynamodb_item_bytes:,} B by {item - q.dynamodb_item_bytes:,.0f} B"
            if item > q.dynamodb_item_bytes
            else ""
        ),
        hard=True,
    )
    rate = counter_units / max(chain_s, 1e-9)
    add(
        "DynamoDB partition writes",
        rate,
        q.dynamodb_partition_wu_s,
        "WU/s",
        f"the iteration counter item takes {counter_units} write units an iteration (W + R + 3 writes)"
        + (
            f": at {q.dynamodb_partition_wu_s:,} WU/s an iteration lasts at least {floor_s:.2f} s, "
            f"{floor_s - chain_s:.2f} s over the {chain_s:.2f} s chain"
            if floor_s > chain_s
            else ""
        ),
    )
    # each worker's update and each shard lie under a prefix of their own (slsml.spec.keys), which S3 partitions
    # apart as their rates call for it
    update_prefix = keys.update("<run>", 0, 0).rsplit("/", 1)[0].replace("000000", "<i>").replace("00000", "<w>") + "/"
    shard_prefix = keys.shard("<run>", 0, 0).rsplit("/", 1)[0].replace("000000", "<i>").replace("0000", "<r>") + "/"
    gets = {
        f"{update_prefix}: the {R} reducers' ranged reads of a worker's update": R
        / max(1.0, spreads["reduce"] + reduce_read),
        f"{shard_prefix}: the {W} workers' ranged reads of a shard, and its reducer's": (W + 1)
        / max(1.0, spreads["work"] + weights_read),
    }
    update_puts, shard_puts = writes  # the PUT-class requests that store an update, a shard (in parts: more)
    puts = {
        f"{update_prefix}: a worker's update": update_puts / max(1.0, spreads["work"]),
        f"{shard_prefix}: a reducer's shard": shard_puts / max(1.0, spreads["reduce"]),
    }
    hit = (
        f"each worker's update and each shard under a prefix of its own, {update_prefix} and {shard_prefix}, which"
        " S3 partitions apart as their rates call for it (until it does, a busy prefix's 503 SlowDown answers retry)"
    )
    for kind, rates, limit in (("GET", gets, q.s3_get_per_s), ("PUT", puts, q.s3_put_per_s)):
        busiest, value = max(rates.items(), key=lambda item: item[1])
        over = f": over by {value - limit:,.0f}/s, S3 answers 503 SlowDown and the requests retry"
        add(
            f"S3 {kind} rate",
            value,
            limit,
            f"{kind}/s",
            f"busiest {busiest}" + (f"; {hit}" if kind == "GET" else "") + (over if value > limit else ""),
        )
    if data is not None and data.burst_gets:  # the workers read their samples together, as they start
        prefix = keys.dataset_shard("<name>", "train", 0).rsplit("/", 1)[0].replace("00000", "<k>") + "/"
        value = data.busiest_gets / max(1.0, spreads["work"] + data.burst_s)
        add(
            "S3 GET rate: data",
            value,
            q.s3_get_per_s,
            "GET/s",
            f"busiest {prefix}: {data.busiest_gets:,.0f} of the {W} workers' {data.burst_gets:,.0f} GETs as they"
            f" start, spread over the training split's {data.prefixes:,} shards, each under a prefix of its own"
            + (
                f": over by {value - q.s3_get_per_s:,.0f}/s, S3 answers 503 SlowDown and the requests retry (the"
                " block order reads a block of samples in one GET; smaller shards spread them over more prefixes)"
                if value > q.s3_get_per_s
                else ""
            ),
        )
    add("zip package", p.zip_layer_mb, q.zip_mb, "MB", "numpy layer + slsml, unzipped", hard=True)
    add("container image", p.image_mb, q.image_mb, "MB", "TensorFlow image of the worker and merger", hard=True)
    return checks


_RELIEF = {
    "worker": "a smaller model (its weights, or one sample's layer outputs) or a smaller --micro-batch",
    "reducer": "more reducers",
    "merger": "a smaller model",
}
