"""Sample weights as Keras's ``fit`` applies them: a sample's loss is multiplied by its weight and the batch's sum
divided by the batch's size (the default reduction, ``sum_over_batch_size``), so that a worker's mean over its
slice, averaged by samples across the workers, is the weighted loss of the global batch. A ``class_weight`` gives
each sample the weight of its class (Keras's ``class_weight_to_sample_weights``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from slsml.spec.samples import Arrays

Batch = tuple[Arrays, Arrays, np.ndarray | None]  # x, y (each an array or named arrays), the samples' weights (None: 1)


def class_ids(y: np.ndarray) -> np.ndarray:
    """The class of each label as Keras reads it for class weights: the largest entry of a one-hot label, the
    value of a class id (rounded: 0./1. labels too)."""
    if y.ndim > 1:
        y = np.argmax(y, axis=-1) if y.shape[-1] != 1 else np.squeeze(y, axis=-1)
    return np.round(y).astype(np.int64).reshape(-1)


def of_classes(y: np.ndarray, weights: Sequence[float]) -> np.ndarray:
    """Each sample's weight from its class (``weights[c]`` for class c; a class beyond them: 1, as Keras)."""
    table = np.asarray(weights, dtype=np.float32)
    ids = class_ids(y)
    known = (ids >= 0) & (ids < len(table))
    out = np.ones(len(ids), dtype=np.float32)
    out[known] = table[ids[known]]
    return out


def resolve(
    class_weight: Mapping[int, float] | str, counts: Sequence[int] | None, classes: int | None
) -> tuple[float, ...]:
    """A run's class weights per class id 0 … n−1, from ``class_weight`` ("balanced": samples / (classes × the
    class's samples), scikit-learn's formula, over the classes present; a mapping: its weights, 1 for a class left
    out). ``counts``: the training labels' samples per class (None: not known), ``classes``: how many class ids
    the labels can take (None: not class ids). Labels of neither (float labels, 0./1.) take a mapping as Keras does,
    each label rounded to its class, the classes unchecked. ValueError naming the problem: a class the labels do not
    have."""
    if class_weight == "balanced":
        if counts is None:
            raise ValueError(
                "class_weight balanced needs the samples of each class, which the dataset does not record"
                " (labels that are not class ids, or a dataset stored before slsml recorded them: put"
                " it again)"
            )
        present = [c for c, n in enumerate(counts) if n]
        total = sum(counts)
        return tuple(total / (len(present) * n) if n else 1.0 for n in counts)
    assert isinstance(class_weight, Mapping)
    if counts is None and classes is None:  # no class ids recorded: each label rounded to its class (``class_ids``)
        return tuple(class_weight.get(c, 1.0) for c in range(max(class_weight, default=-1) + 1))
    have = [c for c, n in enumerate(counts) if n] if counts is not None else list(range(classes or 0))
    missing = sorted(set(class_weight) - set(have))
    if missing:
        where = (
            f"the training labels are classes {', '.join(map(str, have))}"
            if have and len(have) <= 12
            else f"the training labels are classes {min(have)} to {max(have)}"
            if have
            else "the labels are not class ids"
        )
        raise ValueError(
            f"class_weight names class{'es' if len(missing) > 1 else ''}"
            f" {', '.join(map(str, missing))} that the labels do not have ({where})"
        )
    size = max(have, default=-1) + 1
    return tuple(class_weight.get(c, 1.0) for c in range(size))
