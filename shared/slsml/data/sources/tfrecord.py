"""TFRecord files of ``tf.train.Example`` (a file, or a folder of them or of shards named as TensorFlow names them,
``train-00000-of-01024``; ``.gz`` ones GZIP-compressed), parsed with TensorFlow a batch of records at a time by a
feature spec, declared or found from the first record. x is an encoded image (JPEG, PNG, …: ``image/encoded`` in
TensorFlow's ImageNet layout) decoded and resized as an image folder's images are, or the one feature of numbers
besides the label, or the others flattened and concatenated as float32. Numbers are an Int64List or FloatList, or
a BytesList of one string of their raw little-endian bytes (``array.tobytes()``)."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import numpy as np
from pydantic import AfterValidator, Field

from slsml.data.sources.base import Chunk, CommaList, Format, OptionalLabel, Source, data_files, rows_per_chunk
from slsml.data.sources.images import Decoding, ImageDecoder, ImageOptions
from slsml.spec.errors import BadInputError

SUFFIXES = (".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz")
SHARD = re.compile(r".+-\d+-of-\d+")  # TensorFlow's shard names (train-00000-of-01024), read without a suffix
IMAGE = "image"  # a feature spec's dtype of an encoded image
LABELS = ("image/class/label", "label")  # the labels' feature without --label: the first the records have
KINDS = {"bytes_list": "bytes", "int64_list": "int64", "float_list": "float"}  # how a record stores a feature
FIX_RECORD = "fix or leave out that record, then put the data again (nothing of it was stored)"
# the dtype of a feature of numbers found in the first record, by how it is stored
_NUMBERS: dict[str, np.dtype] = {"int64_list": np.dtype(np.int64), "float_list": np.dtype(np.float32)}
# where in TensorFlow an error arose: no news to the user
_TF_CONTEXT = re.compile(r"\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]( name: \S*)?")
_FEATURE = re.compile(r"^(?P<name>[^:]+):(?P<dtype>[a-z0-9]+):(?P<shape>(\d+(x\d+)*)?)$")


def _feature_specs(specs: list[str]) -> list[str]:
    for spec in specs:
        match = _FEATURE.match(spec)
        if match is None:
            raise ValueError(f"{spec!r} is not name:dtype:shape (e.g. image:float32:28x28, label:int64:)")
        if match["dtype"] == IMAGE:
            if match["shape"]:
                raise ValueError(f"{spec!r}: an encoded image takes no shape (it is resized to --image-size)")
        elif match["dtype"] not in np.sctypeDict or np.dtype(match["dtype"]).kind not in "iuf":
            raise ValueError(f"{spec!r}: a feature of numbers (int64, float32, uint8, …) or an encoded image (image)")
    return specs


class TFRecordOptions(ImageOptions):
    label: OptionalLabel = None
    label_offset: int = Field(
        default=0, description="TFRecord: subtracted from every label (1 for ImageNet's labels 1…1000: 0…999)"
    )
    tfrecord_features: Annotated[CommaList, AfterValidator(_feature_specs)] | None = Field(
        default=None,
        description="TFRecord: each feature as name:dtype:shape, comma-separated, dims joined by x"
        " (image:uint8:32x32x3,label:int64:), an encoded image as name:image: (default: found from the first"
        " record)",
    )


class Feature(NamedTuple):
    """A feature as the records store it (``kind``, a key of ``KINDS``) and as it is read: an encoded image (dtype
    None), or numbers of ``dtype`` and ``shape``."""

    kind: str
    dtype: np.dtype | None
    shape: tuple[int, ...]

    def spec(self) -> Any:
        import tensorflow as tf

        if self.kind == "bytes_list":  # an encoded image, or the raw bytes of its numbers: one string
            return tf.io.FixedLenFeature([], tf.string)
        return tf.io.FixedLenFeature(self.shape, tf.int64 if self.kind == "int64_list" else tf.float32)


def record_files(path: Path) -> list[Path]:
    """``path`` itself, or the files of folder ``path`` with a TFRecord suffix or named as shards, sorted."""
    if path.is_file():
        return [path]
    files = sorted(p for p in data_files(path) if p.name.lower().endswith(SUFFIXES) or SHARD.fullmatch(p.name))
    if not files:
        raise BadInputError(
            f"{path}: no TFRecord files in this folder ({', '.join(SUFFIXES)}, or train-00000-of-00010)"
        )
    return files


def image_format(value: bytes) -> str | None:
    """The format of an encoded image (JPEG, PNG, …) as Pillow identifies it; None if it is none."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(value)) as image:
            return image.format
    except OSError:  # Pillow's UnidentifiedImageError among them
        return None


