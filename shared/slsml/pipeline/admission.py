"""Every pipeline message is checked against the run it names before a step acts on it: a message that
does not belong to that run (a forged one, or one of a run's past that no step could act on) is rejected,
like a malformed one (``envelope.parse_message``): logged, counted, dead-lettered, and no run fails by it.

What is checked: the run exists; the message's generation and iteration are not ahead of the run's (its
iteration was launched, its reduce fired), nor past its iteration budget; a worker, shard or attempt lies
within the iteration's workers, the run's reducers and its deadline retries; a continuation of a round names
progress that round stored (``slsml.training.progress``); a work report names an update
that is stored and says the sample count that update says it holds (which a round's batches bound); a
reduce names the participants its iteration's reduce was fired with; a reduce report's shard is stored; a
deadline is due within two deadline periods; a run's task token is one that its execution waits on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from slsml import rules
from slsml.pipeline.services import Services, run_config
from slsml.spec import keys
from slsml.spec.config import RunConfig
from slsml.spec.errors import NotFoundError, RunFailed
from slsml.spec.messages import Deadline, Message, ReduceDone, ReduceMessage, RunStarted, WorkDone, WorkMessage
from slsml.state.records import Counter


def problem(message: Any, services: Services) -> str | None:
    """Why ``message`` does not belong to the run it names, or None. The run's config is read from the warm
    cache; each check reads one item or object's metadata at most (``slsml.cost.chain``'s admission requests)."""
    if isinstance(message, RunStarted):
        return (
            None
            if services.orchestrator.waiting(message.task_token)
            else (f"no execution of run {message.run_id!r} waits on its task token (a late or forged start)")
        )
    if not isinstance(message, Message):
        return None  # an S3 event: its step checks the key it names
    try:
        config = run_config(services.store, message.run_id)
    except RunFailed:
        return f"no run named {message.run_id!r}"
    iterations = config.training.iterations
    # a deadline may end the run, and the workers of the round past the budget evaluate its final model
    if message.iteration > (iterations if isinstance(message, Deadline | WorkMessage) else iterations - 1):
        return f"iteration {message.iteration} is past the run's {iterations}"
    return _CHECKS[type(message)](message, config, services)


def _ahead(generation: int, current: int) -> str | None:
    return f"generation {generation} is ahead of the run's ({current})" if generation > current else None


def _attempt(attempt: int, config: RunConfig) -> str | None:
    retries = config.training.deadline_retries
    return f"attempt {attempt} is past the run's {retries} deadline retries" if attempt > retries else None


def _launched(message: WorkMessage | WorkDone, services: Services) -> tuple[Counter | None, str | None]:
    """The iteration's counter, or why the message cannot be of it: the iteration was not launched (it is
    ahead of the run), or not in the message's generation, or not with the message's worker."""
    counter = services.table.get_counter(message.run_id, message.iteration)
    if counter.workers is None:
        return None, f"iteration {message.iteration} was not launched"
    if ahead := _ahead(message.generation, counter.generation):
        return None, ahead
    if counter.generation == message.generation and message.worker >= counter.workers:
        return None, f"worker {message.worker} of an iteration launched with {counter.workers} workers"
    return counter, None


def _work(message: WorkMessage, config: RunConfig, services: Services) -> str | None:
    if message.worker >= message.workers:
        return f"worker {message.worker} of an iteration of {message.workers} workers"
    counter, problem_ = _launched(message, services)
    if counter is not None and counter.generation == message.generation and counter.workers != message.workers:
        return f"{message.workers} workers, but iteration {message.iteration} was launched with {counter.workers}"
    return problem_ or _attempt(message.attempt, config) or _resume(message, config, services)


def _resume(message: WorkMessage, config: RunConfig, services: Services) -> str | None:
    """A continuation names progress its round stored, within the round's micro-batches (one sample each at least)."""
    if not message.resume:
        return None
    spec = config.training
    samples = spec.global_batch * rules.of(spec).compute_steps(spec)
    if message.resume >= samples:
        return f"a continuation after {message.resume} micro-batches of a round of at most {samples} samples"
    key = keys.progress(message.run_id, message.iteration, message.worker, message.attempt, message.resume)
    return None if services.store.exists(key) else f"no progress is stored at {key}"


def _work_done(message: WorkDone, config: RunConfig, services: Services) -> str | None:
    spec = config.training
    most = spec.global_batch * spec.local_batches
    if message.samples > most:
        return f"{message.samples} samples, more than a worker's {most} of a round"
    key = keys.update(message.run_id, message.iteration, message.worker, message.attempt)
    metadata = services.store.head(key)  # written with the update, in its one create-only PUT
    if metadata is None:
        return f"no update is stored at {key}"
    try:
        stored = WorkDone.model_validate_json(metadata.get("done") or "").samples
    except ValidationError:
        return f"the update at {key} does not say what it holds"
    if stored != message.samples:
        return f"{message.samples} samples, but the update at {key} holds {stored}"
    return _attempt(message.attempt, config)


def _shard(shard: int, config: RunConfig) -> str | None:
    return f"shard {shard} of a run of {config.reducers} reducers" if shard >= config.reducers else None


def _reduce(message: ReduceMessage, config: RunConfig, services: Services) -> str | None:
    if wrong := _shard(message.shard, config):
        return wrong
    fired = services.table.frozen_participants(message.run_id, message.iteration)
    if fired is None:
        return f"the reduce of iteration {message.iteration} was not fired"
    generation, participants = fired
    if ahead := _ahead(message.generation, generation):
        return ahead
    if generation == message.generation and set(message.participants) != set(participants):
        return f"participants other than those the reduce of iteration {message.iteration} was fired with"
    return _attempt(message.attempt, config)


def _reduce_done(message: ReduceDone, config: RunConfig, services: Services) -> str | None:
    if wrong := _shard(message.shard, config):
        return wrong
    key = keys.shard(message.run_id, message.iteration + 1, message.shard)
    return None if services.store.exists(key) else f"no shard is stored at {key}"


def _deadline(message: Deadline, config: RunConfig, services: Services) -> str | None:
    spec = config.training
    if message.due_at > time.time() + 2 * spec.deadline_s:
        return f"due at {message.due_at:.0f}, more than two deadline periods ({spec.deadline_s:g} s) from now"
    try:
        run = services.table.get_run(message.run_id)
    except NotFoundError:
        return f"no run named {message.run_id!r}"
    if message.iteration > run.iteration:
        return f"iteration {message.iteration} is ahead of the run (at {run.iteration})"
    return _ahead(message.generation, run.generation) or _attempt(message.round, config)


_CHECKS: dict[type, Callable[[Any, RunConfig, Services], str | None]] = {
    WorkMessage: _work,
    WorkDone: _work_done,
    ReduceMessage: _reduce,
    ReduceDone: _reduce_done,
    Deadline: _deadline,
}
