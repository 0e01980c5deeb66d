"""A Python caller's keywords (``slsml.fit``, ``slsml.tune``) as a run's training options: a keyword neither takes is a
TypeError naming the closest one, as Python names it, and options that make no run are one line naming the arguments,
never a pydantic dump."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ParamSpec, TypeVar

from pydantic import ValidationError

from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError, renamed, unexpected_keyword
from slsml.spec.flags import ARGUMENT_NAMES, as_keywords, dest, flag

# TrainingSpec fields that are no training option of a Python caller, and the argument that gives each
NOT_OPTIONS = {
    "iterations": "epochs",
    "global_batch": "batch_size",
    "epochs": "epochs",
    "loss": "loss",
    "optimizer": "optimizer",
}


def training_spec(values: dict[str, Any]) -> TrainingSpec:
    """The TrainingSpec of a Python caller's arguments; BadInputError on one line naming them (``batch_size``: the
    global batch), never a pydantic dump."""
    try:
        return TrainingSpec(**values)
    except ValidationError as error:
        raise BadInputError(renamed(error, ARGUMENT_NAMES)) from None


def check_keywords(function: str, options: Mapping[str, Any], own: Iterable[str]) -> None:
    """TypeError naming a keyword of ``function`` that is neither one of its ``own`` arguments nor a training option
    (a TrainingSpec field it takes), and the closest one that is, as Python names an unexpected keyword."""
    known = [*own, *(name for name in TrainingSpec.model_fields if name not in NOT_OPTIONS)]
    for name in options:
        if name not in known:
            raise unexpected_keyword(function, name, known, NOT_OPTIONS.get(name))


def _keywords() -> dict[str, str]:
    """The flag of each training option a Python caller gives as a keyword → that keyword."""
    fields = [name for name in TrainingSpec.model_fields if NOT_OPTIONS.get(name, name) == name]
    named = {flag(dest(name)): ARGUMENT_NAMES.get(name, name) for name in [*fields, *ARGUMENT_NAMES]}
    return named | {flag(keyword): keyword for keyword in ARGUMENT_NAMES.values()}


KEYWORDS = _keywords()
P = ParamSpec("P")
R = TypeVar("R")


def said_as_keywords(function: Callable[P, R]) -> Callable[P, R]:
    """``function`` (``fit``, ``tune``) whose BadInputError names the training options as its caller gave them, by
    keyword (``pipeline_stages=4``), not by the flags a command takes (``--pipeline-stages 4``)."""

    @functools.wraps(function)
    def called(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except BadInputError as error:
            raise BadInputError(as_keywords(str(error), KEYWORDS)) from None

    return called