class TFRecordSource(Source):
    format = "tfrecord"

    def __init__(self, path: Path, options: TFRecordOptions) -> None:
        super().__init__(str(path))
        self.settings = options
        self.files = record_files(path)
        self.decoding = Decoding()
        where, example = self._first_example()
        stored = {
            name: (value.WhichOneof("kind"), value)
            for name, value in example.features.feature.items()
            if value.WhichOneof("kind")  # an empty Feature: no values of any kind
        }
        if options.tfrecord_features is None:
            self.features, self.label = self._found(stored, options.label, where)
        else:
            self.features, self.label = self._declared(stored, options.tfrecord_features, options.label, where)
        if self.features[self.label].dtype is None:
            raise BadInputError(f"--label {self.label}: a feature of numbers, not of encoded images")
        image_flags = options.model_fields_set & {"image_size", "grayscale", "keep_channels"}
        if image_flags and all(feature.dtype is not None for feature in self.features.values()):
            flag = "--" + sorted(image_flags)[0].replace("_", "-")
            raise BadInputError(f"{flag} applies to encoded images; {self.where} is read as numbers")

    def _first_example(self) -> tuple[str, Any]:
        """The first record of the files, as a ``tf.train.Example``, and where it is."""
        import tensorflow as tf
        from google.protobuf.message import DecodeError

        for path in self.files:
            for _, serialized in self._batches(path, 1):
                where = f"{path}, record 0"
                try:
                    return where, tf.train.Example.FromString(serialized.numpy()[0])
                except DecodeError as error:
                    raise BadInputError(f"{where}: not a tf.train.Example ({error})") from None
        raise BadInputError(f"{self.where}: no records")

    @staticmethod
    def _declared(
        stored: dict[str, tuple[str, Any]], specs: list[str], label: str | None, where: str
    ) -> tuple[dict[str, Feature], str]:
        """The features of ``--tfrecord-features``, each read as the first record stores it, and the label's name."""
        features = {}
        for spec in specs:
            match = _FEATURE.match(spec)
            assert match is not None, spec  # TFRecordOptions checked every feature spec
            name = match["name"]
            if name not in stored:
                raise BadInputError(f"{where}: no feature {name} (it has {', '.join(sorted(stored))})")
            kind, _ = stored[name]
            if match["dtype"] == IMAGE and kind != "bytes_list":
                raise BadInputError(f"{where}: feature {name} holds {KINDS[kind]} numbers, not an encoded image")
            shape = tuple(int(d) for d in match["shape"].split("x")) if match["shape"] else ()
            features[name] = Feature(kind, None if match["dtype"] == IMAGE else np.dtype(match["dtype"]), shape)
        label = label or next((name for name in LABELS if name in features), LABELS[-1])
        if label not in features:
            raise BadInputError(f"--label {label}: not one of --tfrecord-features ({', '.join(features)})")
        if len(features) < 2:
            raise BadInputError("--tfrecord-features: name a feature of samples besides the label")
        return features, label

    def _found(
        self, stored: dict[str, tuple[str, Any]], label: str | None, where: str
    ) -> tuple[dict[str, Feature], str]:
        """The features found in the first record and the label's name: its encoded image (``image/encoded``, else the
        one BytesList that holds an image), or else every feature of numbers; ``found`` says which."""
        names = ", ".join(sorted(stored))
        label = label or next((name for name in LABELS if name in stored), LABELS[-1])
        if label not in stored:
            raise BadInputError(f"{where}: no feature {label} for the labels (it has {names}); name one with --label")
        label_kind, label_value = stored[label]
        if label_kind == "bytes_list":
            raise BadInputError(f"--label {label}: a feature of numbers, not of bytes")
        length = len(getattr(label_value, label_kind).value)
        label_feature = Feature(label_kind, _NUMBERS[label_kind], () if length == 1 else (length,))
        labelled = f"label {label} ({KINDS[label_kind]}{'' if length == 1 else f' ×{length}'})"
        formats = {
            name: image_format(value.bytes_list.value[0])
            for name, (kind, value) in sorted(stored.items())
            if kind == "bytes_list" and len(value.bytes_list.value) == 1 and name != label
        }
        images = ["image/encoded"] if "image/encoded" in formats else [name for name, got in formats.items() if got]
        if len(images) > 1:
            raise BadInputError(
                f"{where}: features {', '.join(images)} all hold images: declare the one to read with"
                f" --tfrecord-features NAME:image:,{label}:int64:"
            )
        if images:
            self.found = f"{images[0]} {formats[images[0]] or 'encoded'} images, {labelled}"
            return {images[0]: Feature("bytes_list", None, ()), label: label_feature}, label
        numbers = {
            name: Feature(kind, _NUMBERS[kind], (size,))
            for name, (kind, value) in sorted(stored.items())
            if kind != "bytes_list" and name != label and (size := len(getattr(value, kind).value))
        }
        if not numbers:
            raise BadInputError(
                f"{where}: neither an encoded image nor numbers besides the label ({names}); declare the features with"
                " --tfrecord-features (raw pixels: image:uint8:32x32x3)"
            )
        self.found = ", ".join(f"{n} ({KINDS[f.kind]} ×{f.shape[0]})" for n, f in numbers.items()) + f", {labelled}"
        return {**numbers, label: label_feature}, label

    def _batches(self, path: Path, rows: int) -> Iterator[tuple[int, Any]]:
        """The serialized records of file ``path`` in batches of ``rows``, each with its first record's number."""
        import tensorflow as tf

        compression = "GZIP" if path.suffix == ".gz" else ""
        records = tf.data.TFRecordDataset(str(path), compression_type=compression).batch(rows)
        try:
            for number, serialized in enumerate(records):
                yield number * rows, serialized
        except tf.errors.DataLossError as error:
            reason = _TF_CONTEXT.sub("", error.message).strip()
            raise BadInputError(f"{path}: not a readable TFRecord file ({reason})") from None

    def _parsed(self, serialized: Any, path: Path, first: int) -> dict[str, np.ndarray]:
        import tensorflow as tf

        spec = {name: feature.spec() for name, feature in self.features.items()}
        try:
            parsed = tf.io.parse_example(serialized, spec)
        except tf.errors.InvalidArgumentError:
            for number, record in enumerate(serialized.numpy()):  # which record, which feature
                try:
                    tf.io.parse_single_example(record, spec)
                except tf.errors.InvalidArgumentError as error:
                    reason = " ".join(_TF_CONTEXT.sub("", error.message).replace("Feature: ", "feature ").split())
                    reason = re.sub(r"^Key: (.+?)\. ", r"feature \1: ", reason).rstrip(".")
                    raise BadInputError(f"{path}, record {first + number}: {reason}; {FIX_RECORD}") from None
            raise
        return {name: parsed[name].numpy() for name in self.features}

    def _numbers(self, name: str, values: np.ndarray, path: Path, first: int) -> np.ndarray:
        """A feature's values as its dtype: raw bytes (one string a record) taken as they are, numbers cast."""
        feature = self.features[name]
        assert feature.dtype is not None, name  # an encoded image is decoded, not read as numbers
        if feature.kind != "bytes_list":
            return values.astype(feature.dtype, copy=False)
        size = int(np.prod(feature.shape, dtype=np.int64)) * feature.dtype.itemsize
        for number, value in enumerate(values):
            if len(value) != size:
                shape = "x".join(map(str, feature.shape))
                raise BadInputError(
                    f"{path}, record {first + number}: feature {name} holds {len(value)} bytes where"
                    f" {feature.dtype}:{shape} is {size}; {FIX_RECORD}"
                )
        return np.frombuffer(b"".join(values), feature.dtype.newbyteorder("<")).reshape(len(values), *feature.shape)

    def _labels(self, y: np.ndarray, path: Path, first: int) -> np.ndarray:
        """The labels less ``--label-offset``; integer labels below it are refused, naming their record."""
        offset = self.settings.label_offset
        if not offset:
            return y
        below = (y < offset).reshape(len(y), -1).any(axis=1) if y.dtype.kind in "iu" else np.zeros(len(y), bool)
        if below.any():
            number = int(np.argmax(below))
            raise BadInputError(
                f"{path}, record {first + number}: label {y[number]} is below --label-offset {offset}; {FIX_RECORD}"
            )
        return y - offset

    def read(self, chunk_bytes: int) -> Iterator[Chunk]:
        height, width = self.settings.image_size
        sample_bytes = sum(
            height * width * 4 if feature.dtype is None else int(np.prod(feature.shape, dtype=np.int64)) * 8
            for feature in self.features.values()
        )
        rows = rows_per_chunk(sample_bytes, chunk_bytes)
        inputs = [name for name in self.features if name != self.label]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            decoder = ImageDecoder(self.settings, self.decoding, pool)
            for path in self.files:
                for first, serialized in self._batches(path, rows):
                    parsed = self._parsed(serialized, path, first)
                    values = {
                        name: decoder.stack([(v, f"{path}, record {first + i}") for i, v in enumerate(parsed[name])])
                        if self.features[name].dtype is None
                        else self._numbers(name, parsed[name], path, first)
                        for name in self.features
                    }
                    del parsed, serialized  # the encoded records are not held beside the chunk while it is written
                    if len(inputs) == 1:
                        x = values[inputs[0]]
                    else:
                        x = np.concatenate(
                            [values[n].reshape(len(values[n]), -1) for n in inputs], axis=1, dtype=np.float32
                        )
                    yield x, self._labels(values[self.label], path, first)


FORMAT = Format(name="tfrecord", suffixes=SUFFIXES, options=TFRecordOptions, open=TFRecordSource, shards=SHARD)
