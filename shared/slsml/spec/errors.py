"""Errors that name what is wrong with a user's input or a run."""

import re


class SlsmlError(Exception):
    """Base class of every error slsml raises on purpose."""


class BadInputError(SlsmlError):
    """The user's model, data or request cannot be used; the message says why."""


class RunFailed(SlsmlError):
    """A pipeline step found the run unusable; the run is marked FAILED with this reason."""


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
