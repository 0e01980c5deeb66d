"""TFRecord files of ``tf.train.Example`` (a file, or a folder of them; ``.gz`` ones GZIP-compressed), parsed
with TensorFlow a batch of records at a time by a feature spec: x is the one feature besides the label, or the
others flattened and concatenated as float32."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, Field

from slsml.data.sources.base import Chunk, CommaList, Format, Label, Source, SourceOptions, files_of, rows_per_chunk
from slsml.spec.errors import BadInputError

SUFFIXES = (".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz")
_TF_CONTEXT = re.compile(r"\{\{[^}]*\}\}\s*")  # where in TensorFlow an error arose: no news to the user
_FEATURE = re.compile(r"^(?P<name>[^:]+):(?P<dtype>[a-z0-9]+):(?P<shape>(\d+(x\d+)*)?)$")


def _feature_specs(specs: list[str]) -> list[str]:
    for spec in specs:
        match = _FEATURE.match(spec)
        if match is None:
            raise ValueError(f"{spec!r} is not name:dtype:shape (e.g. image:float32:28x28, label:int64:)")
        if np.dtype(match["dtype"]).kind not in "iuf":
            raise ValueError(f"{spec!r}: a feature of numbers (int64, float32, uint8, …)")
    return specs


class TFRecordOptions(SourceOptions):
    label: Label
    tfrecord_features: Annotated[CommaList, AfterValidator(_feature_specs)] = Field(
        description="TFRecord: each feature as name:dtype:shape, comma-separated, dims joined by x"
        " (image:uint8:32x32x3,label:int64:)"
    )


class TFRecordSource(Source):
    format = "tfrecord"

    def __init__(self, path: Path, options: TFRecordOptions) -> None:
        super().__init__(str(path))
        self.files = files_of(path, SUFFIXES)
        self.features: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        for spec in options.tfrecord_features:
            match = _FEATURE.match(spec)
            assert match is not None, spec  # TFRecordOptions checked every feature spec
            shape = tuple(int(d) for d in match["shape"].split("x")) if match["shape"] else ()
            self.features[match["name"]] = (np.dtype(match["dtype"]), shape)
        if options.label not in self.features:
            raise BadInputError(f"--label {options.label}: not one of --tfrecord-features ({', '.join(self.features)})")
        if len(self.features) < 2:
            raise BadInputError("--tfrecord-features: name a feature of samples besides the label")
        self.label = options.label

    def _parsed(self, serialized: Any, path: Path, first: int) -> dict[str, np.ndarray]:
        import tensorflow as tf

        spec = {
            name: tf.io.FixedLenFeature(shape, tf.float32 if dtype.kind == "f" else tf.int64)
            for name, (dtype, shape) in self.features.items()
        }
        try:
            parsed = tf.io.parse_example(serialized, spec)
        except tf.errors.InvalidArgumentError:
            for number, record in enumerate(serialized.numpy()):  # which record, which feature
                try:
                    tf.io.parse_single_example(record, spec)
                except tf.errors.InvalidArgumentError as error:
                    reason = _TF_CONTEXT.sub("", error.message).split(". ")[0].replace("Feature: ", "feature ")
                    raise BadInputError(f"{path}, record {first + number}: {reason}") from None
            raise
        return {name: parsed[name].numpy().astype(dtype, copy=False) for name, (dtype, _) in self.features.items()}

    def read(self, chunk_bytes: int) -> Iterator[Chunk]:
        import tensorflow as tf

        sample_bytes = sum(int(np.prod(shape, dtype=np.int64)) * 8 for _, shape in self.features.values())
        rows = rows_per_chunk(sample_bytes, chunk_bytes)
        inputs = [name for name in self.features if name != self.label]
        for path in self.files:
            compression = "GZIP" if path.suffix == ".gz" else ""
            records = tf.data.TFRecordDataset(str(path), compression_type=compression).batch(rows)
            try:
                for number, serialized in enumerate(records):
                    values = self._parsed(serialized, path, number * rows)
                    if len(inputs) == 1:
                        x = values[inputs[0]]
                    else:
                        x = np.concatenate(
                            [values[n].reshape(len(serialized), -1) for n in inputs], axis=1, dtype=np.float32
                        )
                    yield x, values[self.label]
            except tf.errors.DataLossError as error:
                raise BadInputError(f"{path}: not a readable TFRecord file ({error.message})") from None


FORMAT = Format(name="tfrecord", suffixes=SUFFIXES, options=TFRecordOptions, open=TFRecordSource)
