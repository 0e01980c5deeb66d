"""Datasets a user manages, driven as a user would against `slsml local up`: real JPEGs (crops of scikit-learn's
sample photos) in class folders go through `slsml data put … --image-size 32,32` with the labels Keras gives
the folder, a CNN trains on them with `run start --local --data NAME`; `data list`, `data show`, `data rm`; a
`.npz` given twice is recognised by its content; bad input is named and leaves nothing visible."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from slsml.training import modelio

from .service import last_json, local_service, service_store, slsml

CROPS = 160  # per photo


def write_crops(folder: Path) -> None:
    """Random 48×48 crops of each of scikit-learn's sample photos as JPEGs, a class folder per photo."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images()
    rng = np.random.default_rng(0)
    for name, photo in zip(photos.filenames, photos.images, strict=True):
        (folder / Path(name).stem).mkdir(parents=True)
        for i in range(CROPS):
            top, left = rng.integers(0, photo.shape[0] - 48), rng.integers(0, photo.shape[1] - 48)
            Image.fromarray(photo[top : top + 48, left : left + 48]).save(folder / Path(name).stem / f"{i:03d}.jpg")


def cnn() -> bytes:
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return modelio.save_model(model)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("ingest")
    (home / "cnn.keras").write_bytes(cnn())
    with local_service(home):
        yield home


def test_jpegs_in_class_folders_get_keras_labels_and_train_a_cnn(service: Path) -> None:
    import keras

    from slsml.data import datasets as data
    from slsml.data import ingest

    write_crops(service / "photos")
    put = last_json(slsml(service, "data", "put", "photos", "photos", "--image-size", "32,32", "--json"))
    assert put["format"] == "images" and put["class_names"] == ["china", "flower"]
    assert put["train"] + put["test"] == 2 * CROPS
    shown = last_json(slsml(service, "data", "show", "photos", "--json"))
    assert shown == put
    store = service_store(service)
    manifest = data.load_manifest(store, "photos")
    x, y = data.DatasetReader(store, manifest).split("train")
    assert x.shape[1:] == (32, 32, 3) and x.dtype == np.uint8
    keras_set = keras.utils.image_dataset_from_directory(
        service / "photos", image_size=(32, 32), shuffle=False, batch_size=None
    )
    keras_labels = np.array([int(label) for _, label in keras_set])
    held_out = ingest.held_out(0, 2 * CROPS, 0.2, seed=0, total=2 * CROPS)  # data put's defaults
    np.testing.assert_array_equal(y, keras_labels[~held_out])

    summary = last_json(
        slsml(
            service,
            "run",
            "start",
            "--local",
            "--model",
            "cnn.keras",
            "--data",
            "photos",
            "--iterations",
            "60",
            "--batch",
            "32",
            "--workers",
            "2",
            "--eval-every",
            "60",
            "--json",
        )
    )
    # Keras fit reaches 0.98 after 40 steps of this batch
    assert summary["status"] == "COMPLETED" and summary["test_accuracy"] >= 0.9, summary


def test_a_file_given_twice_is_recognised_and_a_dataset_in_use_is_not_removed(service: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez(
        service / "wine.npz", x=rng.standard_normal((300, 32, 32, 3)).astype(np.float32), y=rng.integers(0, 2, 300)
    )
    start = (
        "run",
        "start",
        "--local",
        "--model",
        "cnn.keras",
        "--data",
        "wine.npz",
        "--iterations",
        "500",
        "--batch",
        "16",
        "--workers",
        "1",
        "--reducers",
        "1",
        "--eval-every",
        "0",
        "--no-wait",
    )  # runs that go on until stopped: one worker and one reducer, no evaluation, hold the machine least
    first = slsml(service, *start)
    assert first.returncode == 0, first.stderr
    again = slsml(service, *start)
    assert again.returncode == 0, again.stderr
    assert "wine.npz is dataset wine already (same content)" in again.stderr
    refused = slsml(service, "data", "rm", "wine")
    assert refused.returncode == 2
    assert f"dataset 'wine' is in use by run {first.stdout.strip()}, {again.stdout.strip()}" in refused.stderr
    for run in (first, again):
        assert slsml(service, "run", "stop", run.stdout.strip()).returncode == 0
    np.savez(service / "wine.npz", x=np.zeros((40, 32, 32, 3), np.float32), y=np.arange(40) % 2)  # other data
    other = slsml(service, *start)
    assert other.returncode == 2 and "dataset 'wine' already exists and holds other data" in other.stderr
    named = slsml(service, *start, "--dataset", "wine-zeros")
    assert named.returncode == 0, named.stderr
    assert slsml(service, "run", "stop", named.stdout.strip()).returncode == 0
    assert {d["name"] for d in last_json(slsml(service, "data", "list", "--json"))} >= {"wine", "wine-zeros"}
    stopped = f"{first.stdout.strip()}, {again.stdout.strip()}"
    kept = slsml(service, "data", "rm", "wine")  # the stopped runs would resume on it
    assert kept.returncode == 2
    assert f"dataset 'wine' is the one run {stopped} would resume on (`slsml run resume`)" in kept.stderr
    assert "`slsml data rm wine --force`" in kept.stderr
    assert "wine" in {d["name"] for d in last_json(slsml(service, "data", "list", "--json"))}
    removed = slsml(service, "data", "rm", "wine", "--force")
    assert removed.returncode == 0, removed.stderr
    assert "wine" not in {d["name"] for d in last_json(slsml(service, "data", "list", "--json"))}
    assert slsml(service, "data", "show", "wine").returncode == 2


def test_a_corrupt_image_is_named_and_nothing_is_visible(service: Path) -> None:
    write_crops(service / "broken")
    victim = service / "broken" / "flower" / "150.jpg"
    victim.write_bytes(victim.read_bytes()[:200])
    put = slsml(service, "data", "put", "broken", "broken", "--image-size", "32,32")
    assert put.returncode == 2
    assert put.stderr.strip().splitlines()[-1].startswith(f"error: {Path('broken/flower/150.jpg')}: not a readable")
    assert "broken" not in {d["name"] for d in last_json(slsml(service, "data", "list", "--json"))}
