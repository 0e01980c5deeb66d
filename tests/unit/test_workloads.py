"""The generated sparse workloads (``slsml.bench.workloads``): stored a chunk at a time as a dataset that reads back
as the samples generated, the same for the same seed, labelled by their hidden model, and models that take them."""

from __future__ import annotations

import numpy as np
import pytest

from slsml.bench import workloads
from slsml.bench.workloads import BUCKETS, FIELDS, ITEMS, NOISE, USERS, Workload
from slsml.data.datasets import DatasetReader, load_manifest
from slsml.training import modelio


@pytest.mark.parametrize("name", workloads.NAMES)
def test_a_workload_is_stored_chunk_by_chunk_as_generated(store, monkeypatch, name) -> None:
    monkeypatch.setattr(workloads, "CHUNK", 100)  # three chunks of training samples
    workload = Workload(name, seed=2)
    manifest = workload.put(store, f"{name}-small", samples=250, test_samples=60)
    assert (manifest.train.count, manifest.test.count) == (250, 60)
    reader = DatasetReader(store, load_manifest(store, f"{name}-small"))
    for split, stream, count in (("train", 0, 250), ("test", 1, 60)):
        x, y = reader.take(split, np.arange(count))
        expected_x, expected_y = workload.arrays(count, stream)
        assert np.array_equal(y, expected_y)
        if isinstance(expected_x, dict):
            assert isinstance(x, dict) and all(np.array_equal(x[k], v) for k, v in expected_x.items())
        else:
            assert np.array_equal(x, expected_x)
    again, _ = Workload(name, seed=2).arrays(250)
    other, _ = Workload(name, seed=3).arrays(250)
    flat = lambda x: np.concatenate(list(x.values()), axis=1) if isinstance(x, dict) else x  # noqa: E731
    assert np.array_equal(flat(again), flat(workload.arrays(250)[0])) and not np.array_equal(flat(again), flat(other))


def test_criteo_samples_are_hashed_zipf_features_labelled_by_a_hidden_sparse_vector() -> None:
    workload = Workload("criteo")
    x, y = workload.arrays(2000)
    assert x.shape == (2000, FIELDS) and x.dtype == np.int32 and x.min() >= 0 and x.max() < BUCKETS
    (hidden,) = workload.hidden()
    assert 0.05 < (hidden != 0).mean() < 0.15
    assert np.array_equal(y[:, 0], (hidden[x].sum(axis=1) > 0).astype(np.float32))
    assert 0.3 < y.mean() < 0.7
    distinct = np.unique(x).size
    assert distinct < 0.5 * x.size  # skewed: common values repeat
    model = modelio.load_model(workload.model())
    assert model.predict(x[:8], verbose=0).shape == (8, 1)


def test_movielens_ratings_are_the_dot_of_hidden_factors_with_noise() -> None:
    workload = Workload("movielens")
    x, y = workload.arrays(2000)
    users, items = workload.hidden()
    assert users.shape[0] == USERS and items.shape[0] == ITEMS
    dot = (users[x["user"][:, 0]] * items[x["item"][:, 0]]).sum(axis=1)
    assert np.abs(y[:, 0] - dot).max() < 6 * NOISE and 0.5 < y.var() < 2
    model = modelio.load_model(workload.model())
    assert model.predict({k: v[:8] for k, v in x.items()}, verbose=0).shape == (8, 1)
