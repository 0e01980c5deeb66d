"""The update rules' interface (``slsml.rules``): one registered rule per algorithm, rules the reducer reads without
TensorFlow, and each rule's slot traffic in the plan as large as what its worker stores."""

from __future__ import annotations

import subprocess
import sys
import typing

import keras
import pytest

from slsml import rules
from slsml.pipeline.services import Services
from slsml.spec.config import Algorithm
from slsml.training import modelio

from . import test_feedback
from .test_feedback import _run, _work

services = test_feedback.services  # the fixture: a bucket, run table and topics in moto, dataset d (6 features)


def test_every_algorithm_has_one_rule_registered_under_its_name() -> None:
    assert sorted(rules.RULES) == sorted(typing.get_args(Algorithm))
    assert all(name == rule.name for name, rule in rules.RULES.items())


def test_the_reducer_reads_the_rules_without_tensorflow() -> None:
    code = ("import sys, slsml.rules, slsml.pipeline.steps.reducer; "
            "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("options", [
    {"algorithm": "average", "local_steps": 2, "local_state": "keep", "local_optimizer": "sgd", "local_momentum": 0.9},
    {"algorithm": "average", "local_steps": 2, "local_state": "keep", "local_optimizer": "adam",
     "local_learning_rate": 0.01},
    {"algorithm": "admm", "local_steps": 2},
    {"algorithm": "average", "local_steps": 2},
    {"algorithm": "gradient"},
], ids=["average-keep-momentum", "average-keep-adam", "admm", "average-reset", "gradient"])
def test_the_plan_s_slot_traffic_is_what_the_worker_stores(services: Services, options: dict) -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    config = _run(services, modelio.save_model(model), "slot", **options)
    for iteration in range(2):
        _work(services, "slot", iteration, 0)
    stored = [services.store.get(key) for key in services.store.list_keys("runs/slot/iters/")
              if "/local/" in key]
    traffic = rules.of(config.training).slot_traffic(config.training, config.plan.size,
                                                     int(config.plan.trainable_mask().sum()))
    assert [len(body) for body in stored] == [traffic.bytes] * 2 * traffic.objects
