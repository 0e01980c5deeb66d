"""What a run's steps store for each other and read back without a message naming it by its ETag (a round's progress,
a worker slot's residual and state, a worker's evaluation state, a shard's average, what pipeline stages hand each
other): stored create-only with the storing step's proof of origin (``slsml.pipeline.proof``), and read only as the
pipeline stored it. An object at such a key that the pipeline did not store (placed there before it) is not trusted
for sitting there: a step that may delete it replaces it with its own, one that may not fails the run naming it; one
replaced after the pipeline stored it fails the run, naming it."""

from __future__ import annotations

from fnmatch import fnmatchcase

from aws_lambda_powertools import Logger

from slsml.aws.storage import Stored
from slsml.pipeline import metrics
from slsml.pipeline.services import Services
from slsml.spec import wiring
from slsml.spec.deployment import Metric
from slsml.spec.errors import NotFoundError, RunFailed, SlsmlError

logger = Logger(child=True)
_TRIES = 3  # creates of a key that something else keeps taking


def put(services: Services, run_id: str, key: str, body: bytes) -> bool:
    """Store ``body`` at ``key``, signed: False (and nothing written) where the pipeline stored an object there already
    (a duplicate's or a retry's, which stands). An object there that it did not store is replaced (logged; deleted
    only while it is that object: ``ObjectStore.delete_if``) by a step that may delete it (its wiring's ``deletes``);
    RunFailed, naming it, where the step may not. Each counted (``RefusedObjects``)."""
    store = services.store
    metadata = services.keys.sign_object(run_id, key, body)
    kind = services.keys.kind
    for _ in range(_TRIES):
        if store.create(key, body, metadata) is not None:
            return True
        try:
            found = store.read(key)
        except NotFoundError:  # deleted meanwhile, by another writer that replaces it
            continue
        if (why := problem(services, run_id, key, found)) is None:
            return False
        if kind is not None and not any(fnmatchcase(key, pattern) for pattern in wiring.function(kind).deletes):
            raise refuse(key, why)
        logger.warning("an object not written by its step was replaced", extra={"key": key})
        metrics.emit(Metric.REFUSED_OBJECTS, 1)
        store.delete_if(key, found.etag)
    raise SlsmlError(f"{key} is written by something else as soon as it is deleted")


def read(services: Services, run_id: str, key: str) -> bytes:
    """The object the pipeline stored at ``key`` (NotFoundError if there is none); RunFailed, naming it, if the object
    there is not the one it stored."""
    found = services.store.read(key)
    if (why := problem(services, run_id, key, found)) is not None:
        raise refuse(key, why)
    return found.body


def refuse(key: str, reason: str, **log: object) -> RunFailed:
    """The failure of a run whose step read, at ``key``, an object that its pipeline did not store there (``reason``,
    naming it): logged and counted (``RefusedObjects``); nothing of it is used."""
    logger.error("object refused", extra={**log, "key": key, "reason": reason})
    metrics.emit(Metric.REFUSED_OBJECTS, 1)
    return RunFailed(reason)


def problem(services: Services, run_id: str, key: str, found: Stored) -> str | None:
    """Why ``found`` (the object read at ``key``, with its metadata) is not the one run ``run_id``'s pipeline stored
    there, naming it; None if it is."""
    return services.keys.object_problem(run_id, key, found.body, found.metadata)
