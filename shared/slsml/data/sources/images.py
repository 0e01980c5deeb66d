"""A folder of images in class subfolders, read as ``keras.utils.image_dataset_from_directory`` reads it: the
classes are the sorted names of the folder's subfolders (hidden ones left out), label i the i-th; each class's
images are the files under its subfolder, at any depth, walked in sorted order. Images are decoded with Pillow
(JPEG, PNG, BMP, GIF's first frame, WebP), converted to RGB (or grayscale, or kept as they are) and resized to
``image_size`` as Keras resizes them (``resize_bilinear``), stored as uint8: Keras's float pixels rounded to the
nearest level. (A JPEG's pixels differ from Keras's by a few levels more: TensorFlow decodes JPEG with libjpeg's fast
integer transform, Pillow with its accurate one.)"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BeforeValidator, Field, PositiveInt, model_validator

from slsml.data.sources.base import Chunk, Format, Source, SourceOptions, comma_list, rows_per_chunk
from slsml.spec.errors import BadInputError

SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")  # Keras's, and WebP
DECODING_PIXELS = 32_000_000  # full-size pixels decoded at once, at most (about 230 MB of an RGB JPEG's copies)
KEPT = {"1": "L", "L": "L", "LA": "LA", "RGB": "RGB", "RGBA": "RGBA"}  # --keep-channels: a file's mode → the one stored


class ImageOptions(SourceOptions):
    image_size: Annotated[tuple[PositiveInt, PositiveInt], BeforeValidator(comma_list)] = Field(
        default=(256, 256),
        description="images: the height,width every image is resized to (bilinear, as Keras resizes it)",
    )
    grayscale: bool = Field(default=False, description="images: convert each to 1 channel (default: 3, RGB)")
    keep_channels: bool = Field(
        default=False, description="images: keep the channels the files have, all alike (default: convert to RGB)"
    )

    @model_validator(mode="after")
    def _one_conversion(self) -> ImageOptions:
        if self.grayscale and self.keep_channels:
            raise ValueError("--grayscale converts every image; --keep-channels converts none: give one")
        return self

    @property
    def mode(self) -> str | None:
        """The Pillow mode every image is converted to (None: kept)."""
        return None if self.keep_channels else "L" if self.grayscale else "RGB"


def class_files(folder: Path) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    """The class names and every image file with its label, in Keras's order."""
    if not folder.is_dir():
        raise BadInputError(f"{folder} is not a folder of class subfolders")
    classes = tuple(
        sorted(entry.name for entry in os.scandir(folder) if entry.is_dir() and not entry.name.startswith("."))
    )
    if not classes:
        raise BadInputError(f"{folder}: no class subfolders (images go in one subfolder per class)")
    files = []
    for label, name in enumerate(classes):
        found = [
            Path(root, file)
            for root, _, names in sorted(os.walk(folder / name), key=lambda walk: walk[0])
            for file in sorted(names)
            if file.lower().endswith(SUFFIXES)
        ]
        if not found:
            raise BadInputError(f"{folder / name}: class folder without images ({', '.join(SUFFIXES)})")
        files += [(path, label) for path in found]
    return classes, files


class Decoding:
    """How many pixels the images decoded at once hold between them, held to ``limit``: an image waits until its
    pixels fit beside the others' (one larger than the limit is decoded alone), so that a decode's full-size copies
    (Pillow's and numpy's, up to 12 bytes a pixel) stay bounded however many CPUs decode and however large the
    images."""

    def __init__(self, limit: int = DECODING_PIXELS) -> None:
        self.limit, self.held = limit, 0
        self._changed = threading.Condition()

    @contextmanager
    def pixels(self, count: int) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self.held == 0 or self.held + count <= self.limit)
            self.held += count
        try:
            yield
        finally:
            with self._changed:
                self.held -= count
                self._changed.notify_all()


