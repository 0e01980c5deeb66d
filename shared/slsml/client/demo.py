"""The demo: a small CNN on scikit-learn's handwritten digits (1797 8×8 images, shipped offline)."""

from __future__ import annotations

import numpy as np

from slsml.data.datasets import split_train_test


def digits(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): images scaled to [0, 1], shape (8, 8, 1); 20 % held out."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[..., None]
    y = bunch.target.astype(np.int64)
    return split_train_test(x, y, test_fraction=0.2, seed=seed)


def digits_cnn(learning_rate: float = 3e-3, seed: int = 0):
    """A compiled two-conv CNN for 8×8×1 inputs, 10 classes (about 25 k weights)."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy")
    return model
