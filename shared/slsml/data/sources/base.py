"""What every data source is: samples read as bounded ``(x, y)`` numpy chunks, checked as they come."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from slsml.spec import samples
from slsml.spec.errors import BadInputError
from slsml.spec.samples import Arrays

Chunk = tuple[Arrays, ...]  # (x, y), or (x, y, w) from a source of sample weights; x, y: an array or named arrays
DEFAULT_CHUNK_BYTES = 16 * 2**20  # one chunk of samples in memory at a time: a quarter of a shard


def comma_list(value: Any) -> Any:
    """A flag's ``a,b,c`` as a list (other values as they are)."""
    return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value


CommaList = Annotated[list[str], BeforeValidator(comma_list)]
# the labels' column (tables) or feature (TFRecord): declared once, a flag of every format that reads it
_LABEL = Field(
    description="the column (tables) or feature (TFRecord; default image/class/label, else label) that holds the labels"
)
OptionalLabel = Annotated[str | None, _LABEL]


class SourceOptions(BaseModel):
    """A format's own options: each field is a ``slsml data put`` flag (its description the flag's help)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(ABC):
    """Samples of one dataset as ``(x, y)`` chunks of at most about ``chunk_bytes`` each.

    ``where`` names it in messages; ``classes`` are the names of integer labels 0 … C−1 where the source has
    them; ``test`` is a held-out part the source brings along (None: the ingest splits one off); ``found``, what it
    found in its files that the options did not say (the ingest says it before reading)."""

    format: str = ""
    classes: tuple[str, ...] | None = None
    test: Source | None = None
    options: SourceOptions | None = None  # how it was opened (None: from Python)
    found: str | None = None

    def __init__(self, where: str) -> None:
        self.where = where

    def count(self) -> int | None:
        """The number of samples, where the source knows it before reading them (progress bars)."""
        return None

    @abstractmethod
    def read(self, chunk_bytes: int) -> Iterator[Chunk]:
        """The samples in a fixed order (the same every time: an interrupted ingest continues)."""

    def chunks(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[Chunk]:
        """``read``'s chunks, checked: numeric, finite, x and y of the same length, every chunk's samples of
        the first chunk's shapes and dtypes (BadInputError naming ``where`` otherwise)."""
        first: str | None = None
        start = 0
        for chunk in self.read(chunk_bytes):
            x, y = samples.as_arrays(chunk[0], self.where), samples.as_arrays(chunk[1], self.where)
            n = samples.count(x)
            if not n and not samples.count(y):
                continue
            what = f"{self.where} (samples {start}–{start + n - 1})"
            validate_arrays(x, y, what)
            if len(chunk) > 2:
                validate_weights(np.asarray(chunk[2]), n, what)
            kind = f"x {samples.describe(x)}, y {samples.describe(y)}"
            if first is None:
                first = kind
            elif kind != first:
                raise BadInputError(f"{what}: samples of {kind}, where the first are {first}")
            start += n
            yield (x, y, np.asarray(chunk[2], dtype=np.float32)) if len(chunk) > 2 else (x, y)
        if first is None:
            raise BadInputError(f"{self.where}: no samples")


def validate_arrays(x: Arrays, y: Arrays, what: str) -> None:
    """One line naming ``what`` is wrong with a chunk of samples (BadInputError), if anything is: x and y may each
    be one array or a dict of named arrays."""
    arrays = [*samples.named(x, "x"), *samples.named(y, "y")]
    lengths = {name: len(array) if array.ndim else 0 for name, array in arrays}
    if len(set(lengths.values())) > 1:
        (first, n), *others = lengths.items()
        raise BadInputError(f"{what}: {first} has {n} samples but {', '.join(f'{k} has {m}' for k, m in others)}")
    if not next(iter(lengths.values())):
        raise BadInputError(f"{what}: no samples")
    for name, array in arrays:
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
            raise BadInputError(f"{what}: {name} has non-numeric dtype {array.dtype}")
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise BadInputError(f"{what}: {name} contains NaN or Inf")


def validate_weights(w: np.ndarray, samples: int, what: str) -> None:
    """One line naming ``what`` is wrong with the sample weights of a chunk of ``samples`` (BadInputError)."""
    w = np.asarray(w)
    if w.shape != (samples,):
        raise BadInputError(f"{what}: sample weights of shape {w.shape} for {samples} samples (one number each)")
    if not (np.issubdtype(w.dtype, np.integer) or np.issubdtype(w.dtype, np.floating) or w.dtype == bool):
        raise BadInputError(f"{what}: sample weights of non-numeric dtype {w.dtype}")
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        raise BadInputError(
            f"{what}: sample weights must be finite numbers from 0 (sample {int(np.argmax(bad))}'s is {w[bad][0]})"
        )


def rows_per_chunk(sample_bytes: int, chunk_bytes: int) -> int:
    """How many samples of ``sample_bytes`` make a chunk of at most ``chunk_bytes`` (at least one)."""
    return max(1, chunk_bytes // max(1, sample_bytes))


@dataclass(frozen=True)
class Format:
    """A source format: its name (``--format``), the file suffixes it reads (a folder: the suffixes of its
    files), the names of files it reads without a suffix (``shards``: TFRecord's ``train-00000-of-01024``), whether
    it reads a folder of class subfolders, its options and how to open a source."""

    name: str
    suffixes: tuple[str, ...]
    options: type[SourceOptions]
    open: Callable[[Path, Any], Source]
    class_folders: bool = False
    shards: re.Pattern[str] | None = None


def data_files(folder: Path) -> list[Path]:
    """The files under ``folder`` but those named as hidden or as metadata (``.*``, ``_*``: ``_SUCCESS``,
    ``.DS_Store``), as pyarrow leaves them out."""
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))]


def files_of(path: Path, suffixes: Iterable[str]) -> list[Path]:
    """``path`` itself, or the ``data_files`` of the folder ``path`` whose names end in one of ``suffixes``,
    sorted."""
    if path.is_file():
        return [path]
    ends = tuple(suffixes)
    files = sorted(p for p in data_files(path) if p.name.lower().endswith(ends))
    if not files:
        raise BadInputError(f"{path}: no {', '.join(ends)} files in this folder")
    return files
