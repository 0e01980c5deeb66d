"""Arrays as a source: ``.npy`` and ``.npz`` files read a chunk of rows at a time, and, from Python, arrays, an
iterator of ``(x, y)`` batches or a ``tf.data.Dataset`` of them."""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any

import numpy as np
from pydantic import Field

from slsml.data.sources.base import Chunk, Format, Source, SourceOptions, rows_per_chunk
from slsml.spec.errors import BadInputError

_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


class ArrayOptions(SourceOptions):
    labels_file: Path | None = Field(
        default=None, description="the labels of a .npy source: a .npy file with a row per sample of the source"
    )


class _StoredArray:
    """One array of a ``.npy`` file or ``.npz`` member, read from its stream a block of rows at a time: the
    file is never mapped or loaded whole, so memory holds one block."""

    def __init__(self, open_stream: Callable[[], AbstractContextManager[IO[bytes]]], where: str) -> None:
        self._open, self.where = open_stream, where
        with self._open() as stream:
            self.shape, self.dtype = self._header(stream)
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def _header(self, stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
        try:
            version = np.lib.format.read_magic(stream)
            shape, fortran, dtype = _HEADERS[version](stream)
        except (ValueError, KeyError) as error:
            raise BadInputError(f"{self.where} is not a .npy array ({error})") from None
        if dtype.hasobject:
            raise BadInputError(f"{self.where} holds Python objects, not numbers")
        if not shape:
            raise BadInputError(f"{self.where} is a scalar, not an array of samples")
        if fortran and len(shape) > 1:
            raise BadInputError(f"{self.where} is in Fortran order; save it with np.ascontiguousarray(...)")
        return shape, dtype

    def blocks(self, rows: int) -> Iterator[np.ndarray]:
        with self._open() as stream:
            self._header(stream)
            for start in range(0, self.shape[0], rows):
                count = min(rows, self.shape[0] - start)
                body = stream.read(count * self.row_bytes)
                if len(body) < count * self.row_bytes:
                    ends = start + len(body) // max(1, self.row_bytes)
                    raise BadInputError(f"{self.where} is truncated: it ends within sample {ends} of {self.shape[0]}")
                yield np.frombuffer(body, self.dtype).reshape(count, *self.shape[1:])


@contextmanager
def _member_stream(path: Path, member: str) -> Iterator[IO[bytes]]:
    with zipfile.ZipFile(path) as archive, archive.open(member) as stream:
        yield stream


class StoredArraysSource(Source):
    """x and y (and the samples' weights w) of ``.npy`` files or ``.npz`` members, read in lockstep."""

    def __init__(self, where: str, x: _StoredArray, y: _StoredArray, w: _StoredArray | None = None) -> None:
        super().__init__(where)
        if x.shape[0] != y.shape[0]:
            raise BadInputError(f"{where}: x has {x.shape[0]} samples but y has {y.shape[0]}")
        if w is not None and w.shape != (x.shape[0],):
            raise BadInputError(
                f"{where}: w (sample weights) has shape {w.shape}, where x has {x.shape[0]} samples (one weight each)"
            )
        self.x, self.y, self.w = x, y, w

    def count(self) -> int:
        return self.x.shape[0]

    def read(self, chunk_bytes: int) -> Iterator[Chunk]:
        arrays = [self.x, self.y, *([self.w] if self.w is not None else [])]
        rows = rows_per_chunk(sum(a.row_bytes for a in arrays), chunk_bytes)
        yield from zip(*(a.blocks(rows) for a in arrays), strict=True)


def open_file(path: Path, options: ArrayOptions) -> Source:
    """A ``.npz`` of x, y (and optionally x_test, y_test: the source's test part; w, w_test: the samples'
    weights), or a ``.npy`` of x with its labels in ``options.labels_file``."""
    if path.suffix == ".npy":
        if options.labels_file is None:
            raise BadInputError(f"{path}: a .npy source holds x alone; give its labels with --labels-file Y.npy")
        x = _StoredArray(lambda: path.open("rb"), str(path))
        labels = options.labels_file
        y = _StoredArray(lambda: labels.open("rb"), str(labels))
        source = StoredArraysSource(str(path), x, y)
    else:
        try:
            with zipfile.ZipFile(path) as archive:
                names = {name.removesuffix(".npy") for name in archive.namelist()}
        except (zipfile.BadZipFile, OSError) as error:
            raise BadInputError(f"{path} is not a .npz file of arrays: {error}") from None
        if not {"x", "y"} <= names:
            raise BadInputError(f"{path} must hold arrays named x and y (it has {sorted(names)})")

        def member(name: str) -> _StoredArray:
            return _StoredArray(partial(_member_stream, path, f"{name}.npy"), f"{path}:{name}")

        if "w_test" in names and "w" not in names:
            raise BadInputError(f"{path} holds w_test (test sample weights) but no w for its training samples")
        source = StoredArraysSource(str(path), member("x"), member("y"), member("w") if "w" in names else None)
        if {"x_test", "y_test"} <= names:
            source.test = StoredArraysSource(
                f"{path} (test)", member("x_test"), member("y_test"), member("w_test") if "w_test" in names else None
            )
    source.format = FORMAT.name
    return source


FORMAT = Format(name="arrays", suffixes=(".npz", ".npy"), options=ArrayOptions, open=open_file)


class BatchesSource(Source):
    """``(x, y)`` batches from Python, cut into chunks of at most ``chunk_bytes`` where a batch is bigger."""

    format = "python"

    def __init__(self, where: str, batches: Callable[[], Iterable[Any]], samples: int | None = None) -> None:
        super().__init__(where)
        self._batches, self._samples = batches, samples

    def count(self) -> int | None:
        return self._samples

    def read(self, chunk_bytes: int) -> Iterator[Chunk]:
        for number, batch in enumerate(self._batches()):
            if not (isinstance(batch, tuple | list) and len(batch) == 2):
                raise BadInputError(f"{self.where}: batch {number} is not an (x, y) pair")
            x, y = np.asarray(batch[0]), np.asarray(batch[1])
            rows = rows_per_chunk(x[:1].nbytes + y[:1].nbytes, chunk_bytes)
            for start in range(0, max(len(x), len(y)), rows):
                yield x[start : start + rows], y[start : start + rows]


def from_python(x: Any, y: Any = None, x_test: Any = None, y_test: Any = None) -> Source:
    """A source of arrays ``x``, ``y`` (and ``x_test``, ``y_test``: its test part), or, with ``x`` alone, of
    ``x``'s ``(x, y)`` batches: a ``tf.data.Dataset`` as Keras ``fit`` takes it, or an iterable (an iterator is
    read once, so an interrupted ingest of one cannot continue)."""
    if y is None:
        if hasattr(x, "as_numpy_iterator"):
            return BatchesSource("the tf.data.Dataset", x.as_numpy_iterator)
        return BatchesSource("the (x, y) batches", lambda: x)
    source = BatchesSource("the arrays", lambda: [(x, y)], samples=len(x))
    if (x_test is None) != (y_test is None):
        raise BadInputError("give both x_test and y_test, or neither")
    if x_test is not None:
        source.test = BatchesSource("the test arrays", lambda: [(x_test, y_test)], samples=len(x_test))
    return source
