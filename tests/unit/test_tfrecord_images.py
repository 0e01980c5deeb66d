"""TFRecords of images, read from real files written with ``tf.io.TFRecordWriter``: TensorFlow's ImageNet layout
(JPEG and PNG files made with Pillow as ``image/encoded``, 1-based ``image/class/label``) decodes to the pixels and
labels Keras reads from the same files in class folders; raw pixels as a BytesList or an Int64List; features found
from the first record; bad records named by file and record, and nothing of them stored."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from slsml.aws.storage import ObjectStore
from slsml.data import catalog, ingest, sources
from slsml.spec import keys
from slsml.spec.errors import BadInputError

from .test_sources import read_all

SYNSETS = ("n01440764", "n01443537", "n01484850")  # ImageNet's first classes: labels 1, 2, 3


def example(**features: list[bytes] | list[int] | list[float]) -> bytes:
    """A serialized ``tf.train.Example`` of features given by name (``image__encoded`` names ``image/encoded``),
    each a BytesList, Int64List or FloatList by the type of its values."""
    import tensorflow as tf

    def feature(values: list) -> tf.train.Feature:
        if values and isinstance(values[0], bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if values and isinstance(values[0], int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    named = {name.replace("__", "/"): feature(values) for name, values in features.items()}
    return tf.train.Example(features=tf.train.Features(feature=named)).SerializeToString()


def imagenet_example(encoded: bytes, label: int, rng: np.random.Generator) -> bytes:
    """A record as TensorFlow's ImageNet conversion (``build_imagenet_data.py``) writes it: the encoded image, its
    1-based label and what else it stores beside them (format, class text and synset, size, bounding boxes)."""
    with Image.open(io.BytesIO(encoded)) as image:
        width, height, format = *image.size, image.format
    boxes = int(rng.integers(0, 3))  # 0 to 2 boxes: lists of differing lengths
    return example(
        image__encoded=[encoded],
        image__format=[format.encode()],
        image__class__label=[label],
        image__class__synset=[SYNSETS[label - 1].encode()],
        image__class__text=[b"tench, Tinca tinca"],
        image__height=[height],
        image__width=[width],
        image__colorspace=[b"RGB"],
        image__channels=[3],
        image__filename=[f"{label}.{format}".encode()],
        image__object__bbox__xmin=rng.random(boxes).tolist(),
        image__object__bbox__label=[label] * boxes,
    )


def with_image(record: bytes, encoded: bytes) -> bytes:
    """An ImageNet-layout record with its image replaced by ``encoded``."""
    import tensorflow as tf

    changed = tf.train.Example.FromString(record)
    changed.features.feature["image/encoded"].bytes_list.value[0] = encoded
    return changed.SerializeToString()


def write_records(path: Path, records: Iterable[bytes]) -> None:
    import tensorflow as tf

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def encoded(pixels: np.ndarray, format: str) -> bytes:
    data = io.BytesIO()
    Image.fromarray(pixels).save(data, format=format)
    return data.getvalue()


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Crops of scikit-learn's sample photographs, of several sizes, as JPEG and PNG files in ImageNet's class
    folders (one of them grayscale, converted to RGB as Keras converts it)."""
    from sklearn.datasets import load_sample_images

    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    pictures = load_sample_images().images
    for label, synset in enumerate(SYNSETS):
        (folder / synset).mkdir()
        for i in range(6):
            photo = pictures[(label + i) % 2]
            height, width = rng.integers(30, 90, 2)
            top, left = rng.integers(0, photo.shape[0] - height), rng.integers(0, photo.shape[1] - width)
            crop = photo[top : top + height, left : left + width]
            image = Image.fromarray(crop if (label, i) != (2, 3) else crop.mean(axis=2).astype(np.uint8))
            image.save(folder / synset / f"{i}.{'png' if i % 3 == 1 else 'jpg'}")
    return folder


