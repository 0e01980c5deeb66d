"""Each function's role in the synthesized stack allows every operation the function was seen to make: the
operations its usage lines record in real runs — a run that clips by norm across three shards (the
reducers' exchange), a run whose straggler the watchdog leaves behind at its deadline, a model dropped
under incoming/, the first and the last with a budget (each function adds to the run's spend) — are each
granted by a statement of its role. (tests/infra holds the roles to no more
than that; this holds them to no less.)"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict

import pytest

from slsml.accounting import usage
from slsml.client import demo
from slsml.local.faults import Faults
from slsml.spec import keys, wiring
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.training import modelio

from .conftest import finish, timeouts, train
from .test_faults import injecting

# the IAM actions an API operation needs, where they are not the operation's own name
NEEDS = {
    "s3:HeadObject": {"s3:GetObject"},
    "s3:ListObjectsV2": {"s3:ListBucket"},
    "s3:CopyObject": {"s3:GetObject", "s3:PutObject"},
    "s3:DeleteObjects": {"s3:DeleteObject"},  # checked per key
    "sns:PublishBatch": {"sns:Publish"},
    "sqs:SendMessageBatch": {"sqs:SendMessage"},
    "sqs:DeleteMessageBatch": {"sqs:DeleteMessage"},
}
pytestmark = pytest.mark.usefixtures("warm")  # the Worker and Reducer time out after seconds here
CLIPPED = TrainingSpec(
    workers=3,
    reducers=3,
    global_batch=96,
    iterations=2,
    eval_every=0,
    budget_usd=1.0,
    optimizer=OptimizerConfig(name="adam", learning_rate=3e-3, global_clipnorm=0.1),
)
LEFT_BEHIND = TrainingSpec(
    workers=3, reducers=2, global_batch=96, iterations=2, eval_every=0, deadline_s=3.0, deadline_floor=0.5
)


def _dropped(services) -> str:
    model = modelio.save_model(demo.digits_cnn(seed=9))
    request = {
        "dataset": "digits",
        "training": {"workers": 2, "reducers": 1, "global_batch": 64, "iterations": 1, "budget_usd": 1.0},
    }
    s3 = services.store.s3
    body = json.dumps(request).encode()
    s3.put_object(Bucket=services.store.bucket, Key=keys.incoming_request("granted"), Body=body)
    s3.put_object(Bucket=services.store.bucket, Key="incoming/granted.keras", Body=model)
    run_id = f"granted-{hashlib.sha256(model + body).hexdigest()[:8]}"
    deadline = time.monotonic() + 120
    while not any(r.run_id == run_id for r in services.table.list_runs()):
        assert time.monotonic() < deadline, "the dropped model never became a run"
        time.sleep(0.2)
    return run_id


@pytest.fixture(scope="module")
def operations(local, services, digits) -> dict[str, set[str]]:
    """Function → the operations its usage lines recorded in the runs above."""
    train(services, CLIPPED, "grants-clipped")
    with timeouts(local, 3), injecting(local, Faults.parse("late_worker=2:6")):
        train(services, LEFT_BEHIND, "grants-left-behind")
        runs = ["grants-clipped", "grants-left-behind", _dropped(services)]
        for run_id in runs:
            assert finish(services, run_id, timeout_s=180).status == "COMPLETED"
    for run_id in runs:
        local.host.wait_idle(run_id, 30)
    seen: dict[str, set[str]] = defaultdict(set)
    for run_id in runs:
        for record in usage.read_local(local.log_dir, run_id):
            seen[record.function] |= set(record.requests)
    return seen


@pytest.fixture(scope="module")
def granted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Function → the actions its role's statements allow, in a synthesis of the stack."""
    from infra import create_app
    from tests.infra.test_infra_least_privilege import as_list, role_statements

    app, stack = create_app({"skip_layer_build": True}, outdir=str(tmp_path_factory.mktemp("cdk.out")))
    template = app.synth().get_stack_by_name(stack.stack_name).template
    synthesized = _Synthesized(template["Resources"])
    actions: dict[str, set[str]] = {}
    for name, function in stack.compute.functions.items():
        role = template["Resources"][stack.get_logical_id(function.node.default_child)]["Properties"]["Role"]
        actions[name] = {a for s in role_statements(synthesized, role["Fn::GetAtt"][0]) for a in as_list(s["Action"])}
    return actions


class _Synthesized:
    """What ``role_statements`` reads of a synthesis."""

    def __init__(self, resources: dict) -> None:
        self.resources = resources


def test_the_runs_exercised_the_pipeline(operations: dict[str, set[str]]) -> None:
    pipeline = {"work_launcher", "worker", "reduce_launcher", "reducer", "merger", "watchdog", "run_starter"}
    assert pipeline <= set(operations), f"no usage lines of {sorted(pipeline - set(operations))}"
    assert "dynamodb:BatchGetItem" in operations["reducer"], "the clipped run's norm exchange did not run"


@pytest.mark.parametrize("function", [f.name for f in wiring.FUNCTIONS])
def test_a_functions_role_allows_what_the_function_does(
    operations: dict[str, set[str]], granted: dict[str, set[str]], function: str
) -> None:
    missing = {
        op: sorted(NEEDS.get(op, {op}) - granted[function])
        for op in sorted(operations.get(function, set()))
        if NEEDS.get(op, {op}) - granted[function]
    }
    assert not missing, f"{function} makes calls its role does not allow: {missing}"
