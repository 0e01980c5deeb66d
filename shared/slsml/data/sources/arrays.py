"""Arrays as a source: ``.npy`` and ``.npz`` files read a chunk of rows at a time (memory-mapped where they are stored
uncompressed), and, from Python, arrays, an iterator of ``(x, y)`` batches or a ``tf.data.Dataset`` of them."""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any

import numpy as np
from pydantic import Field

from slsml.data.sources.base import Chunk, Format, Source, SourceOptions, rows_per_chunk
from slsml.spec import samples
from slsml.spec.errors import BadInputError

_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
# a ZIP member's local file header (its fixed part, ending with its name's and extra field's lengths)
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"
_ENCRYPTED = 0x1


class ArrayOptions(SourceOptions):
    labels_file: Path | None = Field(
        default=None, description="the labels of a .npy source: a .npy file with a row per sample of the source"
    )


class _StoredArray:
    """One array of a ``.npy`` file or ``.npz`` member, a block of rows at a time, so that memory holds one block
    however big the file: memory-mapped where its bytes lie in a file as they are (a ``.npy``; a ``.npz`` member
    stored uncompressed, as ``np.savez`` writes them), each block mapped on its own and unmapped once the reader
    lets it go (one mapping of the whole file would keep every page read resident), else (a compressed member)
    read from its stream."""

    def __init__(
        self,
        open_stream: Callable[[], AbstractContextManager[IO[bytes]]],
        where: str,
        stored_at: tuple[Path, int] | None = None,
    ) -> None:
        """``stored_at``: the file and the offset in it at which the array's ``.npy`` bytes begin, if they are
        stored as they are."""
        self._open, self.where = open_stream, where
        with self._open() as stream:
            self.shape, self.dtype = self._header(stream)
            header_bytes = stream.tell()
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._mapped: tuple[Path, int] | None = None
        if stored_at is not None and self.row_bytes:
            path, offset = stored_at
            self._mapped = path, offset + header_bytes
            self._check_length(path.stat().st_size - self._mapped[1])

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

    def _check_length(self, available: int) -> None:
        if available < self.shape[0] * self.row_bytes:
            ends = available // max(1, self.row_bytes)
            raise BadInputError(f"{self.where} is truncated: it ends within sample {ends} of {self.shape[0]}")

    def blocks(self, rows: int) -> Iterator[np.ndarray]:
        if self._mapped is not None:
            path, data = self._mapped
            for start in range(0, self.shape[0], rows):
                count = min(rows, self.shape[0] - start)
                shape = (count, *self.shape[1:])
                yield np.memmap(path, self.dtype, "r", offset=data + start * self.row_bytes, shape=shape)
            return
        with self._open() as stream:
            self._header(stream)
            for start in range(0, self.shape[0], rows):
                count = min(rows, self.shape[0] - start)
                body = stream.read(count * self.row_bytes)
                if len(body) < count * self.row_bytes:
                    self._check_length(start * self.row_bytes + len(body))
                yield np.frombuffer(body, self.dtype).reshape(count, *self.shape[1:])


def _stored_at(path: Path, member: zipfile.ZipInfo) -> tuple[Path, int] | None:
    """Where member's bytes begin in the ``.npz`` file ``path``, if it is stored uncompressed and unencrypted."""
    if member.compress_type != zipfile.ZIP_STORED or member.flag_bits & _ENCRYPTED:
        return None
    with path.open("rb") as archive:
        archive.seek(member.header_offset)
        local = archive.read(_LOCAL_HEADER.size)
    if len(local) < _LOCAL_HEADER.size or local[:4] != _LOCAL_SIGNATURE:
        return None
    name_bytes, extra_bytes = _LOCAL_HEADER.unpack(local)[-2:]
    return path, member.header_offset + _LOCAL_HEADER.size + name_bytes + extra_bytes


@contextmanager
def _member_stream(path: Path, member: str) -> Iterator[IO[bytes]]:
    with zipfile.ZipFile(path) as archive, archive.open(member) as stream:
        yield stream


Stored = _StoredArray | dict[str, _StoredArray]  # one array, or named arrays (a model's inputs or outputs)


class StoredArraysSource(Source):
    """x and y (each one array or named arrays) and the samples' weights w of ``.npy`` files or ``.npz`` members,
    read in lockstep."""

    def __init__(self, where: str, x: Stored, y: Stored, w: _StoredArray | None = None) -> None:
        super().__init__(where)
        parts = {"x": x, "y": y, **({"w": w} if w is not None else {})}
        self._arrays = {
            (part, name): array
            for part, stored in parts.items()
            for name, array in (stored.items() if isinstance(stored, dict) else [(None, stored)])
        }
        counts = {part if name is None else f"{part}[{name!r}]": a.shape[0] for (part, name), a in self._arrays.items()}
        if w is not None and w.shape != (w_count := next(iter(counts.values())),):
            raise BadInputError(
                f"{where}: w (sample weights) has shape {w.shape}, where x has {w_count} samples (one weight each)"
            )
        if len(set(counts.values())) > 1:
            (first, n), *others = counts.items()
            raise BadInputError(f"{where}: {first} has {n} samples but {', '.join(f'{k} has {m}' for k, m in others)}")
        self._count = next(iter(counts.values()))

    def count(self) -> int:
        return self._count

    def read(self, chunk_bytes: int) -> Iterator[Chunk]:
        rows = rows_per_chunk(sum(a.row_bytes for a in self._arrays.values()), chunk_bytes)
        for blocks in zip(*(a.blocks(rows) for a in self._arrays.values()), strict=True):
            chunk: dict[str, Any] = {}
            for (part, name), block in zip(self._arrays, blocks, strict=True):
                if name is None:
                    chunk[part] = block
                else:
                    chunk.setdefault(part, {})[name] = block
            yield tuple(chunk.values())


