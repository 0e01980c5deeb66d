"""A folder of images in class subfolders, read as ``keras.utils.image_dataset_from_directory`` reads it: the
classes are the sorted names of the folder's subfolders (hidden ones left out), label i the i-th; each class's
images are the files under its subfolder, at any depth, walked in sorted order. Images are decoded with Pillow
(JPEG, PNG, BMP, GIF's first frame, WebP) and resized bilinearly to ``image_size``, stored as uint8."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from PIL import Image
from pydantic import BeforeValidator, Field, PositiveInt

from slsml.data.sources.base import Chunk, Format, Source, SourceOptions, comma_list, rows_per_chunk
from slsml.spec.errors import BadInputError

SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".webp")  # Keras's, and WebP
MODES = {"rgb": "RGB", "grayscale": "L", "rgba": "RGBA"}  # --color-mode → the Pillow mode converted to
KEPT = {"1": "L", "L": "L", "LA": "LA", "RGB": "RGB", "RGBA": "RGBA"}  # color mode keep: a file's mode → the one stored


class ImageOptions(SourceOptions):
    image_size: Annotated[tuple[PositiveInt, PositiveInt], BeforeValidator(comma_list)] = Field(
        default=(256, 256), description="images: the height,width every image is resized to (bilinear)")
    color_mode: Literal["rgb", "grayscale", "rgba", "keep"] = Field(
        default="rgb", description="images: convert each to 3 channels (rgb), 1 (grayscale), 4 (rgba), or keep the"
        " channels the files have (all must have as many)")


def class_files(folder: Path) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    """The class names and every image file with its label, in Keras's order."""
    if not folder.is_dir():
        raise BadInputError(f"{folder} is not a folder of class subfolders")
    classes = tuple(sorted(entry.name for entry in os.scandir(folder) if entry.is_dir() and
                           not entry.name.startswith(".")))
    if not classes:
        raise BadInputError(f"{folder}: no class subfolders (images go in one subfolder per class)")
    files = []
    for label, name in enumerate(classes):
        found = [Path(root, file) for root, _, names in sorted(os.walk(folder / name), key=lambda walk: walk[0])
                 for file in sorted(names) if file.lower().endswith(SUFFIXES)]
        if not found:
            raise BadInputError(f"{folder / name}: class folder without images ({', '.join(SUFFIXES)})")
        files += [(path, label) for path in found]
    return classes, files


def decode(path: Path, options: ImageOptions) -> np.ndarray:
    """One image as a ``(height, width, channels)`` uint8 array."""
    try:
        with Image.open(path) as image:
            image.load()
            if options.color_mode != "keep":
                image = image.convert(MODES[options.color_mode])
            elif image.mode == "P":
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            elif image.mode in KEPT:
                image = image.convert(KEPT[image.mode])
            else:
                raise BadInputError(f"{path}: images of mode {image.mode} cannot be kept as they are")
            height, width = options.image_size
            pixels = np.asarray(image.resize((width, height), Image.Resampling.BILINEAR))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise BadInputError(f"{path}: not a readable image ({error})") from None
    if pixels.dtype != np.uint8:
        raise BadInputError(f"{path}: {pixels.dtype} pixels; slsml reads 8-bit images")
    return pixels.reshape(height, width, -1)


class ImageFolderSource(Source):
    format = "images"

    def __init__(self, folder: Path, options: ImageOptions) -> None:
        super().__init__(str(folder))
        self.options = options
        self.classes, self._files = class_files(folder)

    def count(self) -> int:
        return len(self._files)

    def read(self, chunk_bytes: int) -> Iterator[Chunk]:
        height, width = self.options.image_size
        rows = rows_per_chunk(height * width * 4, chunk_bytes)
        channels: tuple[int, Path] | None = None
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # Pillow decodes without the GIL
            for start in range(0, len(self._files), rows):
                part = self._files[start : start + rows]
                images = list(pool.map(lambda item: decode(item[0], self.options), part))
                for (path, _), image in zip(part, images, strict=True):
                    channels = channels or (image.shape[-1], path)
                    if image.shape[-1] != channels[0]:
                        raise BadInputError(f"{path}: {image.shape[-1]} channels where {channels[1]} has"
                                            f" {channels[0]}; convert them with --color-mode rgb, grayscale or rgba")
                yield np.stack(images), np.array([label for _, label in part], dtype=np.int32)


FORMAT = Format(name="images", suffixes=SUFFIXES, options=ImageOptions, open=ImageFolderSource, class_folders=True)