def decode_image(data: Path | bytes, where: str, options: ImageOptions, decoding: Decoding | None = None) -> np.ndarray:
    """One image, a file or its encoded bytes, as a ``(height, width, channels)`` uint8 array, converted to
    ``options.mode`` and resized to ``options.image_size`` (its full-size pixels held to ``decoding``); BadInputError
    naming ``where`` otherwise."""
    from PIL import Image

    try:
        with (
            Image.open(data if isinstance(data, Path) else io.BytesIO(data)) as opened,
            decoding.pixels(opened.size[0] * opened.size[1]) if decoding else nullcontext(),
        ):
            opened.load()
            image: Image.Image = opened
            if options.mode is not None:
                image = image if image.mode == options.mode else image.convert(options.mode)
            elif image.mode == "P":
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            elif image.mode in KEPT:
                image = image.convert(KEPT[image.mode])
            else:
                raise BadInputError(f"{where}: images of mode {image.mode} cannot be kept as they are")
            pixels = np.asarray(image)
            if pixels.dtype != np.uint8:
                raise BadInputError(f"{where}: {pixels.dtype} pixels; slsml reads 8-bit images")
            pixels = pixels.reshape(*pixels.shape[:2], -1)
            return np.floor(resize_bilinear(pixels, *options.image_size) + 0.5).astype(np.uint8)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        unusable = "not a readable image" if isinstance(data, Path) else "not a decodable image"
        raise BadInputError(f"{where}: {unusable} ({error})") from None


class ImageDecoder:
    """Images decoded a chunk at a time on ``pool``'s threads (Pillow decodes without the GIL), their full-size
    pixels held to ``decoding``, and stacked: each must have the channels of the first."""

    def __init__(self, options: ImageOptions, decoding: Decoding, pool: Executor) -> None:
        self.options, self.decoding, self.pool = options, decoding, pool
        self.first: tuple[int, str] | None = None  # the first image's channels and where it is

    def stack(self, images: Sequence[tuple[Path | bytes, str]]) -> np.ndarray:
        """``(image, where)`` pairs, each a file or its encoded bytes, as one uint8 array of the images."""
        decoded = list(self.pool.map(lambda item: decode_image(item[0], item[1], self.options, self.decoding), images))
        for (_, where), image in zip(images, decoded, strict=True):
            self.first = self.first or (image.shape[-1], where)
            if image.shape[-1] != self.first[0]:
                raise BadInputError(
                    f"{where}: {image.shape[-1]} channels where {self.first[1]} has"
                    f" {self.first[0]}; leave out --keep-channels to convert them to RGB"
                )
        return np.stack(decoded)


def _weights(out_size: int, in_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output row (or column): the input rows below and above its centre and its weight of the upper."""
    scale = np.float32(in_size / out_size)
    centre = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    below = np.floor(centre)
    lower = np.maximum(below, 0).astype(np.intp)
    upper = np.minimum(np.ceil(centre), in_size - 1).astype(np.intp)
    return lower, upper, (centre - below).astype(np.float32)


def resize_bilinear(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """``(h, w, c)`` pixels resized to ``(height, width, c)`` float32 as ``tf.image.resize`` resizes them, and with
    it Keras's ``image_dataset_from_directory``: bilinear between the nearest pixel centres (half-pixel centres), with
    no antialiasing when shrinking (unlike Pillow's filters, which average every pixel a shrunk one covers)."""
    top, bottom, y = _weights(height, pixels.shape[0])
    left, right, x = _weights(width, pixels.shape[1])
    # the four neighbours of every output pixel, gathered before they become float32: a decoded image is never
    # copied whole, only the output's size four times
    top_left, top_right, bottom_left, bottom_right = (
        pixels[np.ix_(rows, columns)].astype(np.float32)
        for rows, columns in ((top, left), (top, right), (bottom, left), (bottom, right))
    )
    x = x[None, :, None]
    upper = top_left + (top_right - top_left) * x
    lower = bottom_left + (bottom_right - bottom_left) * x
    return upper + (lower - upper) * y[:, None, None]


class ImageFolderSource(Source):
    format = "images"

    def __init__(self, folder: Path, options: ImageOptions) -> None:
        super().__init__(str(folder))
        self.options = self.settings = options
        self.classes, self._files = class_files(folder)
        self.decoding = Decoding()

    def count(self) -> int:
        return len(self._files)

    def read(self, chunk_bytes: int) -> Iterator[Chunk]:
        height, width = self.settings.image_size
        rows = rows_per_chunk(height * width * 4, chunk_bytes)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            decoder = ImageDecoder(self.settings, self.decoding, pool)
            for start in range(0, len(self._files), rows):
                part = self._files[start : start + rows]
                yield (
                    decoder.stack([(path, str(path)) for path, _ in part]),
                    np.array([label for _, label in part], dtype=np.int32),
                )


FORMAT = Format(name="images", suffixes=SUFFIXES, options=ImageOptions, open=ImageFolderSource, class_folders=True)