def open_file(path: Path, options: ArrayOptions) -> Source:
    """A ``.npz`` of x, y (and optionally x_test, y_test: the source's test part; w, w_test: the samples'
    weights), or a ``.npy`` of x with its labels in ``options.labels_file``. In an ``.npz``, x (y) may be named
    arrays ``x_<name>`` (``y_<name>``), one per input (output) of the model, with ``x_test_<name>``
    (``y_test_<name>``) the test part's. The training arrays may be named as Keras's datasets name them (``x_train``,
    ``y_train``, as ``mnist.npz`` holds them)."""
    if path.suffix == ".npy":
        if options.labels_file is None:
            raise BadInputError(f"{path}: a .npy source holds x alone; give its labels with --labels-file Y.npy")
        x = _StoredArray(lambda: path.open("rb"), str(path), (path, 0))
        labels = options.labels_file
        y = _StoredArray(lambda: labels.open("rb"), str(labels), (labels, 0))
        source = StoredArraysSource(str(path), x, y)
    else:
        try:
            with zipfile.ZipFile(path) as archive:
                members = {info.filename.removesuffix(".npy"): info for info in archive.infolist()}
        except (zipfile.BadZipFile, OSError) as error:
            raise BadInputError(f"{path} is not a .npz file of arrays: {error}") from None
        members = _training_named(members)
        names = set(members)

        def member(name: str) -> _StoredArray:
            info = members[name]
            return _StoredArray(partial(_member_stream, path, info.filename), f"{path}:{name}", _stored_at(path, info))

        def stored(part: str) -> Stored | None:
            """``part`` (x, y, x_test, y_test): its member, or its named members ``<part>_<name>``."""
            if part in names:
                return member(part)
            test = part.endswith("_test")
            named = {
                name.removeprefix(f"{part}_"): member(name)
                for name in sorted(names)
                if name.startswith(f"{part}_") and (test or not name.startswith(f"{part}_test"))
            }
            return named or None

        inputs, targets = stored("x"), stored("y")
        if inputs is None or targets is None:
            raise BadInputError(
                f"{path} must hold arrays named x and y, or x_<input> and y_<output> (it has {sorted(names)})"
            )
        if "w_test" in names and "w" not in names:
            raise BadInputError(f"{path} holds w_test (test sample weights) but no w for its training samples")
        source = StoredArraysSource(str(path), inputs, targets, member("w") if "w" in names else None)
        if (x_test := stored("x_test")) is not None and (y_test := stored("y_test")) is not None:
            source.test = StoredArraysSource(
                f"{path} (test)", x_test, y_test, member("w_test") if "w_test" in names else None
            )
    source.format = FORMAT.name
    return source


def _training_named(members: dict[str, zipfile.ZipInfo]) -> dict[str, zipfile.ZipInfo]:
    """``members`` with ``x_train``, ``y_train`` (and ``w_train``) as x, y (and w), where they are the training
    arrays: no x or y besides them and the test part's (else ``x_train`` is the input named ``train``)."""
    parts = ("x", "y")
    plain = all(f"{part}_train" in members for part in parts) and not any(
        name == part
        or (name.startswith(f"{part}_") and name != f"{part}_train" and not name.startswith(f"{part}_test"))
        for name in members
        for part in parts
    )
    if not plain:
        return members
    return {
        name.removesuffix("_train") if name in {"x_train", "y_train", "w_train"} else name: info
        for name, info in members.items()
    }


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
            x, y = samples.as_arrays(batch[0], self.where), samples.as_arrays(batch[1], self.where)
            first = slice(1)
            rows = rows_per_chunk(
                samples.nbytes(samples.take(x, first)) + samples.nbytes(samples.take(y, first)), chunk_bytes
            )
            for start in range(0, max(samples.count(x), samples.count(y)), rows):
                part = slice(start, start + rows)
                yield samples.take(x, part), samples.take(y, part)


def from_python(x: Any, y: Any = None, x_test: Any = None, y_test: Any = None) -> Source:
    """A source of arrays ``x``, ``y`` (and ``x_test``, ``y_test``: its test part; each an array or a dict of named
    arrays, by the model's input and output names), or, with ``x`` alone, of
    ``x``'s ``(x, y)`` batches: a ``tf.data.Dataset`` as Keras ``fit`` takes it, or an iterable. An interrupted
    ingest continues when given the same batches again: the same dataset (read anew) or iterable, or a new
    iterator of them (a generator called again), not one partly read."""
    if y is None:
        if hasattr(x, "as_numpy_iterator"):
            return BatchesSource("the tf.data.Dataset", x.as_numpy_iterator)
        return BatchesSource("the (x, y) batches", lambda: x)
    source = BatchesSource("the arrays", lambda: [(x, y)], samples=samples.count(samples.as_arrays(x, "x")))
    if (x_test is None) != (y_test is None):
        raise BadInputError("give both x_test and y_test, or neither")
    if x_test is not None:
        count = samples.count(samples.as_arrays(x_test, "x_test"))
        source.test = BatchesSource("the test arrays", lambda: [(x_test, y_test)], samples=count)
    return source
