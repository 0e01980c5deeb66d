"""What several steps share: the run's immutable config, its carried state, finishing a run, sizing a GPU worker's
fleet to the running runs."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError

from slsml import rules
from slsml.aws import clients as aws
from slsml.aws import fleet as gpu_fleet
from slsml.aws.storage import ObjectStore, Stored
from slsml.pipeline import signed
from slsml.pipeline.proof import RunKeys
from slsml.pipeline.services import Services
from slsml.pipeline.services import run_config as run_config  # read by the admission of messages too
from slsml.spec import keys
from slsml.spec.config import RunConfig
from slsml.spec.errors import RunFailed
from slsml.spec.messages import Manifest
from slsml.spec.shardplan import ShardPlan
from slsml.state.records import RunRecord, RunStatus
from slsml.state.runtable import RunTable
from slsml.training import shards, stopping

logger = Logger(child=True)


def shard_etags(store: ObjectStore, config: RunConfig, iteration: int) -> list[str] | None:
    """The ETags of the R shards entering ``iteration`` (one LIST request); None if one is missing."""
    found = store.etags(keys.shards_prefix(config.run_id, iteration))
    wanted = [keys.shard(config.run_id, iteration, r) for r in range(config.reducers)]
    return [found[key] for key in wanted] if all(key in found for key in wanted) else None


def refused(key: str, why: str, **log: object) -> RunFailed:
    """The failure of a run whose step read, at ``key``, an object that is not the one its signed message or manifest
    names (``why``): logged naming it and counted (``RefusedObjects``); nothing of it is used."""
    return signed.refuse(key, f"{key} {why}: it was replaced behind the pipeline's back", **log)


def named_shard(run_keys: RunKeys, run_id: str, iteration: int, shard: int, manifest: Stored, read: Stored) -> None:
    """``refused`` unless ``read`` (an object, or bytes of it, at shard ``shard`` of ``iteration``) is the shard the
    iteration's manifest (as read, its proof of origin checked: ``manifest_of``) names by its ETag."""
    if read.etag != manifest_shards(run_keys, run_id, iteration, manifest)[shard]:
        key = keys.shard(run_id, iteration, shard)
        raise refused(key, f"is not the shard the manifest of iteration {iteration} names", run_id=run_id)


def manifest_shards(run_keys: RunKeys | None, run_id: str, iteration: int, manifest: Stored) -> list[str]:
    """The ETags of the shards entering ``iteration`` that its manifest (as read, with its metadata) names; RunFailed
    naming the manifest if it is not the one the Merger stored (its proof of origin under ``run_keys``:
    ``slsml.pipeline.proof``)."""
    return manifest_of(run_keys, run_id, iteration, manifest).shards


def manifest_of(run_keys: RunKeys | None, run_id: str, iteration: int, manifest: Stored) -> Manifest:
    """The manifest of ``iteration`` (as read, with its metadata): ``manifest_shards``'s checks."""
    key = keys.manifest(run_id, iteration)
    if run_keys is not None and (problem := run_keys.object_problem(run_id, key, manifest.body, manifest.metadata)):
        raise signed.refuse(key, problem, run_id=run_id)
    return Manifest.model_validate_json(manifest.body)


def initial_shard(config: RunConfig, shard: int, read: Stored) -> None:
    """``refused`` unless ``read`` (an object, or bytes of it, at shard ``shard`` of iteration 0) is the shard the run's
    start stored, which ``run.json`` names by its ETag (a run that names none: not checked)."""
    if config.initial_shards is not None and read.etag != config.initial_shards[shard]:
        key = keys.shard(config.run_id, 0, shard)
        raise refused(key, "is not the shard entering iteration 0 that run.json names", run_id=config.run_id)