def test_imagenet_shards_read_as_keras_reads_the_same_images_in_class_folders(photos: Path, tmp_path: Path) -> None:
    """Suffix-less shards (``train-00000-of-00002``) of ImageNet-layout records, in Keras's order of the class
    folders: the same labels less --label-offset 1, and the pixels of ``image_dataset_from_directory`` within the
    tolerance of the image-folder tests (0.5 for PNG, 4.5 for JPEG)."""
    import keras

    size = (24, 32)
    by_keras = keras.utils.image_dataset_from_directory(photos, image_size=size, shuffle=False, batch_size=None)
    keras_x = np.stack([pixels.numpy() for pixels, _ in by_keras])
    keras_y = np.array([int(label) for _, label in by_keras])
    files = [Path(file) for file in by_keras.file_paths]
    rng = np.random.default_rng(1)
    records = [
        imagenet_example(file.read_bytes(), int(label) + 1, rng) for file, label in zip(files, keras_y, strict=True)
    ]
    shards = tmp_path / "imagenet"
    write_records(shards / "train-00000-of-00002", records[:7])
    write_records(shards / "train-00001-of-00002", records[7:])
    (shards / "synsets.txt").write_text("\n".join(SYNSETS))  # beside the shards, not read

    assert sources.detect(shards).name == "tfrecord"  # by the shards' names, the synsets beside them
    source = sources.open_source(shards, image_size=size, label_offset=1)
    assert source.found == "image/encoded JPEG images, label image/class/label (int64)"
    x, y, chunks = read_all(source, chunk_bytes=24 * 32 * 4 * 5)
    assert chunks > 3 and x.dtype == np.uint8 and x.shape == keras_x.shape
    np.testing.assert_array_equal(y, keras_y)
    png = np.array([file.suffix == ".png" for file in files])
    assert np.abs(x[png] - keras_x[png]).max() <= 0.5
    assert np.abs(x[~png] - keras_x[~png]).max() <= 4 + 0.5
    assert np.abs(x[~png] - keras_x[~png]).max() > 0.5  # the JPEGs as Pillow decodes them: the bound is needed

    gray, y_gray, _ = read_all(sources.open_source(shards, format="tfrecord", image_size=size, grayscale=True), 1 << 20)
    assert gray.shape == (*keras_x.shape[:3], 1)
    np.testing.assert_array_equal(y_gray, keras_y + 1)  # without --label-offset, ImageNet's labels as they are
    one, _, _ = read_all(
        sources.open_source(shards / "train-00001-of-00002", format="tfrecord", image_size=size), 1 << 20
    )
    np.testing.assert_array_equal(one, x[7:])  # a file given is read whatever its name


def test_a_label_below_the_offset_and_a_corrupt_image_are_named_by_file_and_record(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    images = [encoded(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8), "JPEG") for _ in range(12)]
    labels = [3, 1, 2] * 4
    records = [imagenet_example(image, label, rng) for image, label in zip(images, labels, strict=True)]
    write_records(tmp_path / "a.tfrecord", records)
    write_records(tmp_path / "b.tfrecord", [*records[:9], imagenet_example(images[9], 0, rng), *records[10:]])
    with pytest.raises(
        BadInputError,
        match=r"b\.tfrecord, record 9: label 0 is below --label-offset 1; fix or leave out that record, then put",
    ):  # background
        read_all(sources.open_source(tmp_path, image_size=(8, 8), label_offset=1), 8 * 8 * 4 * 4)
    write_records(tmp_path / "b.tfrecord", [*records[:10], with_image(records[10], images[10][:100]), records[11]])
    with pytest.raises(BadInputError, match=r"^\S+/b\.tfrecord, record 10: not a decodable image \(.+\)$"):
        read_all(sources.open_source(tmp_path, image_size=(8, 8)), 8 * 8 * 4 * 4)


