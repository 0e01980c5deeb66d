"""The one wiring spec: which topic feeds which function and which bucket prefix notifies which
topic. The CDK constructs and the local runtime both read it, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase

from slsml.spec import keys


class TaskAnswer(StrEnum):
    """What a step may tell the run's execution (Step Functions' task-token calls)."""

    SUCCESS = "SendTaskSuccess"  # the run completed
    FAILURE = "SendTaskFailure"  # the run failed or was stopped
    HEARTBEAT = "SendTaskHeartbeat"  # the run goes on


@dataclass(frozen=True)
class Topic:
    name: str
    env_var: str  # the variable that carries the topic's ARN to the functions that publish to it
    carries: str = ""  # the pipeline message its publishers send on it (a slsml.spec.messages type's name), if any


@dataclass(frozen=True)
class Queue:
    """A queue a function is triggered by directly (messages sent with a delay), not through a topic."""

    name: str
    env_var: str  # the variable that carries the queue's URL to the functions that send to it
    carries: str = ""  # the pipeline message its senders send on it (a slsml.spec.messages type's name)


@dataclass(frozen=True)
class Function:
    name: str  # folder under functions/ and logical id stem
    triggers: tuple[Topic, ...]
    publishes: tuple[Topic, ...]
    needs_tensorflow: bool  # container image (TensorFlow) or zip + common layer
    starts_runs: bool = False  # may start executions of the run state machine
    queue: Queue | None = None  # the queue that triggers it, if any (besides its topics)
    sends: tuple[Queue, ...] = ()  # queues it sends (delayed) messages to
    # triggered by every dead-letter queue: fails the run a dead letter names, and may do nothing else
    reads_dead_letters: bool = False
    writes: tuple[str, ...] = ()  # the objects it creates (keys.*_OBJECTS patterns); nothing else in the bucket
    # the objects it deletes: carried state once superseded, or an object not written by its step where it creates
    # its own (ObjectStore.put_own)
    deletes: tuple[str, ...] = ()
    # what it may tell a run's execution; a step that may not answer leaves it to the watchdog (Services.fail_run)
    answers: tuple[TaskAnswer, ...] = ()
    # handles some of its messages once (the ``idempotent`` of its handler, slsml.state.idempotency): it deletes a
    # message's record, in its own partition of the table, when its step fails on it; no other step deletes items
    once_per_message: bool = False
    # launches runs' iterations: makes, as a run is launched, the signing keys of every kind that signs
    # (slsml.pipeline.proof), sealed so that it reads none but its own
    makes_run_keys: bool = False


@dataclass(frozen=True)
class BucketNotification:
    prefix: str
    suffix: str
    topic: Topic


# the Merger's ModelMerged, and S3's events of models placed under models/ (not signed: S3 sends them)
MODEL_UPDATED = Topic("ModelUpdated", "SLSML_TOPIC_MODEL_UPDATED", "ModelMerged")
WORK = Topic("Work", "SLSML_TOPIC_WORK", "WorkMessage")
WORK_DONE = Topic("WorkDone", "SLSML_TOPIC_WORK_DONE", "WorkDone")
REDUCE = Topic("Reduce", "SLSML_TOPIC_REDUCE", "ReduceMessage")
REDUCE_DONE = Topic("ReduceDone", "SLSML_TOPIC_REDUCE_DONE", "ReduceDone")
# the run state machine → WorkLauncher: a run was registered; here is the task token to report to
RUN_CONTROL = Topic("RunControl", "SLSML_TOPIC_RUN_CONTROL")
# S3 → RunStarter: a model was dropped under incoming/
MODEL_DROPPED = Topic("ModelDropped", "SLSML_TOPIC_MODEL_DROPPED")
# the run state machine → people and tools: a run COMPLETED or FAILED
RUN_EVENTS = Topic("RunEvents", "SLSML_TOPIC_RUN_EVENTS")

# WorkLauncher/Watchdog → Watchdog: an iteration's deadline, delivered when it is due
DEADLINES = Queue("Deadlines", "SLSML_QUEUE_DEADLINES", "Deadline")

TOPICS: tuple[Topic, ...] = (
    MODEL_UPDATED,
    WORK,
    WORK_DONE,
    REDUCE,
    REDUCE_DONE,
    RUN_CONTROL,
    MODEL_DROPPED,
    RUN_EVENTS,
)

_ALL_ANSWERS = tuple(TaskAnswer)
SCRATCH, MODELS, FINAL = keys.SCRATCH_OBJECTS, keys.MODEL_OBJECTS, keys.FINAL_MODEL_OBJECTS

FUNCTIONS: tuple[Function, ...] = (
    Function(
        "work_launcher",
        triggers=(MODEL_UPDATED, RUN_CONTROL),
        publishes=(WORK,),
        needs_tensorflow=False,
        sends=(DEADLINES,),
        writes=(FINAL,),
        deletes=(FINAL, SCRATCH),
        answers=_ALL_ANSWERS,
        makes_run_keys=True,
    ),
    # runs the user's model: it writes scratch alone, and tells no execution anything (the watchdog completes a
    # run its final evaluation finished, and ends the execution of a run it failed); publishes Work too: a round
    # whose invocation's time runs short goes on in a fresh one (slsml.training.progress)
    Function(
        "worker",
        triggers=(WORK,),
        publishes=(WORK_DONE, WORK),
        needs_tensorflow=True,
        sends=(DEADLINES,),
        writes=(SCRATCH,),
        deletes=(SCRATCH,),
        once_per_message=True,
    ),
    # publishes Work too: under stale weights, a round's reduce as it fires launches the next round's workers
    Function(
        "reduce_launcher",
        triggers=(WORK_DONE,),
        publishes=(REDUCE, WORK),
        needs_tensorflow=False,
        answers=(TaskAnswer.FAILURE,),
    ),
    # publishes Reduce too: in runs that clip by norm, the reducer that completes the norm exchange
    # releases the other shards' steps; and Work: the round whose update it refused, re-launched once; deletes
    # what was placed where it stores a shard's average (slsml.pipeline.signed)
    Function(
        "reducer",
        triggers=(REDUCE,),
        publishes=(REDUCE_DONE, REDUCE, WORK),
        needs_tensorflow=False,
        writes=(SCRATCH,),
        deletes=(SCRATCH,),
        answers=(TaskAnswer.FAILURE,),
    ),
    # publishes Reduce too: the reduce of the version it merged that an update waits for (ASP), or that was held
    # for the model it merged (stale weights), and Work: the round after, launched ahead as that reduce fires
    Function(
        "merger",
        triggers=(REDUCE_DONE,),
        publishes=(MODEL_UPDATED, REDUCE, WORK),
        needs_tensorflow=True,
        writes=(SCRATCH, MODELS),
        deletes=(SCRATCH, MODELS),
        answers=(TaskAnswer.FAILURE, TaskAnswer.HEARTBEAT),
    ),
    # beside the loop: at each deadline, fire a late barrier, re-launch what is missing, or fail the run
    Function(
        "watchdog",
        triggers=(),
        publishes=(WORK, REDUCE, REDUCE_DONE),
        needs_tensorflow=False,
        queue=DEADLINES,
        sends=(DEADLINES,),
        writes=(SCRATCH, FINAL),
        deletes=(SCRATCH, FINAL),
        answers=(TaskAnswer.SUCCESS, TaskAnswer.FAILURE),
        once_per_message=True,
    ),
    # outside the loop: a plain upload to incoming/ starts a run with the deployment's defaults
    Function(
        "run_starter",
        triggers=(MODEL_DROPPED,),
        publishes=(),
        needs_tensorflow=True,
        starts_runs=True,
        writes=(keys.RUN_CONFIG_OBJECTS, keys.SOURCE_MODEL_OBJECTS, SCRATCH),
        once_per_message=True,
    ),
    # beside everything: a message a function failed on three times (or SNS could not deliver) fails its run
    Function(
        "dead_letters",
        triggers=(),
        publishes=(),
        needs_tensorflow=False,
        reads_dead_letters=True,
        answers=(TaskAnswer.FAILURE,),
    ),
)

BUCKET_NOTIFICATIONS: tuple[BucketNotification, ...] = (
    BucketNotification(prefix=keys.MODELS_PREFIX, suffix=keys.MODEL_SUFFIX, topic=MODEL_UPDATED),
    BucketNotification(prefix=keys.INCOMING_PREFIX, suffix=keys.MODEL_SUFFIX, topic=MODEL_DROPPED),
)

QUEUES: tuple[Queue, ...] = (DEADLINES,)

BUCKET_ENV = "SLSML_BUCKET"
TABLE_ENV = "SLSML_TABLE"
STATE_MACHINE_ENV = "SLSML_STATE_MACHINE"
SIGNING_KEY_ENV = "SLSML_SIGNING_KEY"  # the KMS key that seals runs' signing keys (slsml.pipeline.proof)
RUN_DEFAULTS_ENV = "SLSML_RUN_DEFAULTS"  # JSON of a DropInRequest: what an incoming/ model trains with
RUN_LIMITS_ENV = "SLSML_RUN_LIMITS"  # JSON of the deployment's RunLimits (slsml.spec.deployment), for every function
# JSON of the dead-letter reader's sources (``dead_letter_sources``)
DEAD_LETTER_SOURCES_ENV = "SLSML_DEAD_LETTER_SOURCES"
MEMORY_ENV = "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"  # set by Lambda (and by the local host)
STORAGE_ENV = "SLSML_EPHEMERAL_STORAGE_MB"  # the function's ephemeral storage: Lambda does not say it


def notified_prefixes(fn: Function) -> tuple[str, ...]:
    """The bucket prefixes whose new objects reach ``fn`` (it reads what it is told about)."""
    return tuple(n.prefix for n in BUCKET_NOTIFICATIONS if n.topic in fn.triggers)


def dead_letter_sources(queues: list[tuple[str, str]], topic_arns: dict[str, str]) -> dict[str, list[list[str]]]:
    """Whose messages the dead letters are, for the function that reads them, as [ARN, function] pairs (a
    deployment's ARNs are tokens, which JSON keys cannot be): ``queues``, (dead-letter queue ARN, the
    function whose messages it holds) — a queue that holds several functions', as Lambda's
    asynchronous-invocation one, is left out: its messages are SNS events, which name their topic — and
    ``topics``, each topic that triggers a function (``topic_arns``: ARN by topic name) and that function."""
    return {
        "queues": [[arn, function] for arn, function in queues],
        "topics": [[topic_arns[topic.name], fn.name] for fn in FUNCTIONS for topic in fn.triggers],
    }


def _carried(fn: Function) -> tuple[str, ...]:
    """The pipeline messages ``fn`` sends (of the topics it publishes to and the queues it sends to)."""
    return tuple(topic.carries for topic in fn.publishes) + tuple(queue.carries for queue in fn.sends)


def senders(message_type: str) -> tuple[str, ...]:
    """The functions that send pipeline messages of type ``message_type`` (its name): those that publish or send to a
    topic or queue that carries it."""
    return tuple(fn.name for fn in FUNCTIONS if message_type in _carried(fn))


def writers(object_key: str) -> tuple[str, ...]:
    """The functions that may create the object at ``object_key`` (their ``writes``)."""
    return tuple(fn.name for fn in FUNCTIONS if any(fnmatchcase(object_key, pattern) for pattern in fn.writes))


# the kinds that sign what they send (one signing key each per run, slsml.pipeline.proof): the functions that publish
# or send pipeline messages
SIGNERS: tuple[str, ...] = tuple(fn.name for fn in FUNCTIONS if any(_carried(fn)))


def dead_letter_reader() -> Function:
    return next(fn for fn in FUNCTIONS if fn.reads_dead_letters)


def function(name: str) -> Function:
    for fn in FUNCTIONS:
        if fn.name == name:
            return fn
    raise KeyError(f"no pipeline function named {name!r}")
