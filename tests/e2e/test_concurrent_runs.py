"""Two runs at once on the same bucket, table and topics: each ends bit-identical to the same run
trained alone, and neither's objects or records mention the other."""

from __future__ import annotations

import numpy as np
from boto3.dynamodb.conditions import Key

from slsml.spec import keys
from slsml.spec.config import OptimizerConfig, TrainingSpec

from .conftest import final_weights, finish, train

SPECS = {
    "a": TrainingSpec(
        workers=2,
        reducers=2,
        global_batch=64,
        iterations=4,
        eval_every=0,
        seed=1,
        optimizer=OptimizerConfig(name="adam", learning_rate=3e-3),
    ),
    "b": TrainingSpec(
        workers=3,
        reducers=1,
        global_batch=96,
        iterations=4,
        eval_every=0,
        seed=2,
        optimizer=OptimizerConfig(name="sgd", learning_rate=0.05, momentum=0.9),
    ),
}


def run_mentions(services, run_id: str) -> bytes:
    """Everything stored about a run: its objects (keys and contents) and its table items."""
    store = services.store
    objects = [key.encode() + store.get(key) for key in store.list_keys(keys.run_prefix(run_id))]
    items = services.table.table.query(KeyConditionExpression=Key("pk").eq(f"RUN#{run_id}"), ConsistentRead=True)
    return b"\n".join(objects) + repr(items["Items"]).encode()


def test_two_runs_at_once_end_as_if_each_ran_alone(services, digits):
    alone = {}
    for name, spec in SPECS.items():
        train(services, spec, f"alone-{name}")
        assert finish(services, f"alone-{name}").status == "COMPLETED"
        alone[name] = final_weights(services, f"alone-{name}")[0]

    for name, spec in SPECS.items():
        train(services, spec, f"together-{name}")
    runs = {name: finish(services, f"together-{name}") for name in SPECS}
    for name, run in runs.items():
        assert run.status == "COMPLETED", (name, run.reason)
        assert run.iteration == SPECS[name].iterations
        assert np.array_equal(final_weights(services, f"together-{name}")[0], alone[name]), name
    a, b = runs["a"], runs["b"]
    assert max(a.created_at, b.created_at) < min(a.updated_at, b.updated_at), "the runs did not overlap"

    stored = {name: run_mentions(services, f"together-{name}") for name in SPECS}
    for name, other in (("a", "b"), ("b", "a")):
        assert keys.final_model(f"together-{name}").encode() in stored[name] and b"ITER#000003" in stored[name]
        assert f"together-{other}".encode() not in stored[name], f"run {name} mentions run {other}"
