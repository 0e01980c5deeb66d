"""Parquet and CSV tables (a file, or a folder of them), read with pyarrow a batch of rows at a time: one column
of labels, feature columns as float32 (default: every other numeric column), or named groups of them (x as named
arrays, one per input of a model: ``--features "wide=a,b,c;deep=d,e"``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, Field

from slsml.data.sources.base import (
    Chunk,
    Format,
    OptionalLabel,
    Source,
    SourceOptions,
    comma_list,
    files_of,
    rows_per_chunk,
)
from slsml.spec.errors import BadInputError


def feature_groups(value: Any) -> Any:
    """``a,b,c`` as a list of columns; ``wide=a,b;deep=c`` as columns by input name."""
    if not (isinstance(value, str) and "=" in value):
        return comma_list(value)
    groups: dict[str, list[str]] = {}
    for part in filter(str.strip, value.split(";")):
        name, _, columns = part.partition("=")
        if not name.strip() or not comma_list(columns) or name.strip() in groups:
            raise ValueError(f"{part.strip()!r} is not NAME=COLUMN,… (each name once) in {value!r}")
        groups[name.strip()] = comma_list(columns)
    return groups


Features = Annotated[list[str] | dict[str, list[str]], BeforeValidator(feature_groups)]


class TableOptions(SourceOptions):
    label: OptionalLabel = None  # required: None is refused naming the table's columns
    features: Features | None = Field(
        default=None,
        description="tables: the feature columns, comma-separated (default: every other numeric column); or named"
        ' groups of them, one per input of the model: "wide=a,b;deep=c"',
    )
    weight: str | None = Field(
        default=None, description="tables: the column of the samples' weights (Keras's sample_weight), not a feature"
    )


class TableSource(Source):
    def __init__(self, path: Path, options: TableOptions, format: str) -> None:
        import pyarrow as pa
        import pyarrow.dataset as ds

        super().__init__(str(path))
        self.format = format
        files = files_of(path, (f".{format}",))
        try:
            self._table = ds.dataset([str(f) for f in files], format=format)
            schema = self._table.schema
        except (pa.ArrowInvalid, OSError) as error:
            raise BadInputError(f"{path}: not a readable {format} table ({error})") from None
        if options.label is None:
            raise BadInputError(
                f"{path}: which column holds the labels? give it as --label COLUMN (it has {', '.join(schema.names)})"
            )
        label: str = options.label
        numeric = {
            f.name
            for f in schema
            if pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type)
        }
        special = {label, options.weight}
        features = options.features or [name for name in schema.names if name in numeric and name not in special]
        self.groups = features if isinstance(features, dict) else {"": features}  # "": x is one array
        columns = [column for group in self.groups.values() for column in group]
        for column in (label, *columns, *([options.weight] if options.weight else [])):
            if column not in schema.names:
                raise BadInputError(f"{path}: no column {column!r} (it has {', '.join(schema.names)})")
            if column not in numeric:
                raise BadInputError(f"{path}: column {column!r} is {schema.field(column).type}, not numeric")
        if not columns:
            raise BadInputError(f"{path}: no numeric column besides the label {label!r}")
        self.label, self.features, self.weight = label, columns, options.weight

    def count(self) -> int | None:
        return self._table.count_rows() if self.format == "parquet" else None  # Parquet's footers hold it

    def read(self, chunk_bytes: int) -> Iterator[Chunk]:
        import pyarrow as pa

        rows = rows_per_chunk(4 * len(self.features) + 8, chunk_bytes)
        weight = [self.weight] if self.weight else []
        batches = self._table.to_batches(
            columns=[*self.features, self.label, *weight], batch_size=rows, batch_readahead=1, fragment_readahead=1
        )
        try:
            for batch in batches:
                named = {group: self._features(batch, columns) for group, columns in self.groups.items()}
                x = named.pop("") if "" in named else named
                y = self._values(batch.column(self.label), self.label)
                y = y.astype(np.float32) if y.dtype.kind == "f" else y
                if self.weight:
                    yield x, y, self._values(batch.column(self.weight), self.weight).astype(np.float32)
                else:
                    yield x, y
        except pa.ArrowInvalid as error:
            raise BadInputError(f"{self.where}: {error}") from None

    def _features(self, batch: Any, columns: list[str]) -> np.ndarray:
        x = np.empty((batch.num_rows, len(columns)), dtype=np.float32)
        for index, name in enumerate(columns):
            x[:, index] = self._values(batch.column(name), name)
        return x

    def _values(self, column: Any, name: str) -> np.ndarray:
        if column.null_count:
            raise BadInputError(f"{self.where}: column {name!r} has empty values")
        return column.to_numpy(zero_copy_only=False)


PARQUET = Format(
    name="parquet",
    suffixes=(".parquet",),
    options=TableOptions,
    open=lambda path, options: TableSource(path, options, "parquet"),
)
CSV = Format(
    name="csv", suffixes=(".csv",), options=TableOptions, open=lambda path, options: TableSource(path, options, "csv")
)
