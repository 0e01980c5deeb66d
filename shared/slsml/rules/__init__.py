"""Update rules: gradient averaging, model averaging and ADMM, each one ``UpdateRule`` (``slsml.rules.base``)
registered here under the name ``--algorithm`` takes."""

from __future__ import annotations

from slsml.rules import admm, averaging, gradient
from slsml.rules.base import UpdateRule
from slsml.spec.config import OptimizerConfig, RunConfig, TrainingSpec

RULES: dict[str, UpdateRule] = {rule.name: rule for rule in (gradient.RULE, averaging.RULE, admm.RULE)}


def of(spec: TrainingSpec) -> UpdateRule:
    """The run's update rule."""
    return RULES[spec.algorithm]


def server_optimizer(config: RunConfig) -> OptimizerConfig:
    """What the run's reducers step with the averaged update."""
    return of(config.training).server_optimizer(config.training, config.optimizer)
