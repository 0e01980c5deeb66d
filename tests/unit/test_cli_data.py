"""`slsml data put`'s format flags: one per field of each format's options, refused for a source of another format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from slsml.cli import data
from slsml.cli import main as cli
from slsml.data import sources
from slsml.spec.errors import BadInputError


def test_every_formats_options_are_flags_and_another_formats_are_refused(tmp_path: Path) -> None:
    (tmp_path / "cats").mkdir()
    Image.fromarray(np.zeros((9, 7, 3), np.uint8)).save(tmp_path / "cats" / "a.png")
    parser = cli.build_parser()
    put = ("data", "put", "pets", str(tmp_path))
    flags = {name for format in sources.FORMATS.values() for name in format.options.model_fields}
    assert {"image_size", "grayscale", "label", "features", "tfrecord_features", "labels_file"} <= flags
    source = data._source(parser.parse_args([*put, "--image-size", "5,4", "--grayscale"]))
    assert (source.format, source.classes, source.count()) == ("images", ("cats",), 1)
    x, y = next(source.chunks())
    assert x.shape == (1, 5, 4, 1) and y.tolist() == [0]
    with pytest.raises(BadInputError, match=r"--label does not apply to .*, a source of format images"):
        data._source(parser.parse_args([*put, "--label", "kind"]))
    with pytest.raises(BadInputError, match="image_size"):
        data._source(parser.parse_args([*put, "--image-size", "5,0"]))
    chosen = data._source(parser.parse_args([*put, "--format", "images"]))
    assert chosen.options.image_size == (256, 256)  # the field's default


def test_a_dataset_is_shown_whole_on_a_narrow_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from slsml.cli import display_data

    monkeypatch.setenv("COLUMNS", "40")
    checksum = "0123456789abcdef" * 4
    display_data.print_dataset(
        {
            "name": "pets",
            "format": "images",
            "train": 1200,
            "test": 300,
            "x_shape": [32, 32, 3],
            "x_dtype": "uint8",
            "y_shape": [],
            "y_dtype": "int32",
            "classes": 2,
            "class_names": ["cats", "dogs"],
            "bytes": 3_690_000,
            "shards": 2,
            "sha256": checksum,
        }
    )
    shown = capsys.readouterr().out
    assert "1,200 train, 300 test" in shown and "2: cats, dogs" in shown and "3.7 MB in 2 shards" in shown
    assert checksum in "".join(part.strip() for part in shown.split("source sha256")[1].splitlines())


def test_a_dataset_of_named_arrays_shows_each_array(
    store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from slsml.cli import display_data
    from slsml.data import catalog
    from slsml.data import datasets as stored

    monkeypatch.setenv("COLUMNS", "200")
    x, y = {"pixels": np.zeros((3, 2, 2), np.float32), "extra": np.zeros(3, np.int64)}, np.zeros(3, np.int64)
    summary = catalog.summary(stored.put_dataset(store, "named", x, y, x, y))
    assert (summary["x_shape"], summary["x_dtype"]) == (
        {"pixels": [2, 2], "extra": []},
        {"pixels": "float32", "extra": "int64"},
    )
    display_data.print_dataset(summary)
    assert "pixels float32[2,2], extra int64[]" in capsys.readouterr().out
