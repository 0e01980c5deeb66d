"""A dataset's x or y: one array, or several named arrays (a model of several inputs or outputs, which Keras's
``fit`` takes as a dict by input and output name). The same few operations serve both forms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from slsml.spec.errors import BadInputError

Arrays = np.ndarray | dict[str, np.ndarray]


def as_arrays(value: Any, what: str) -> Arrays:
    """``value`` as one array, or a mapping as named arrays (BadInputError: named arrays of different lengths, or
    none)."""
    if not isinstance(value, Mapping):
        return np.asarray(value)
    if not value:
        raise BadInputError(f"{what}: no named arrays")
    arrays = {str(name): np.asarray(array) for name, array in value.items()}
    lengths = {name: len(array) if array.ndim else 0 for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        counts = ", ".join(f"{name} {n}" for name, n in lengths.items())
        raise BadInputError(f"{what}: the named arrays hold different numbers of samples ({counts})")
    return arrays


def named(arrays: Arrays, what: str) -> list[tuple[str, np.ndarray]]:
    """Each array with the name messages give it: ``what`` for one array, ``what['name']`` for a named one."""
    if isinstance(arrays, dict):
        return [(f"{what}[{name!r}]", array) for name, array in arrays.items()]
    return [(what, arrays)]


def count(arrays: Arrays) -> int:
    """The number of samples."""
    return len(next(iter(arrays.values())) if isinstance(arrays, dict) else arrays)


def nbytes(arrays: Arrays) -> int:
    """The bytes of all the arrays."""
    return sum(array.nbytes for _, array in named(arrays, ""))


def take(arrays: Arrays, index: Any) -> Arrays:
    """The samples at ``index`` (a slice, a mask or indices), in the same form."""
    if isinstance(arrays, dict):
        return {name: array[index] for name, array in arrays.items()}
    return arrays[index]


def describe(arrays: Arrays) -> str:
    """Per-sample shapes and dtypes, as messages give them: ``(8,) float32`` or ``a (8,) float32, b (3,) int64``."""
    if isinstance(arrays, dict):
        return ", ".join(f"{name} {array.shape[1:]} {array.dtype}" for name, array in arrays.items())
    return f"{arrays.shape[1:]} {arrays.dtype}"


def epoch_batches(count: int, global_batch: int, least: int = 1) -> int:
    """Global batches of an epoch of ``count`` samples, as Keras counts its steps: ⌈count / global_batch⌉, the last
    one smaller where the samples do not fill it, as long as it holds ``least`` samples (one for each worker of the
    run); fewer left over sit the epoch out."""
    whole, left = divmod(count, global_batch)
    return whole + int(left >= max(1, least))
