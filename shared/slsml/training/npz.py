"""Named arrays as the bytes of an ``.npz`` archive: dataset shards, optimizer and averaging states,
ADMM slot states; and one array as the bytes of an ``.npy`` file: what pipeline stages hand each other, a worker's
evaluation state."""

from __future__ import annotations

import io

import numpy as np


def encode(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy types allow_pickle among the keywords
    return buffer.getvalue()


def decode(body: bytes) -> dict[str, np.ndarray]:
    """The arrays of an archive's bytes, by name (numpy's errors for bytes that are not one)."""
    with np.load(io.BytesIO(body), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def encode_array(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def decode_array(body: bytes) -> np.ndarray:
    """The array of an ``.npy`` file's bytes (numpy's errors for bytes that are not one)."""
    return np.load(io.BytesIO(body), allow_pickle=False)
