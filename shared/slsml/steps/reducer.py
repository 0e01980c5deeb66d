"""Reducer: average one shard of the participants' updates and step the optimizer on it. Under a read
quorum below 1 (``slsml.reliability.ReadPolicy``), parts whose reads time out are left out and recorded.

The shard's next optimizer state is written first and names the workers it averaged; its next
weights are written last and mark the shard done. A try that stopped between the two is finished by
averaging exactly those workers again, so weights and state always come from the same average.
"""

from __future__ import annotations

import numpy as np
from aws_lambda_powertools import Logger

from slsml import keys, optimizers, updates, wiring
from slsml.barrier import quorum_count
from slsml.config import RunConfig
from slsml.errors import RunFailed
from slsml.messages import ReduceDone, ReduceMessage
from slsml.reliability import ReadPolicy
from slsml.runstate import IterationRecord
from slsml.services import Services
from slsml.steps.common import run_config
from slsml.storage import ObjectStore

logger = Logger(child=True)
AVERAGED_METADATA = "averaged"  # on a shard's optimizer state: the workers whose parts it averaged…
KEPT = "none"  # …or none: the shard kept its weights


def reduce(message: ReduceMessage, services: Services) -> ReduceDone:
    store = services.store
    store.reset_counters()
    run, iteration, shard = message.run_id, message.iteration, message.shard
    output = keys.weights(run, iteration + 1, shard)
    if not store.exists(output):  # else a duplicate: announce the stored shard again
        _reduce(message, services)
    done = ReduceDone(
        run_id=run, iteration=iteration, generation=message.generation, shard=shard, bytes_read=store.bytes_read,
        bytes_written=store.bytes_written,
    )
    services.bus.publish(wiring.REDUCE_DONE, [done])
    return done


def _reduce(message: ReduceMessage, services: Services) -> None:
    store = services.store
    config = run_config(store, message.run_id)
    run, iteration, shard = message.run_id, message.iteration, message.shard
    layout = config.plan.shard(shard)
    byte_range = updates.part_range(config.plan, shard)
    policy = ReadPolicy()
    participants, need = message.participants, quorum_count(len(message.participants), policy.quorum)
    stepped_before = _averaged(store, run, iteration, shard)
    if stepped_before == set():  # the watchdog kept this shard's weights: so does this late try
        _carry_weights(store, run, iteration, shard)
        return
    if stepped_before is not None:  # an earlier try stepped the optimizer, then stopped: the same average again
        participants = tuple(p for p in participants if p.worker in stepped_before)
        need = len(participants)
    parts = store.get_quorum(
        [keys.update(run, iteration, p.worker, p.attempt) for p in participants],
        [byte_range] * len(participants),
        need=need,
        timeout_s=policy.timeout_s,
    )
    included = [(p, part) for p, part in zip(participants, parts, strict=True) if part is not None]
    dropped = [p.worker for p, part in zip(participants, parts, strict=True) if part is None]
    if dropped:
        services.table.record_dropped_parts(run, iteration, shard, dropped)
        logger.warning("parts dropped after their read timeout", extra={
            "run_id": run, "iteration": iteration, "shard": shard, "workers": dropped, "timeout_s": policy.timeout_s})
    total = sum(p.samples for p, _ in included)
    if total == 0:
        raise RunFailed(f"iteration {iteration}: the participating workers processed no samples")
    mean = np.zeros(layout.size, dtype=np.float64)
    for participant, part in included:  # in message order: the same sums as long as nothing is dropped
        mean += updates.decode_part(part, config.plan, shard).astype(np.float64) * participant.samples
    mean = (mean / total).astype(np.float32)

    weights = store.get_array(keys.weights(run, iteration, shard))
    trainable = layout.trainable
    state = (
        store.get_arrays(keys.optimizer_state(run, shard, iteration))
        if iteration > 0
        else optimizers.initial_state(config.optimizer, int(trainable.sum()))
    )
    stepped, state = optimizers.apply(config.optimizer, weights[trainable], mean[trainable], state)
    new_weights = weights.copy()
    new_weights[trainable] = stepped
    new_weights[~trainable] = mean[~trainable]  # non-trainable state (e.g. BatchNorm statistics): averaged
    averaged = [p.worker for p, _ in included]
    metadata = {AVERAGED_METADATA: ",".join(map(str, averaged))}
    if not store.put_arrays_new(keys.optimizer_state(run, shard, iteration + 1), state, metadata) and (
        _averaged(store, run, iteration, shard) != set(averaged)
    ):  # the watchdog, or a concurrent try with other parts, stored the state first: follow it
        _reduce(message, services)
        return
    store.put_array_new(keys.weights(run, iteration + 1, shard), new_weights)  # last: marks the shard done


def _averaged(store: ObjectStore, run: str, iteration: int, shard: int) -> set[int] | None:
    """The workers averaged into the shard's optimizer state after ``iteration`` (empty: the shard kept its
    weights), or None if no state is stored yet."""
    metadata = store.head(keys.optimizer_state(run, shard, iteration + 1))
    if metadata is None:
        return None
    return {int(w) for w in metadata.get(AVERAGED_METADATA, KEPT).split(",") if w != KEPT}


def keep_weights(services: Services, config: RunConfig, record: IterationRecord, generation: int, shard: int) -> None:
    """No reducer of ``shard`` finished ``record``'s iteration: the shard enters the next iteration with its
    weights and optimizer state unchanged, unless a late reducer stepped the optimizer first, whose
    average then stands (and is finished here)."""
    store, run, iteration = services.store, config.run_id, record.iteration
    if store.exists(keys.weights(run, iteration + 1, shard)):
        return  # a late reducer finished after all
    if iteration > 0:
        state = store.get_arrays(keys.optimizer_state(run, shard, iteration))
    else:
        state = optimizers.initial_state(config.optimizer, int(config.plan.shard(shard).trainable.sum()))
    store.put_arrays_new(keys.optimizer_state(run, shard, iteration + 1), state, {AVERAGED_METADATA: KEPT})
    if _averaged(store, run, iteration, shard):
        late = ReduceMessage(run_id=run, iteration=iteration, generation=generation, shard=shard,
                             participants=tuple(record.participants))
        _reduce(late, services)
        return
    services.table.record_stale_shard(run, iteration, shard)
    _carry_weights(store, run, iteration, shard)


def _carry_weights(store: ObjectStore, run: str, iteration: int, shard: int) -> None:
    store.put_array_new(keys.weights(run, iteration + 1, shard), store.get_array(keys.weights(run, iteration, shard)))
