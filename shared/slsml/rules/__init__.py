"""Update rules: gradient averaging, model averaging and ADMM, each one ``UpdateRule`` (``slsml.rules.base``) in a
module of its own, loaded from its declaration in ``slsml.spec.algorithms`` under the name ``--algorithm`` takes."""

from __future__ import annotations

import importlib

from slsml.rules.base import UpdateRule
from slsml.spec.algorithms import ALGORITHMS
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec

RULES: dict[str, UpdateRule] = {name: importlib.import_module(rule.module).RULE for name, rule in ALGORITHMS.items()}


def of(spec: TrainingSpec) -> UpdateRule:
    """The run's update rule."""
    return RULES[spec.algorithm]


def server_optimizer(config: RunConfig) -> OptimizerConfig:
    """What the run's reducers step with the averaged update."""
    return of(config.training).server_optimizer(config.training, config.optimizer)


def slot_bytes(config: RunConfig) -> int:
    """What a worker slot of the run keeps between rounds (0: nothing)."""
    spec, plan = config.training, config.plan
    return of(spec).slot_traffic(spec, plan.size, int(plan.trainable_mask().sum())).bytes
