"""Data sources read real files (arrays, images, Parquet, CSV, TFRecord) as bounded, checked (x, y) chunks."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from slsml.data import sources
from slsml.data.sources import images
from slsml.spec.errors import BadInputError

CHUNK = 4096  # bytes: small enough that every source here comes in several chunks


def read_all(source: sources.Source, chunk_bytes: int = CHUNK) -> tuple[np.ndarray, np.ndarray, int]:
    """The source's samples, concatenated, and how many chunks they came in; each chunk within the bound."""
    xs, ys = [], []
    for x, y in source.chunks(chunk_bytes):
        assert x.nbytes + y.nbytes <= max(chunk_bytes, x[:1].nbytes + y[:1].nbytes)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys), len(xs)


def samples(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 5, 3)).astype(np.float32), rng.integers(0, 4, n)


# ---- arrays ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_an_npz_is_read_in_chunks_with_its_test_part(tmp_path: Path, save) -> None:
    x, y = samples(300)
    save(tmp_path / "d.npz", x=x[:250], y=y[:250], x_test=x[250:], y_test=y[250:])
    source = sources.open_source(tmp_path / "d.npz")
    assert source.format == "arrays" and source.count() == 250
    got_x, got_y, chunks = read_all(source)
    assert chunks > 3
    np.testing.assert_array_equal(got_x, x[:250])
    np.testing.assert_array_equal(got_y, y[:250])
    test_x, test_y, _ = read_all(source.test)
    np.testing.assert_array_equal(test_x, x[250:])
    np.testing.assert_array_equal(test_y, y[250:])


@pytest.mark.parametrize(("save", "mapped"), [(np.save, True), (np.savez, True), (np.savez_compressed, False)])
def test_arrays_stored_as_they_are_are_memory_mapped_a_block_at_a_time(tmp_path: Path, save, mapped: bool) -> None:
    x, y = samples(300)
    if save is np.save:
        np.save(tmp_path / "d.npy", x)
        np.save(tmp_path / "y.npy", y)
        source = sources.open_source(tmp_path / "d.npy", labels_file=tmp_path / "y.npy")
    else:
        save(tmp_path / "d.npz", x=x, y=y)
        source = sources.open_source(tmp_path / "d.npz")
    blocks = list(source.read(CHUNK))
    assert len(blocks) > 3 and all(isinstance(b, np.memmap) == mapped for block in blocks for b in block)
    assert all(b.nbytes <= CHUNK for block in blocks for b in block)  # one block mapped at a time, not the file
    np.testing.assert_array_equal(np.concatenate([b[0] for b in blocks]), x)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in blocks]), y)


def test_an_npy_takes_its_labels_from_another_file_and_a_truncated_one_is_named(tmp_path: Path) -> None:
    x, y = samples(100)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    got_x, got_y, _ = read_all(sources.open_source(tmp_path / "x.npy", labels_file=tmp_path / "y.npy"))
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    with pytest.raises(BadInputError, match="--labels-file"):
        sources.open_source(tmp_path / "x.npy")
    body = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(body[: len(body) - 100])
    with pytest.raises(BadInputError, match=r"x\.npy is truncated: it ends within sample 98 of 100"):
        read_all(sources.open_source(tmp_path / "x.npy", labels_file=tmp_path / "y.npy"))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y[:99])
    with pytest.raises(BadInputError, match="x has 100 samples but y has 99"):
        sources.open_source(tmp_path / "x.npy", labels_file=tmp_path / "y.npy")


