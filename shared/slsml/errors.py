"""Errors that name what is wrong with a user's input or a run."""


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
