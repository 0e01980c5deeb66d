"""Where datasets come from: a format is a module of this package (its options, its ``Source``) plus its entry
in ``FORMATS``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from slsml.data.sources import arrays, images, tables, tfrecord
from slsml.data.sources.base import DEFAULT_CHUNK_BYTES, Chunk, Format, Source, SourceOptions, data_files
from slsml.spec.errors import BadInputError, described

FORMATS: dict[str, Format] = {
    f.name: f for f in (arrays.FORMAT, images.FORMAT, tables.PARQUET, tables.CSV, tfrecord.FORMAT)
}
from_python = arrays.from_python

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "FORMATS",
    "Chunk",
    "Format",
    "Source",
    "SourceOptions",
    "detect",
    "from_python",
    "open_source",
]


def detect(path: Path) -> Format:
    """The format of file or folder ``path``: by a file's suffix; a folder by its files' suffixes, or by shards
    named as a format names them (``train-00000-of-01024``), or of images in class subfolders."""
    if not path.exists():
        raise BadInputError(f"{path} does not exist")
    names = [p.name.lower() for p in ([path] if path.is_file() else data_files(path))]
    for format in FORMATS.values():
        if not format.class_folders and names and all(name.endswith(format.suffixes) for name in names):
            return format
    for format in FORMATS.values():
        if format.shards is not None and any(format.shards.fullmatch(name) for name in names):
            return format
    if path.is_dir():
        return images.FORMAT
    known = ", ".join(f"{f.name} ({' '.join(f.suffixes)})" for f in FORMATS.values())
    raise BadInputError(f"{path}: not a format slsml reads ({known}); name one with --format")


def open_source(path: Path, format: str | None = None, **options: Any) -> Source:
    """A source of file or folder ``path`` in ``format`` (default: ``detect``ed), with that format's options."""
    chosen = detect(path) if format is None else FORMATS.get(format)
    if chosen is None:
        raise BadInputError(f"format {format!r}: slsml reads {', '.join(FORMATS)}")
    if not path.exists():
        raise BadInputError(f"{path} does not exist")
    try:
        settings = chosen.options.model_validate(options)
    except ValidationError as error:
        raise BadInputError(f"{path} ({chosen.name}): {described(error)}") from None
    source = chosen.open(path, settings)
    source.options = settings
    return source