def test_arrays_batches_and_a_tf_dataset_from_python() -> None:
    import tensorflow as tf

    x, y = samples(200)
    dataset = sources.from_python(tf.data.Dataset.from_tensor_slices((x, y)).batch(64))
    for source in (
        sources.from_python(x, y),
        sources.from_python(iter([(x[:70], y[:70]), (x[70:], y[70:])])),
        dataset,
        dataset,  # read anew, from the start: an interrupted ingest of it continues
    ):
        got_x, got_y, _ = read_all(source)
        np.testing.assert_array_equal(got_x, x)
        np.testing.assert_array_equal(got_y, y)
    with pytest.raises(BadInputError, match=r"the \(x, y\) batches \(samples 70–\d+\): samples of x \(5, 2\)"):
        read_all(sources.from_python([(x[:70], y[:70]), (x[70:, :, :2], y[70:])]))
    x[150, 1, 1] = np.nan
    with pytest.raises(BadInputError, match=r"the arrays \(samples \d+–\d+\): x contains NaN"):
        read_all(sources.from_python(x, y))


# ---- images ---------------------------------------------------------------------------------------


def write_images(folder: Path, classes: dict[str, list[str]], seed: int = 0) -> None:
    """Random images, one per file name, in class subfolders (a file's suffix picks its format)."""
    rng = np.random.default_rng(seed)
    for name, files in classes.items():
        (folder / name).mkdir(parents=True)
        for file in files:
            pixels = rng.integers(0, 256, (rng.integers(20, 40), rng.integers(20, 40), 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / name / file)


def test_images_get_keras_labels_and_every_format_decodes(tmp_path: Path) -> None:
    import keras

    write_images(
        tmp_path / "keras",
        {"zebra": ["b.jpg", "a.png", "c.bmp"], "ant": ["x.gif", "y.JPEG"], "cat": ["k.png", "j.jpg", "l.gif"]},
    )
    (tmp_path / "keras" / "cat" / "deeper").mkdir()
    Image.new("RGB", (25, 30), "red").save(tmp_path / "keras" / "cat" / "deeper" / "a.png")
    (tmp_path / "keras" / "notes.txt").write_text("not a class")
    source = sources.open_source(tmp_path / "keras", image_size=(12, 10))
    x, y, chunks = read_all(source)
    assert chunks > 1 and x.shape == (9, 12, 10, 3) and x.dtype == np.uint8
    keras_set = keras.utils.image_dataset_from_directory(
        tmp_path / "keras", image_size=(12, 10), shuffle=False, batch_size=None
    )
    assert source.classes == tuple(keras_set.class_names) == ("ant", "cat", "zebra")
    np.testing.assert_array_equal(y, [int(label) for _, label in keras_set])
    assert np.array_equal(x[5], np.full((12, 10, 3), [255, 0, 0]))  # cat/deeper/a.png, a solid red
    write_images(tmp_path / "webp", {"a": ["1.webp"], "b": ["2.webp", "3.webp"]})
    x, y, _ = read_all(sources.open_source(tmp_path / "webp", image_size="8,6", grayscale=True))
    assert x.shape == (3, 8, 6, 1)
    np.testing.assert_array_equal(y, [0, 1, 1])


def test_the_images_decoded_at_once_hold_no_more_pixels_than_the_limit(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for i in range(8):  # photos of 3 million pixels: numpy's copy of each (9 MB) is traced, Pillow's memory is not
        (tmp_path / "big" / str(i % 2)).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (1500, 2000, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "big" / str(i % 2) / f"{i}.jpg", quality=70)
    source = sources.open_source(tmp_path / "big", image_size=(8, 8))
    assert isinstance(source, images.ImageFolderSource)

    def read(limit: int) -> tuple[np.ndarray, int]:
        """The samples, read with the pool's threads decoding at most ``limit`` pixels at once, and the traced
        peak."""
        source.decoding = images.Decoding(limit)
        tracemalloc.start()
        try:
            x, _, _ = read_all(source)
            return x, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            assert source.decoding.held == 0

    image_bytes = 1500 * 2000 * 3  # a decode holds twice that in traced memory: Pillow's bytes and numpy's array
    one, peak = read(1500 * 2000)
    assert peak < 2.5 * image_bytes, "one image decoded at a time"
    alone, peak = read(1)  # an image larger than the limit is decoded alone, not kept waiting
    assert peak < 2.5 * image_bytes and np.array_equal(alone, one)
    assert np.array_equal(read(images.DECODING_PIXELS)[0], one)  # (threads decoding at once peaked at 4×)


def test_images_are_resized_as_keras_resizes_them(tmp_path: Path) -> None:
    """Real photographs (scikit-learn's sample images), shrunk to 24×32 and stretched to 96×120: the stored uint8
    pixels are Keras's float pixels rounded (within 0.5) for PNG; for JPEG within the 4 levels more by which
    TensorFlow's fast integer transform decodes it otherwise than Pillow, and within 0.5 of TensorFlow's own resize
    of the same accurate decode."""
    import keras
    import tensorflow as tf
    from sklearn.datasets import load_sample_images

    for number, photo in enumerate(load_sample_images().images):
        for suffix in ("png", "jpg"):
            (tmp_path / suffix).mkdir(exist_ok=True)
            Image.fromarray(photo[::6, ::6]).save(tmp_path / suffix / f"{number}.{suffix}")  # 72×107
    for size in ((24, 32), (96, 120)):
        x, y, _ = read_all(sources.open_source(tmp_path, image_size=size), chunk_bytes=1 << 20)
        by_keras = keras.utils.image_dataset_from_directory(tmp_path, image_size=size, shuffle=False, batch_size=None)
        keras_x = np.stack([pixels.numpy() for pixels, _ in by_keras])
        assert x.dtype == np.uint8 and x.shape == keras_x.shape
        jpg, png = y == 0, y == 1  # the classes, sorted
        assert np.abs(x[png] - keras_x[png]).max() <= 0.5, size
        assert np.abs(x[jpg] - keras_x[jpg]).max() <= 4 + 0.5, size
        accurate = [
            tf.image.resize(tf.io.decode_jpeg(file.read_bytes(), channels=3, dct_method="INTEGER_ACCURATE"), size)
            for file in sorted((tmp_path / "jpg").iterdir())
        ]
        assert np.abs(x[jpg] - np.stack(accurate)).max() <= 0.5 + 1e-3, size


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda f: (f / "b" / "2.jpg").write_bytes((f / "b" / "2.jpg").read_bytes()[:300]),
            r"b/2\.jpg: not a readable",
        ),
        (lambda f: (f / "a" / "1.png").write_bytes(b"\x89PNG but not really"), r"a/1\.png: not a readable image"),
        (lambda f: Image.new("L", (30, 30)).save(f / "b" / "4.png"), r"b/4\.png: 1 channels where .*a/1\.png has 3;"),
        (lambda f: (f / "c").mkdir(), r"/c: class folder without images"),
    ],
)
def test_bad_images_are_named(tmp_path: Path, damage, message: str) -> None:
    write_images(tmp_path, {"a": ["1.png"], "b": ["2.jpg", "3.png"]})
    damage(tmp_path)
    with pytest.raises(BadInputError, match=message):
        read_all(sources.open_source(tmp_path, image_size=(16, 16), keep_channels=True))


