"""Ingest: a source's chunks streamed into a dataset's shards (``DatasetWriter``), in bounded memory.

Where the source brings no test part, a seeded ``test_fraction`` of its samples is held out by one rule, whatever
the format (``held_out``): of n samples, exactly max(1, round(n·fraction)) go to the test split, chosen by their index
alone, block by block of ``SPLIT_BLOCK`` samples. The same rows give the same split as an ``.npz``, Parquet, CSV,
TFRecord or image folder, and the same source read again gives the same shards, which is what lets an interrupted
ingest continue (shards stored and verified are not sent again). A source that does not say its count before it
is read (CSV, TFRecord, Python batches) has its last ``SPLIT_BLOCK`` samples at most held back until its end.
The manifest keeps where the dataset came from (its format, class names and the source's checksum), so that the
same file given again is recognised by its content."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path

import numpy as np

from slsml.aws.storage import ObjectStore
from slsml.data.manifest import DEFAULT_SHARD_MB, DatasetManifest, DatasetOrigin, Split
from slsml.data.sources import DEFAULT_CHUNK_BYTES, Chunk, Source
from slsml.data.writer import DatasetWriter
from slsml.spec import samples
from slsml.spec.errors import BadInputError

SPLIT_BLOCK = 128  # samples: the split of each block of them is drawn together
_READ = 2**20


def held_out_by(samples: int, fraction: float) -> int:
    """How many of a source's first ``samples`` samples the test split takes: round(samples·fraction) (halves up),
    at least one."""
    return max(1, math.floor(samples * fraction + 0.5)) if samples else 0


def held_out(start: int, count: int, fraction: float, seed: int, total: int | None) -> np.ndarray:
    """Whether each of samples start … start+count−1 of a source of ``total`` samples goes to the test split (None:
    the blocks these samples lie in are whole). Block b of ``SPLIT_BLOCK`` samples (the last of ``total`` shorter)
    holds out ``held_out_by`` its end less ``held_out_by`` its start: the first of its samples in a seeded order of
    the block's positions."""
    mask = np.zeros(count, dtype=bool)
    for block in range(start // SPLIT_BLOCK, -(-(start + count) // SPLIT_BLOCK)):
        first = block * SPLIT_BLOCK
        size = SPLIT_BLOCK if total is None else min(SPLIT_BLOCK, total - first)
        take = held_out_by(first + size, fraction) - held_out_by(first, fraction)
        positions = np.random.default_rng([seed, block]).permutation(SPLIT_BLOCK)
        chosen = first + positions[positions < size][:take]
        chosen = chosen[(chosen >= start) & (chosen < start + count)]
        mask[chosen - start] = True
    return mask


def checksum(*paths: Path) -> str:
    """SHA-256 of files' bytes, a folder's files among them (their paths within it and their bytes, in sorted
    order)."""
    digest = hashlib.sha256()
    for path in paths:
        for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            if file != path:
                digest.update(f"{file.relative_to(path).as_posix()}\0{file.stat().st_size}\0".encode())
            with file.open("rb") as stream:
                while block := stream.read(_READ):
                    digest.update(block)
    return digest.hexdigest()


def _split(source: Source, test_fraction: float, seed: int) -> Iterator[tuple[Split, Chunk]]:
    """(split, chunk) of every sample of ``source``: its own test part, or a held-out fraction."""
    if source.test is not None:
        yield from (("train", chunk) for chunk in source.chunks(DEFAULT_CHUNK_BYTES))
        yield from (("test", chunk) for chunk in source.test.chunks(DEFAULT_CHUNK_BYTES))
        return
    if not 0 < test_fraction < 1:
        raise BadInputError(f"test fraction must be between 0 and 1, got {test_fraction}")
    total, start = source.count(), 0  # start: the first sample not yet given a split
    pending: list[Chunk] = []  # samples of a block not yet whole (a source of unknown count)
    for chunk in source.chunks(DEFAULT_CHUNK_BYTES):
        pending.append(chunk)
        end = start + sum(samples.count(c[0]) for c in pending)
        decided = end if total is not None else end // SPLIT_BLOCK * SPLIT_BLOCK
        while pending and start < decided:
            head, n = pending[0], samples.count(pending[0][0])
            if start + n > decided:  # the samples past ``decided`` wait for their block to be whole
                cut = decided - start
                pending[0] = tuple(samples.take(arrays, slice(cut, None)) for arrays in head)
                head, n = tuple(samples.take(arrays, slice(cut)) for arrays in head), cut
            else:
                pending.pop(0)
            yield from _parts(head, held_out(start, n, test_fraction, seed, total))
            start += n
    total = start + sum(samples.count(chunk[0]) for chunk in pending)  # the last block's size known now
    for chunk in pending:
        n = samples.count(chunk[0])
        yield from _parts(chunk, held_out(start, n, test_fraction, seed, total))
        start += n


def _parts(chunk: Chunk, test: np.ndarray) -> Iterator[tuple[Split, Chunk]]:
    """The chunk's training samples, then its test samples (``test``)."""
    yield "train", tuple(samples.take(arrays, ~test) for arrays in chunk)
    yield "test", tuple(samples.take(arrays, test) for arrays in chunk)


def put(
    store: ObjectStore,
    name: str,
    source: Source,
    test_fraction: float = 0.2,
    seed: int = 0,
    shard_mb: float = DEFAULT_SHARD_MB,
    origin: Callable[[], DatasetOrigin] | None = None,
    progress: Callable[[int], None] | None = None,
) -> DatasetManifest:
    """Stream ``source`` into dataset ``name`` (see the module's docstring); ``origin`` gives where it came from,
    asked once the name is known to be free (a checksum reads the whole source); ``progress`` is called with the
    number of samples read, chunk by chunk. Running it again after an interruption continues the upload."""
    parts = _split(source, test_fraction, seed)
    try:
        first = next(parts)
    except StopIteration:
        raise BadInputError(f"{source.where}: no samples") from None
    writer = DatasetWriter.like(store, name, first[1][0], first[1][1], shard_mb=shard_mb, weighted=len(first[1]) > 2)
    with writer:
        for split, chunk in chain([first], parts):
            writer.write(split, *chunk)  # type: ignore[arg-type]
            if progress is not None:
                progress(samples.count(chunk[0]))
        return writer.finish(origin() if origin is not None else None)


def origin_of(path: Path, source: Source, test_fraction: float, seed: int) -> DatasetOrigin:
    """Where a dataset read from file or folder ``path`` came from (its checksum, with the files its options name),
    and how it was read."""
    options = vars(source.options) if source.options is not None else {}
    files = [value for value in options.values() if isinstance(value, Path)]
    return DatasetOrigin(
        format=source.format,
        class_names=source.classes,
        sha256=checksum(path, *files),
        options=source.options.model_dump(mode="json") if source.options is not None else {},
        test_fraction=None if source.test is not None else test_fraction,
        seed=seed,
    )
