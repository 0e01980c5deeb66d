"""The two sparse reference workloads (MLLess's), generated here, no download:

- ``criteo``: logistic regression on hashed sparse features (Criteo-like). A sample is ``FIELDS`` = 40 categorical
  fields, each value drawn from a Zipf law (s = ``ZIPF``: a few values are common, most rare, as in click logs) and
  hashed with its field into one of ``BUCKETS`` = 2^20 buckets; its label is 1 where the sum of a hidden sparse weight
  vector (a tenth of the buckets nonzero, N(0, 1)) over its buckets is positive. The model is
  ``Embedding(2^20, 1)`` averaged over the fields, then ``Dense(1, sigmoid)`` (a scale and a bias): logistic
  regression on the buckets, 2^20 + 2 weights.
- ``movielens``: matrix factorization (MovieLens-like, ``USERS`` × ``ITEMS`` as MovieLens 1M). A sample is a (user,
  item) pair, uniform, rated by the dot of hidden rank-``RANK`` factors plus noise; the model is two
  ``Embedding(·, WIDTH)`` tables, user and item, and their dot, trained on the mean squared error.

A round of either touches a few rows of its large tables: ``compress sparse`` sends those alone
(``slsml.training.updates``). Samples are generated ``CHUNK`` at a time from a seed (the same seed, the same data)
and stored with ``DatasetWriter`` as they come, so that memory holds one chunk whatever the size."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from slsml.aws.storage import ObjectStore
from slsml.data.manifest import DatasetManifest
from slsml.data.writer import DatasetWriter
from slsml.spec.samples import Arrays
from slsml.training import modelio

Name = Literal["criteo", "movielens"]
NAMES: tuple[Name, ...] = ("criteo", "movielens")
BUCKETS, FIELDS, ZIPF, DENSITY = 2**20, 40, 1.3, 0.1
USERS, ITEMS, RANK, WIDTH, NOISE = 6040, 3706, 8, 16, 0.1
LEARNING_RATES: dict[Name, float] = {"criteo": 0.1, "movielens": 0.01}  # Adam's, as the model is compiled
CHUNK = 65_536
_HASH = (2_654_435_761, 40_503)  # Knuth's multiplicative constants: field and value into a bucket


@dataclass(frozen=True)
class Workload:
    """One generated workload: its data from ``seed`` and its compiled Keras model (``seed``: its initial weights)."""

    name: Name
    seed: int = 0

    def hidden(self) -> tuple[np.ndarray, ...]:
        """What the labels are drawn from: criteo's weight vector, movielens's user and item factors."""
        rng = np.random.default_rng([self.seed, 1])
        if self.name == "criteo":
            return ((rng.standard_normal(BUCKETS) * (rng.random(BUCKETS) < DENSITY)).astype(np.float32),)
        scale = 1 / np.sqrt(np.sqrt(RANK))  # a rating's dot has variance 1
        return (
            (rng.standard_normal((USERS, RANK)) * scale).astype(np.float32),
            (rng.standard_normal((ITEMS, RANK)) * scale).astype(np.float32),
        )

    def chunks(self, samples: int, stream: int = 0) -> Iterator[tuple[Arrays, np.ndarray]]:
        """``samples`` samples (x, y), ``CHUNK`` at a time; ``stream`` tells apart independent draws (the test
        samples are stream 1)."""
        rng, hidden = np.random.default_rng([self.seed, 2, stream]), self.hidden()
        for start in range(0, samples, CHUNK):
            n = min(CHUNK, samples - start)
            if self.name == "criteo":
                yield _criteo(rng, n, hidden[0])
            else:
                yield _movielens(rng, n, *hidden)

    def arrays(self, samples: int, stream: int = 0) -> tuple[Arrays, np.ndarray]:
        """``samples`` samples at once (for a small set: a test, Keras's own ``fit``)."""
        parts = list(self.chunks(samples, stream))
        y = np.concatenate([p[1] for p in parts])
        if self.name == "criteo":
            return np.concatenate([p[0] for p in parts]), y
        return {k: np.concatenate([p[0][k] for p in parts]) for k in ("user", "item")}, y

    def put(self, store: ObjectStore, dataset: str, samples: int, test_samples: int) -> DatasetManifest:
        """Store ``samples`` training and ``test_samples`` test samples as dataset ``dataset``, a chunk at a time."""
        train = self.chunks(samples)
        x, y = next(train)
        with DatasetWriter.like(store, dataset, x, y) as writer:
            writer.write("train", x, y)
            for x, y in train:
                writer.write("train", x, y)
            for x, y in self.chunks(test_samples, stream=1):
                writer.write("test", x, y)
            return writer.finish()

    def model(self) -> bytes:
        """The compiled model as a ``.keras`` file (Adam at ``LEARNING_RATES``)."""
        import keras

        keras.utils.set_random_seed(self.seed)
        if self.name == "criteo":
            features = keras.Input((FIELDS,), dtype="int32", name="features")
            pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(BUCKETS, 1)(features))
            model = keras.Model(features, keras.layers.Dense(1, activation="sigmoid")(pooled))
            model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATES[self.name]), loss="binary_crossentropy")
        else:
            user, item = keras.Input((1,), dtype="int32", name="user"), keras.Input((1,), dtype="int32", name="item")
            rows = [keras.layers.Embedding(n, WIDTH)(i) for n, i in ((USERS, user), (ITEMS, item))]
            rating = keras.layers.Flatten()(keras.layers.Dot(axes=2)(rows))
            model = keras.Model({"user": user, "item": item}, rating)
            model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATES[self.name]), loss="mse")
        return modelio.save_model(model)


def _criteo(rng: np.random.Generator, n: int, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values = np.minimum(rng.zipf(ZIPF, (n, FIELDS)), 2**31 - 1).astype(np.int64)
    fields = np.arange(FIELDS, dtype=np.int64)
    x = ((fields * _HASH[0] + values * _HASH[1]) % BUCKETS).astype(np.int32)
    return x, (weights[x].sum(axis=1) > 0).astype(np.float32)[:, None]


def _movielens(
    rng: np.random.Generator, n: int, users: np.ndarray, items: np.ndarray
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    user, item = rng.integers(0, USERS, n), rng.integers(0, ITEMS, n)
    rating = (users[user] * items[item]).sum(axis=1) + NOISE * rng.standard_normal(n)
    return {"user": user.astype(np.int32)[:, None], "item": item.astype(np.int32)[:, None]}, rating.astype(np.float32)[
        :, None
    ]