# ---- tables ---------------------------------------------------------------------------------------


def table(n: int = 500):
    import pyarrow as pa

    rng = np.random.default_rng(3)
    return pa.table(
        {
            "a": rng.standard_normal(n),
            "name": [f"n{i}" for i in range(n)],
            "b": rng.integers(0, 9, n),
            "label": rng.integers(0, 3, n),
            "c": rng.standard_normal(n).astype(np.float32),
        }
    )


@pytest.mark.parametrize("format", ["parquet", "csv"])
def test_tables_read_in_batches_with_default_and_chosen_features(tmp_path: Path, format: str) -> None:
    import pyarrow.csv as csv
    import pyarrow.parquet as pq

    data = table()
    folder = tmp_path / "t"
    folder.mkdir()
    for part, start in enumerate(range(0, 500, 200)):  # a folder of three files
        path = folder / f"part-{part}.{format}"
        (pq.write_table if format == "parquet" else csv.write_csv)(data.slice(start, 200), str(path))
    (folder / "_SUCCESS").touch()  # what Spark leaves beside its tables, and a hidden copy: neither is read
    (folder / f".part-0.{format}").write_bytes(b"not a table")
    assert sources.detect(folder).name == format
    x, y, chunks = read_all(sources.open_source(folder, label="label"), chunk_bytes=1024)
    assert chunks > 3 and x.dtype == np.float32 and x.shape == (500, 3)
    expected = np.stack([data[c].to_numpy() for c in ("a", "b", "c")], axis=1).astype(np.float32)
    np.testing.assert_allclose(x, expected, rtol=1e-6)
    np.testing.assert_array_equal(y, data["label"].to_numpy())
    x, _, _ = read_all(sources.open_source(folder, label="label", features="c,a"))
    np.testing.assert_allclose(x, expected[:, [2, 0]], rtol=1e-6)
    with pytest.raises(BadInputError, match=r"t: no column 'd' \(it has a, name, b, label, c\)"):
        sources.open_source(folder, label="label", features="a,d")
    with pytest.raises(BadInputError, match=r"t: column 'name' is string, not numeric"):
        sources.open_source(folder, label="label", features="a,name")
    with pytest.raises(BadInputError, match=r"column 'klass'"):
        sources.open_source(folder, label="klass")
    with pytest.raises(BadInputError) as unlabelled:  # no --label: the columns it could be
        sources.open_source(folder)
    assert str(unlabelled.value) == (
        f"{folder}: which column holds the labels? give it as --label COLUMN (it has a, name, b, label, c)"
    )
    named = list(sources.open_source(folder, label="label", features="wide=c,a; deep=b").chunks())
    x = {name: np.concatenate([chunk[0][name] for chunk in named]) for name in ("wide", "deep")}
    np.testing.assert_allclose(x["wide"], expected[:, [2, 0]], rtol=1e-6)
    np.testing.assert_allclose(x["deep"], expected[:, [1]], rtol=1e-6)
    with pytest.raises(BadInputError, match=r"t: no column 'd'"):
        sources.open_source(folder, label="label", features="wide=a;deep=d")
    with pytest.raises(BadInputError, match=r"'deep' is not NAME=COLUMN"):
        sources.open_source(folder, label="label", features="wide=a;deep")