def load_weights(
    store: ObjectStore,
    config: RunConfig,
    iteration: int,
    run_keys: RunKeys | None = None,
    spans: Sequence[tuple[int, int]] | None = None,
) -> np.ndarray:
    """The flat weights entering ``iteration`` (``spans``: only the elements of these [start, stop) ranges of the flat
    vector, in order, one after the other: a pipeline stage's own), each shard read by range (concurrently, with the
    iteration's manifest, whose proof of origin must hold under ``run_keys``: ``manifest_shards``; None: a reader
    that trusts the bucket, not a step). A shard is taken only if it is the object the manifest names (its ETag; of
    iteration 0: ``initial_shard``): one not stored by the reducer the Merger counted is not trusted for sitting at
    the shard's key (RunFailed)."""
    run, plan = config.run_id, config.plan
    pieces = [  # (shard, first and last element of the flat vector read from it)
        (shard, max(lo, plan.bounds[shard]), min(hi, plan.bounds[shard + 1]))
        for lo, hi in (spans if spans is not None else [(0, plan.size)])
        for shard in range(plan.reducers)
        if max(lo, plan.bounds[shard]) < min(hi, plan.bounds[shard + 1])
    ]
    where = [keys.shard(run, iteration, shard) for shard, _, _ in pieces]
    with ThreadPoolExecutor(max_workers=1) as pool:
        manifest = pool.submit(store.read, keys.manifest(run, iteration)) if iteration else None
        reads = store.get_quorum(where, [_piece_range(plan, *piece) for piece in pieces], len(where), 0)
        named = None if manifest is None else manifest_shards(run_keys, run, iteration, manifest.result())
    weights = np.empty(sum(b - a for _, a, b in pieces), dtype=np.float32)
    at = 0
    for (shard, first, stop), key, read in zip(pieces, where, reads, strict=True):
        assert read is not None  # every read is needed: none is left out
        if named is None:
            initial_shard(config, shard, read)
        elif read.etag != named[shard]:
            raise refused(key, f"is not the shard the manifest of iteration {iteration} names", run_id=run)
        layout = plan.shard(shard)
        if (first, stop) == (layout.start, layout.stop):  # the whole shard's: its header checked too
            weights[at : at + stop - first] = shards.decode_weights(read.body, plan, shard)
        elif len(read.body) == 4 * (stop - first):
            weights[at : at + stop - first] = np.frombuffer(read.body, dtype="<f4")
        else:
            raise shards.ShardFormatError(f"{key}: {len(read.body)} bytes read of the {4 * (stop - first)} asked")
        at += stop - first
    return weights


def _piece_range(plan: ShardPlan, shard: int, first: int, stop: int) -> tuple[int, int]:
    """The bytes (inclusive) of elements ``first`` to ``stop`` of the flat vector in shard ``shard``'s object: the
    whole shard's weights with its header, or those elements alone."""
    start = plan.bounds[shard]
    if (first, stop) == (start, plan.bounds[shard + 1]):
        return shards.weights_range(plan, shard)
    return shards.HEADER_SIZE + 4 * (first - start), shards.HEADER_SIZE + 4 * (stop - start) - 1


# what a resume may change in the run item's training (``client.runs.resume_run``): run.json keeps the spec it
# started with
RESUMABLE = {"budget_usd"}


def changed_behind(run: RunRecord, config: RunConfig) -> str | None:
    """Why the run cannot go on if its item's training spec is not the one its ``run.json`` holds (one edited behind
    the pipeline's back: the steps read both), naming what changed; None if they agree."""
    recorded = run.training.model_dump(exclude=RESUMABLE)
    stored = config.training.model_dump(exclude=RESUMABLE)
    changed = [name for name in stored if recorded.get(name) != stored[name]]
    if not changed:
        return None
    said = "; ".join(f"training.{name} is {recorded.get(name)!r}, run.json says {stored[name]!r}" for name in changed)
    return f"the run item was changed behind the pipeline's back: {said}"


def carried_state(config: RunConfig, iteration: int) -> list[str]:
    """The keys of the carried state entering ``iteration`` (``keys.carried``): the slots of every worker the run
    may have (``run scale`` and ``--workers auto`` move within its bounds), where its rule and compression keep
    slot states and residuals."""
    spec, plan = config.training, config.plan
    slot_state = rules.of(spec).slot_traffic(spec, plan.size, int(plan.trainable_mask().sum())).bytes > 0
    return keys.carried(
        config.run_id, iteration, config.reducers, spec.worker_bounds[1], slot_state, spec.compression.lossy
    )


