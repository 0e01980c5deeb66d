"""Every pipeline message whose proof of origin holds (``slsml.pipeline.proof``: a message the pipeline sent for the
run it names) is also checked against that run's configuration before a step acts on it, with no request: a
message that does not fit it (one of a run's past no step could act on, or one a faulty step made) is rejected,
like a malformed one (``envelope.parse_message``): logged, counted, dead-lettered, and no run fails by it.

What is checked, against the run's ``run.json`` (kept warm): the run exists; the message's iteration is not past its
iteration budget; a worker, shard or attempt lies within the iteration's workers, the run's reducers and its
deadline retries; a continuation lies within its round's micro-batches; a work report's sample count within a
round's batches; a deadline is due within two deadline periods; a run's task token is one that its execution waits
on. What a step decides comes from the run's records and stored objects, never from what a message says of itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from slsml import rules
from slsml.pipeline.services import Services, run_config
from slsml.spec.config import RunConfig
from slsml.spec.errors import ConfigReplaced, RunFailed
from slsml.spec.messages import (
    Deadline,
    Message,
    ModelMerged,
    ReduceDone,
    ReduceMessage,
    RunStarted,
    WorkDone,
    WorkMessage,
)


def problem(message: Any, services: Services) -> str | None:
    """Why ``message`` does not belong to the run it names, or None. The run's config is read from the warm
    cache; no check makes a request."""
    if isinstance(message, RunStarted):
        return (
            None
            if services.orchestrator.waiting(message.task_token)
            else (f"no execution of run {message.run_id!r} waits on its task token (a late or forged start)")
        )
    if not isinstance(message, Message):
        return None  # an S3 event: its step checks the key it names
    try:
        config = run_config(services, message.run_id)
    except ConfigReplaced:  # no fault of the message's: its run fails (``envelope.admit``)
        raise
    except RunFailed as error:  # none, or not slsml's
        return str(error)
    iterations = config.training.iterations
    # a deadline may end the run, and the workers of the round past the budget evaluate its final model, which its
    # manifest launches
    if message.iteration > (
        iterations if isinstance(message, Deadline | WorkMessage | ModelMerged) else iterations - 1
    ):
        return f"iteration {message.iteration} is past the run's {iterations}"
    return _CHECKS[type(message)](message, config, services)


def _attempt(attempt: int, config: RunConfig) -> str | None:
    retries = config.training.deadline_retries
    return f"attempt {attempt} is past the run's {retries} deadline retries" if attempt > retries else None


def _worker_attempt(attempt: int, config: RunConfig) -> str | None:
    """A worker's attempt lies within the run's deadline retries and the one re-launch of a round whose update a
    reducer refused (``steps.reducer``)."""
    retries = config.training.deadline_retries
    if attempt > retries + 1:
        return f"attempt {attempt} is past the run's {retries} deadline retries and a refused update's re-launch"
    return None


def _work(message: WorkMessage, config: RunConfig, services: Services) -> str | None:
    if message.worker >= message.workers:
        return f"worker {message.worker} of an iteration of {message.workers} workers"
    low, high = config.training.worker_bounds
    if not low <= message.workers <= high:
        return f"{message.workers} workers, outside the run's bounds {low}..{high}"
    return _worker_attempt(message.attempt, config) or _resume(message, config)


def _resume(message: WorkMessage, config: RunConfig) -> str | None:
    """A continuation lies within the round's micro-batches (one sample each at least); a stage's, within its forward
    and backward passes of them, or at their end (the first stage's, which then takes the others' parts)."""
    spec = config.training
    samples = spec.global_batch * rules.of(spec).compute_steps(spec)
    if config.stage_blocks is not None and message.resume > 2 * samples:
        return f"a stage's continuation after {message.resume} passes of a round of at most {samples} samples"
    if config.stage_blocks is None and message.resume >= samples:
        return f"a continuation after {message.resume} micro-batches of a round of at most {samples} samples"
    if config.stage_blocks is None and message.waited:
        return f"a continuation that waited ({message.waited}) of a round in one stage: only a stage waits"
    return None


def _work_done(message: WorkDone, config: RunConfig, services: Services) -> str | None:
    spec = config.training
    most = spec.global_batch * spec.local_batches
    if message.samples > most:
        return f"{message.samples} samples, more than a worker's {most} of a round"
    return _worker_attempt(message.attempt, config)


def _shard(shard: int, config: RunConfig) -> str | None:
    return f"shard {shard} of a run of {config.reducers} reducers" if shard >= config.reducers else None


def _reduce(message: ReduceMessage, config: RunConfig, services: Services) -> str | None:
    _, high = config.training.worker_bounds
    if wrong := _shard(message.shard, config):
        return wrong
    if outside := [p.worker for p in message.participants if p.worker >= high]:
        return f"participants {outside} beyond the run's {high} workers at most"
    return _attempt(message.attempt, config)


def _reduce_done(message: ReduceDone, config: RunConfig, services: Services) -> str | None:
    return _shard(message.shard, config)


def _deadline(message: Deadline, config: RunConfig, services: Services) -> str | None:
    spec = config.training
    if message.due_at > time.time() + 2 * spec.deadline_s:
        return f"due at {message.due_at:.0f}, more than two deadline periods ({spec.deadline_s:g} s) from now"
    return _attempt(message.round, config)


_CHECKS: dict[type, Callable[[Any, RunConfig, Services], str | None]] = {
    WorkMessage: _work,
    WorkDone: _work_done,
    ReduceMessage: _reduce,
    ReduceDone: _reduce_done,
    Deadline: _deadline,
    ModelMerged: lambda message, config, services: None,  # its step launches only the run's current iteration
}