# ---- TFRecord -------------------------------------------------------------------------------------


def write_tfrecord(path: Path, x: np.ndarray, y: np.ndarray, skip_label_at: int | None = None) -> None:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, (xi, yi) in enumerate(zip(x, y, strict=True)):
            feature = {"pixels": tf.train.Feature(float_list=tf.train.FloatList(value=xi.ravel()))}
            if i != skip_label_at:
                feature["digit"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[yi]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_tfrecord_examples_are_parsed_by_their_feature_spec(tmp_path: Path) -> None:
    x, y = samples(300)
    write_tfrecord(tmp_path / "a.tfrecord", x[:120], y[:120])
    write_tfrecord(tmp_path / "b.tfrecord", x[120:], y[120:])
    features = "pixels:float32:5x3,digit:int64:"
    got_x, got_y, chunks = read_all(sources.open_source(tmp_path, label="digit", tfrecord_features=features))
    assert chunks > 2
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    write_tfrecord(tmp_path / "b.tfrecord", x[120:], y[120:], skip_label_at=37)
    with pytest.raises(BadInputError, match=r"b\.tfrecord, record 37: feature digit.* is required"):
        read_all(sources.open_source(tmp_path, label="digit", tfrecord_features=features))
    with pytest.raises(BadInputError, match="is not name:dtype:shape"):
        sources.open_source(tmp_path, label="digit", tfrecord_features="pixels:float32:5,3")


def test_a_source_is_detected_by_its_files(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    assert sources.detect(tmp_path / "t.csv").name == "csv"
    with pytest.raises(BadInputError, match=r"t\.txt: not a format slsml reads"):
        (tmp_path / "t.txt").write_text("hello")
        sources.detect(tmp_path / "t.txt")
