"""The one wiring spec: which topic feeds which function and which bucket prefix notifies which
topic. The CDK constructs and the local runtime both read it, so they cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from slsml import keys


@dataclass(frozen=True)
class Topic:
    name: str
    env_var: str  # the variable that carries the topic's ARN to the functions that publish to it


@dataclass(frozen=True)
class Function:
    name: str  # folder under functions/ and logical id stem
    trigger: Topic
    publishes: tuple[Topic, ...]
    needs_tensorflow: bool  # container image (TensorFlow) or zip + common layer


@dataclass(frozen=True)
class BucketNotification:
    prefix: str
    suffix: str
    topic: Topic


MODEL_UPDATED = Topic("ModelUpdated", "SLSML_TOPIC_MODEL_UPDATED")
WORK = Topic("Work", "SLSML_TOPIC_WORK")
WORK_DONE = Topic("WorkDone", "SLSML_TOPIC_WORK_DONE")
REDUCE = Topic("Reduce", "SLSML_TOPIC_REDUCE")
REDUCE_DONE = Topic("ReduceDone", "SLSML_TOPIC_REDUCE_DONE")

TOPICS: tuple[Topic, ...] = (MODEL_UPDATED, WORK, WORK_DONE, REDUCE, REDUCE_DONE)

FUNCTIONS: tuple[Function, ...] = (
    Function("work_launcher", trigger=MODEL_UPDATED, publishes=(WORK,), needs_tensorflow=False),
    Function("worker", trigger=WORK, publishes=(WORK_DONE,), needs_tensorflow=True),
    Function("reduce_launcher", trigger=WORK_DONE, publishes=(REDUCE,), needs_tensorflow=False),
    Function("reducer", trigger=REDUCE, publishes=(REDUCE_DONE,), needs_tensorflow=False),
    Function("merger", trigger=REDUCE_DONE, publishes=(), needs_tensorflow=True),
)

BUCKET_NOTIFICATIONS: tuple[BucketNotification, ...] = (
    BucketNotification(prefix=keys.MODELS_PREFIX, suffix=keys.MODEL_SUFFIX, topic=MODEL_UPDATED),
)

BUCKET_ENV = "SLSML_BUCKET"
TABLE_ENV = "SLSML_TABLE"


def function(name: str) -> Function:
    for fn in FUNCTIONS:
        if fn.name == name:
            return fn
    raise KeyError(f"no pipeline function named {name!r}")
