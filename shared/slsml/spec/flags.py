"""How a training option is named where a user gives it: a TrainingSpec field's command-line flag
(``--pipeline-stages``) and a Python caller's keyword (``pipeline_stages=``, ``batch_size=``); one naming for the
commands' flags and for what a refusal says to either."""

from __future__ import annotations

import re

# TrainingSpec fields whose flag is not named after the field (the flags' names came first): field → dest
FLAG_NAMES = {
    "global_batch": "batch",
    "heartbeat_s": "heartbeat",
    "time_budget_s": "time_budget",
    "deadline_s": "deadline",
}
# TrainingSpec fields a Python caller gives under Keras's name; their flags take that name too (--batch-size)
ARGUMENT_NAMES = {"global_batch": "batch_size"}
# a flag in a refusal, and the number it is given there (``--pipeline-stages 4``)
_FLAG = re.compile(r"(?<![\w-])--(?P<name>[a-z][a-z0-9-]*)(?: (?P<number>-?\d+(?:\.\d+)?)(?![\w.]))?")


def dest(field: str) -> str:
    """The dest of TrainingSpec field ``field``'s flag."""
    return FLAG_NAMES.get(field, field)


def flag(name: str) -> str:
    """The option string of ``name`` (a dest)."""
    return "--" + name.replace("_", "-")


def as_keywords(message: str, keywords: dict[str, str]) -> str:
    """``message`` (naming command-line flags) as a Python caller reads it: each flag of ``keywords`` (flag → the
    caller's keyword) named as that keyword, with the number it is given (``--pipeline-stages 4`` →
    ``pipeline_stages=4``); other flags as they are."""

    def keyword(found: re.Match[str]) -> str:
        name = keywords.get(flag(found["name"]))
        if name is None:
            return found[0]
        return name if found["number"] is None else f"{name}={found['number']}"

    return _FLAG.sub(keyword, message)