def test_raw_pixels_as_a_bytes_list_or_an_int64_list(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (40, 8, 8, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, 40)
    features = "image:uint8:8x8x1,label:int64:"
    write_records(
        tmp_path / "bytes.tfrecord",
        [example(image=[p.tobytes()], label=[int(y)]) for p, y in zip(pixels, labels, strict=True)],
    )
    write_records(
        tmp_path / "ints.tfrecord",
        [example(image=p.ravel().tolist(), label=[int(y)]) for p, y in zip(pixels, labels, strict=True)],
    )
    for file in ("bytes.tfrecord", "ints.tfrecord"):
        x, y, chunks = read_all(sources.open_source(tmp_path / file, tfrecord_features=features), 8 * 8 * 8 * 6)
        assert chunks > 3 and x.dtype == np.uint8
        np.testing.assert_array_equal(x, pixels)
        np.testing.assert_array_equal(y, labels)
    weights = rng.standard_normal((40, 3, 2)).astype(np.float32)
    write_records(tmp_path / "floats.tfrecord", [example(w=[w.tobytes()], label=[1]) for w in weights])
    x, _, _ = read_all(
        sources.open_source(tmp_path / "floats.tfrecord", tfrecord_features="w:float32:3x2,label:int64:"), 1 << 20
    )
    np.testing.assert_array_equal(x, weights)

    write_records(
        tmp_path / "short.tfrecord",
        [example(image=[p.tobytes()[: 64 - 8 * (i == 7)]], label=[1]) for i, p in enumerate(pixels)],
    )
    with pytest.raises(
        BadInputError,
        match=r"short\.tfrecord, record 7: feature image holds 56 bytes where uint8:8x8x1 is 64; fix or leave out",
    ):
        read_all(sources.open_source(tmp_path / "short.tfrecord", tfrecord_features=features), 1 << 20)
    records = [example(image=[p.tobytes()], label=[1]) for p in pixels]
    records[30] = example(image=pixels[30].ravel().tolist(), label=[1])
    write_records(tmp_path / "mixed.tfrecord", records)
    with pytest.raises(BadInputError, match=r"mixed\.tfrecord, record 30: feature image: Data types don't match"):
        read_all(sources.open_source(tmp_path / "mixed.tfrecord", tfrecord_features=features), 1 << 20)
    with pytest.raises(BadInputError, match=r"--image-size applies to encoded images; \S+bytes\.tfrecord is read as"):
        sources.open_source(tmp_path / "bytes.tfrecord", tfrecord_features=features, image_size=(4, 4))


def test_features_are_found_from_the_first_record(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    photos = [rng.integers(0, 256, (12, 16, 3), dtype=np.uint8) for _ in range(5)]
    write_records(
        tmp_path / "png.tfrecord",
        [example(name=[b"x.png"], png=[encoded(p, "PNG")], label=[i]) for i, p in enumerate(photos)],
    )
    source = sources.open_source(tmp_path / "png.tfrecord", image_size=(12, 16))
    assert source.found == "png PNG images, label label (int64)"
    x, y, _ = read_all(source, 1 << 20)
    np.testing.assert_array_equal(x, np.stack(photos))  # PNG at its own size: the pixels as they are
    np.testing.assert_array_equal(y, range(5))

    write_records(
        tmp_path / "numbers.tfrecord",
        [example(pixels=rng.random(15).tolist(), count=[i, 2 * i], text=[b"hi"], digit=[i % 3]) for i in range(9)],
    )
    source = sources.open_source(tmp_path / "numbers.tfrecord", label="digit")
    assert source.found == "count (int64 ×2), pixels (float ×15), label digit (int64)"
    x, y, _ = read_all(source, 1 << 20)
    assert x.shape == (9, 17) and x.dtype == np.float32
    np.testing.assert_array_equal(x[:, :2], [[i, 2 * i] for i in range(9)])
    np.testing.assert_array_equal(y, np.arange(9) % 3)
    with pytest.raises(
        BadInputError,
        match=r"record 0: no feature label for the labels \(it has count, digit, pixels, text\); name one with --label",
    ):
        sources.open_source(tmp_path / "numbers.tfrecord")
    with pytest.raises(BadInputError, match=r"--label text: a feature of numbers, not of bytes"):
        sources.open_source(tmp_path / "numbers.tfrecord", label="text")

    write_records(
        tmp_path / "two.tfrecord", [example(a=[encoded(p, "PNG")], b=[encoded(p, "JPEG")], label=[1]) for p in photos]
    )
    with pytest.raises(
        BadInputError,
        match=r"features a, b all hold images: declare the one to read with --tfrecord-features NAME:image:,label:int",
    ):
        sources.open_source(tmp_path / "two.tfrecord")
    x, _, _ = read_all(
        sources.open_source(tmp_path / "two.tfrecord", tfrecord_features="b:image:,label:int64:", image_size=(12, 16)),
        1 << 20,
    )
    assert x.shape == (5, 12, 16, 3) and np.abs(x.astype(int) - np.stack(photos)).mean() > 1  # the JPEGs, not the PNGs
    assert sources.open_source(tmp_path / "two.tfrecord", tfrecord_features="b:image:,label:int64:").found is None


def test_a_bad_record_stops_the_upload_with_nothing_visible(store: ObjectStore, tmp_path: Path) -> None:
    """Records of 256×256 images (the default --image-size) come 64 to a 16 MB chunk, and a file's records are split
    a block of 128 at a time: a record past the first block's is bad after shards went up, and no manifest is
    written."""
    rng = np.random.default_rng(5)
    images = [encoded(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), "JPEG") for _ in range(200)]
    records = [imagenet_example(image, 1 + i % 2, rng) for i, image in enumerate(images)]
    write_records(tmp_path / "good" / "train-00000-of-00001", records)
    records[190] = with_image(records[190], b"\xff\xd8 not a JPEG")
    write_records(tmp_path / "bad" / "train-00000-of-00001", records)

    manifest = ingest.put(
        store, "good", sources.open_source(tmp_path / "good", format="tfrecord", label_offset=1), shard_mb=0.5
    )
    assert manifest.train.count + manifest.test.count == 200
    with pytest.raises(
        BadInputError, match=r"train-00000-of-00001, record 190: not a decodable image \(cannot identify"
    ):
        ingest.put(store, "bad", sources.open_source(tmp_path / "bad", format="tfrecord", label_offset=1), shard_mb=0.5)
    assert store.list_keys("datasets/bad/")  # the first block's shards went up
    assert not store.exists(keys.dataset_manifest("bad")) and [d["name"] for d in catalog.listing(store)] == ["good"]