def complete_run(services: Services, run_id: str, iteration: int, reason: str | None = None) -> None:
    """The iteration budget is spent (or ``reason``: early stopping ends the run) and the model entering
    ``iteration`` evaluated: store it (with ``keep_best``: the best evaluated model) as the run's final model with
    its test figures, and end the run's execution."""
    final_key = keys.final_model(run_id)
    config = run_config(services, run_id)
    kept = services.table.get_counter(run_id, iteration - 1)
    if config.training.keep_best is not None:
        series = services.table.watched(run_id, config.training.keep_best)
        if series:
            best = series[stopping.best_at([value for _, value in series], _mode(config, config.training.keep_best))]
            kept = services.table.get_counter(run_id, best[0])
    # a server-side copy, which a create-only bucket policy cannot cover: what is found at the key is checked, what is
    # copied must be the model the Merger stored (the SHA-256 its manifest names, against S3's checksum of the copy),
    # and the run records the copy's ETag and SHA-256, by which readers of the final model know it was not replaced
    source, entering = keys.model(run_id, kept.iteration + 1), kept.iteration + 1
    manifest = manifest_of(services.keys, run_id, entering, services.store.read(keys.manifest(run_id, entering)))
    etag = services.store.copy_own(source, final_key, manifest.model_sha256)
    if etag is None:
        raise RunFailed(
            f"{source} is not the model the Merger stored: it was replaced behind the pipeline's back (its SHA-256 is"
            f" not the one the manifest of iteration {entering} names)"
        )
    run = services.table.record_outcome(
        run_id, final_key, kept.test, kept.val, reason, etag, final_sha256=manifest.model_sha256
    )
    if run is not None:
        services.orchestrator.succeed(run.task_token, outcome(run))
        # nothing resumes a completed run: its last sets of carried state go (the Merger deleted the others)
        behind = max(0, iteration - 1 - config.training.stale_weights)
        services.store.delete([key for i in range(behind, iteration + 1) for key in carried_state(config, i)])
        size_fleet(services, run, quiet=True)  # its workers are done (else the watchdog's chain ends it)
    logger.info(
        "run completed",
        extra={
            "run_id": run_id,
            "iterations": iteration,
            "final": final_key,
            "final_iteration": kept.iteration + 1,
            "reason": reason,
        },
    )


def stop_reason(config: RunConfig, table: RunTable) -> str | None:
    """Why early stopping ends the run after its latest evaluation (Keras's EarlyStopping over the monitored
    figure's evaluations so far, ``RunTable.watched``); None: it goes on (and nothing is read where the run does
    not stop early)."""
    if config.training.stopping is None:
        return None
    monitor, patience, min_delta = config.training.stopping
    series = table.watched(config.run_id, monitor)
    values, mode = [value for _, value in series], _mode(config, monitor)
    if stopping.stopped_at(values, mode, patience, min_delta) is None:
        return None
    best = stopping.best_at(values, mode)
    return (
        f"early stopping: {monitor} did not improve by more than {min_delta:g} for {patience} evaluation"
        f"{'' if patience == 1 else 's'} after its best, {values[best]:.6g} (the model entering iteration"
        f" {series[best][0] + 1})"
    )


def _mode(config: RunConfig, monitor: str) -> stopping.Mode:
    return config.modes[monitor.split("_", 1)[1]]


def outcome(run: RunRecord) -> dict[str, Any]:
    """What a run's execution ends with."""
    return {
        "final_key": run.final_key,
        "iterations": run.iteration,
        "test_accuracy": run.test_accuracy,
        "test_loss": run.test_loss,
        "test": run.test,
        "val": run.val,
    }


# what Lambda answers a scaling call that comes while the function or its scaling is being changed, or too many
FLEET_BUSY = ("ResourceConflictException", "TooManyRequestsException")


def running(run: RunRecord) -> bool:
    """Whether ``run`` may still launch workers: RUNNING, and its final model not stored (a completed run stays
    RUNNING until its execution marks it COMPLETED)."""
    return run.status == RunStatus.RUNNING and run.final_key is None


def size_fleet(services: Services, run: RunRecord | None = None, quiet: bool = False) -> bool:
    """Size a GPU worker's fleet (``slsml.aws.fleet``) to what the running runs ask, each the most workers it may
    have (``TrainingSpec.asked_workers``: its max_workers, else its workers); ``run``: a record fresher than the runs
    index's, which is read eventually consistently. True once the fleet is there, and always for a CPU worker (none
    to size). ``quiet``: Lambda being busy with the function answers False instead of raising (a caller that looks
    again later)."""
    fleet = gpu_fleet.from_env()
    if fleet is None:
        return True
    runs = {r.run_id: r for r in services.table.list_runs()}
    if run is not None:
        runs[run.run_id] = run
    try:
        return fleet.size(fleet.wanted(r.training.asked_workers(r.workers) for r in runs.values() if running(r)))
    except ClientError as error:
        if not quiet or aws.error_code(error) not in FLEET_BUSY:
            raise
        logger.warning("GPU fleet busy: sized later", extra={"function": fleet.function, "error": str(error)})
        return False
