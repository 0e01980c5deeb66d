"""The held-out split is one rule by row index: the same rows put as an .npz, Parquet, CSV, TFRecord, an image folder
or Python batches (moto's S3) give the same test rows, exactly max(1, round(n·fraction)) of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import numpy as np
import pytest
from moto import mock_aws
from PIL import Image

from slsml.aws.storage import ObjectStore
from slsml.data import datasets as data
from slsml.data import ingest, sources

BUCKET = "slsml-unit-tests"


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[ObjectStore]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield ObjectStore(client, BUCKET)


def rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row i: its index as its feature, and its class (0, 1, 2 in order: the order of an image folder's classes)."""
    return np.arange(n, dtype=np.float32), np.arange(n) * 3 // n


def write_every_format(folder: Path, n: int) -> dict[str, Path]:
    """The same ``n`` rows in every format slsml reads, in the same order."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    import tensorflow as tf

    ids, labels = rows(n)
    np.savez(folder / "rows.npz", x=ids[:, None], y=labels)
    table = pa.table({"id": ids, "label": labels})
    pq.write_table(table, folder / "rows.parquet")
    pcsv.write_csv(table, folder / "rows.csv")
    with tf.io.TFRecordWriter(str(folder / "rows.tfrecord")) as writer:
        for i, label in zip(ids, labels, strict=True):
            features = {
                "id": tf.train.Feature(float_list=tf.train.FloatList(value=[i])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    for i, label in zip(ids.astype(int), labels, strict=True):  # the index as a 1×1 grey pixel
        (folder / "images" / f"c{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((1, 1), i, np.uint8), "L").save(folder / "images" / f"c{label}" / f"{i:03d}.png")
    return {
        "npz": folder / "rows.npz",
        "parquet": folder / "rows.parquet",
        "csv": folder / "rows.csv",
        "tfrecord": folder / "rows.tfrecord",
        "images": folder / "images",
    }


OPTIONS = {
    "parquet": {"label": "label"},
    "csv": {"label": "label"},
    "images": {"image_size": (1, 1), "grayscale": True},
}


@pytest.mark.parametrize(("n", "held"), [(178, 36), (100, 20), (3, 1)])
def test_the_same_rows_give_the_same_split_in_every_format(store: ObjectStore, tmp_path: Path, n: int, held: int):
    paths = write_every_format(tmp_path, n)
    expected = np.flatnonzero(ingest.held_out(0, n, 0.2, 7, n))
    assert len(expected) == held  # round(n·0.2), at least one
    for format, path in paths.items():
        source = sources.open_source(path, **OPTIONS.get(format, {}))
        manifest = ingest.put(store, f"rows-{format}", source, test_fraction=0.2, seed=7)
        assert (manifest.train.count, manifest.test.count) == (n - held, held), format
        reader = data.DatasetReader(store, manifest)
        for split, wanted in (("test", expected), ("train", np.setdiff1d(np.arange(n), expected))):
            x, y = reader.split(split)
            np.testing.assert_array_equal(np.asarray(x).reshape(-1), wanted, err_msg=f"{format} {split}")
            np.testing.assert_array_equal(y, rows(n)[1][wanted], err_msg=f"{format} {split}")


def test_batches_of_unknown_count_split_as_a_file_of_the_same_rows(store: ObjectStore, tmp_path: Path) -> None:
    n = 1000  # several blocks, the last one short, the batches cutting across them
    ids, labels = rows(n)
    np.savez(tmp_path / "rows.npz", x=ids[:, None], y=labels)
    from_file = ingest.put(store, "file", sources.open_source(tmp_path / "rows.npz"), test_fraction=0.15, seed=3)

    def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for start in range(0, n, 77):
            yield ids[start : start + 77, None], labels[start : start + 77]

    streamed = ingest.put(store, "batches", sources.from_python(batches()), test_fraction=0.15, seed=3)
    assert from_file.test.count == streamed.test.count == 150
    for split in ("train", "test"):
        np.testing.assert_array_equal(
            data.DatasetReader(store, from_file).split(split)[0], data.DatasetReader(store, streamed).split(split)[0]
        )


def test_each_whole_block_holds_out_its_share_and_the_split_depends_on_the_index_alone() -> None:
    whole = ingest.held_out(0, 5000, 0.2, seed=7, total=5000)
    pieces = np.concatenate([ingest.held_out(s, min(333, 5000 - s), 0.2, 7, 5000) for s in range(0, 5000, 333)])
    np.testing.assert_array_equal(whole, pieces)
    assert whole.sum() == 1000
    blocks = whole[: 5000 // ingest.SPLIT_BLOCK * ingest.SPLIT_BLOCK].reshape(-1, ingest.SPLIT_BLOCK).sum(axis=1)
    assert set(blocks) <= {25, 26}  # 128 · 0.2 = 25.6
    np.testing.assert_array_equal(whole[:4096], ingest.held_out(0, 4096, 0.2, 7, None))  # whole blocks: any total
    assert not np.array_equal(whole, ingest.held_out(0, 5000, 0.2, seed=8, total=5000))
