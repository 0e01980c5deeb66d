"""Errors that name what is wrong with a user's input or a run, and the one way a pydantic validation error is
shown to a user (``problems``, ``described``)."""

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError


class SlsmlError(Exception):
    """Base class of every error slsml raises on purpose."""


class BadInputError(SlsmlError):
    """The user's model, data or request cannot be used; the message says why."""


class RunFailed(SlsmlError):
    """A pipeline step found the run unusable; the run is marked FAILED with this reason."""


class ConfigReplaced(RunFailed):
    """A run's ``run.json`` is not the one it registered: the run fails, whatever step reads it."""


class KeyLost(RunFailed):
    """A running run's signing keys are gone though its steps sent messages: the run fails, whatever step needs it."""


class KeyForged(RunFailed):
    """A run's signing keys are not the ones its launch made and vouched for: the run fails, whatever step reads
    them."""


class NotFoundError(SlsmlError):
    """A run, dataset or object that was asked for does not exist."""


class MessageRejected(SlsmlError):
    """A pipeline message too big, not JSON or not of the receiving function's type: it is retried and
    dead-lettered, and fails no run (a forged or corrupt message must not end a healthy run)."""

    @classmethod
    def of(cls, message_type: str, message_id: str, problem: str) -> "MessageRejected":
        return cls(f"{message_type} message {message_id} rejected: {problem}")


# a rejection's reason (``MessageRejected.of``), with or without the exception's name before it
_REJECTION = re.compile(rf"^(?:{MessageRejected.__name__}: )?[\w.]+(?: \| [\w.]+)* message \S+ rejected: ")


def rejected(error: str) -> bool:
    """Whether a function's error is its rejection of its message (``MessageRejected``): the error message
    that Lambda attaches to a dead letter (without the exception's name), or one with the name before it."""
    return _REJECTION.match(error) is not None


# the parts of a pydantic error's location that name a member of a union, not a field: ``constrained-int``,
# ``literal['auto']``, ``function-after[…]``, or a bare type
_UNION_MEMBER = re.compile(r"[\[\-]|^(?:int|float|str|bool|bytes|none|dict|list)$")


def problems(error: ValidationError, model: type[BaseModel] | None = None, under: str = "") -> list[str]:
    """Each problem of a pydantic ``error`` as one line, ``field: what is wrong`` (``by_field``)."""
    return [f"{field}: {said}" if field else said for field, said in by_field(error, model, under).items()]


def by_field(error: ValidationError, model: type[BaseModel] | None = None, under: str = "") -> dict[str, str]:
    """A pydantic ``error``'s problems by field (dotted, below ``under``; ``""``: the whole input): what is wrong,
    a field not known with the nearest known name of ``model`` (default: the model ``error`` is of), no input
    echoed and no pydantic URL. A field that no member of a union takes says what each would take."""
    model = model or _model_titled(error.title)
    found: dict[str, list[str]] = {}
    for e in error.errors(include_url=False):
        path = [part for part in e["loc"] if isinstance(part, int) or not _UNION_MEMBER.search(part)]
        field = ".".join(str(part) for part in ([under] if under else []) + path)
        if e["type"] == "extra_forbidden":
            message = "unknown field" + nearest(str(path[-1]), _field_names(model, path[:-1]))
        else:
            message = e["msg"].removeprefix("Value error, ")
        found.setdefault(field, [])
        if message not in found[field]:
            found[field].append(message)
    return {field: " or ".join(said).replace(" or Input should be ", " or ") for field, said in found.items()}


def described(error: ValidationError, model: type[BaseModel] | None = None, under: str = "") -> str:
    """``problems`` on one line, for a message or a run's reason: ``a: …; b: …``."""
    return "; ".join(problems(error, model, under))


def renamed(error: ValidationError, names: Mapping[str, str]) -> str:
    """A pydantic error's problems (``by_field``) on one line, naming each field as the user gave it: ``names``,
    field → its name where the user's differs (a flag, a Python argument), in the field and in what is said."""
    fields = "|".join(sorted(names, key=len, reverse=True)) or r"(?!)"
    return "; ".join(
        (f"{names.get(field, field)}: " if field else "")
        + re.sub(rf"(?<![\w-])({fields})(?![\w-])", lambda match: names[match[1]], said)
        for field, said in by_field(error).items()
    )


def nearest(name: str, known: Iterable[str], n: int = 1, form: Callable[[str], str] = repr) -> str:
    """`` (did you mean 'x'?)`` (or ``'x' or 'y'``: the ``n`` closest) naming the known names close to ``name``;
    empty where none is. ``form``: how a name is written (default: quoted)."""
    close = difflib.get_close_matches(name, list(known), n=n)
    return f" (did you mean {' or '.join(form(c) for c in close)}?)" if close else ""


def unexpected_keyword(function: str, name: str, known: Iterable[str], meant: str | None = None) -> TypeError:
    """Python's own error for an unknown keyword argument of ``function``, naming the one ``meant`` (default: the
    closest ``known`` one)."""
    hint = f" (did you mean {meant!r}?)" if meant else nearest(name, known)
    return TypeError(f"{function}() got an unexpected keyword argument {name!r}{hint}")


def _field_names(model: type[BaseModel] | None, path: list[str | int]) -> list[str]:
    """The field names (and aliases) of the model at ``path`` below ``model``; none where it is not a model."""
    for part in path:
        if model is None or isinstance(part, int):
            continue  # an item of a list: the list's model
        field = model.model_fields.get(part)
        model = None if field is None else _model_in(field.annotation)
    if model is None:
        return []
    return [*model.model_fields, *(f.alias for f in model.model_fields.values() if f.alias)]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds: itself, or the one of an optional, a list or a union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((found for arg in get_args(annotation) if (found := _model_in(arg)) is not None), None)


def _model_titled(title: str) -> type[BaseModel] | None:
    """slsml's model of this name (a ValidationError names its model, it does not hold it)."""
    pending: list[type[BaseModel]] = [BaseModel]
    while pending:
        model = pending.pop()
        if model.__name__ == title and model.__module__.startswith("slsml."):
            return model
        pending += model.__subclasses__()
    return None
