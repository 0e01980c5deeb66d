"""The shard plan: balanced contiguous shards over the flat weight vector."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from slsml.spec.shardplan import ShardPlan, VariableSpec

SPECS = [
    VariableSpec(name="dense/kernel", shape=(3, 4), trainable=True),
    VariableSpec(name="bn/moving_mean", shape=(5,), trainable=False),
    VariableSpec(name="conv/kernel", shape=(7, 2, 2), trainable=True),
    VariableSpec(name="scale", shape=(), trainable=True),
    VariableSpec(name="bn/moving_variance", shape=(6,), trainable=False),
]
SIZE = 12 + 5 + 28 + 1 + 6


def random_arrays(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(spec.shape).astype(np.float32) for spec in SPECS]


def check_balanced(plan: ShardPlan, size: int, reducers: int) -> None:
    assert plan.size == size and plan.reducers == reducers
    assert len(plan.bounds) == reducers + 1
    assert plan.bounds[0] == 0 and plan.bounds[-1] == size
    layouts = [plan.shard(i) for i in range(reducers)]
    sizes = [layout.size for layout in layouts]
    assert min(sizes) >= 1
    assert max(sizes) - min(sizes) <= 1, f"unbalanced shards {sizes} for {size} weights / {reducers} reducers"
    assert sum(sizes) == size
    # contiguous: each shard starts where the previous one stopped
    assert [layout.start for layout in layouts] == [0, *[layout.stop for layout in layouts[:-1]]]


@pytest.mark.parametrize("reducers", range(1, SIZE + 1))
def test_build_is_balanced_and_covers_the_vector(reducers: int) -> None:
    check_balanced(ShardPlan.build(SPECS, reducers), SIZE, reducers)


def test_build_is_balanced_for_many_sizes() -> None:
    rng = np.random.default_rng(1)
    for _ in range(300):
        shapes = [
            tuple(int(d) for d in rng.integers(1, 60, size=rng.integers(0, 3))) for _ in range(rng.integers(1, 5))
        ]
        specs = [VariableSpec(name=f"v{i}", shape=s, trainable=True) for i, s in enumerate(shapes)]
        size = sum(s.size for s in specs)
        reducers = int(rng.integers(1, min(size, 256) + 1))
        check_balanced(ShardPlan.build(specs, reducers), size, reducers)
    # ResNet-50 size; bounds only (shard() builds the whole mask each time)
    big = [VariableSpec(name="big", shape=(23_581_323,), trainable=True)]
    for reducers in (3, 7, 64, 255):
        bounds = np.array(ShardPlan.build(big, reducers).bounds)
        sizes = np.diff(bounds)
        assert bounds[0] == 0 and bounds[-1] == 23_581_323 and len(sizes) == reducers
        assert sizes.max() - sizes.min() <= 1


def test_more_reducers_than_weights_is_refused() -> None:
    with pytest.raises(ValueError, match=rf"{SIZE + 1} reducers.*only {SIZE} weights"):
        ShardPlan.build(SPECS, SIZE + 1)


def test_flatten_unflatten_round_trip() -> None:
    plan = ShardPlan.build(SPECS, 3)
    arrays = random_arrays()
    flat = plan.flatten(arrays)
    assert flat.dtype == np.float32 and flat.shape == (SIZE,)
    # plan order, each variable row-major
    np.testing.assert_array_equal(flat[:12], arrays[0].ravel())
    np.testing.assert_array_equal(flat[12:17], arrays[1])
    assert flat[45] == arrays[3]
    back = plan.unflatten(flat)
    assert len(back) == len(arrays)
    for original, restored in zip(arrays, back, strict=True):
        assert restored.shape == original.shape
        np.testing.assert_array_equal(restored, original)


def test_flatten_casts_to_float32() -> None:
    plan = ShardPlan.build(SPECS, 2)
    arrays = [a.astype(np.float64) for a in random_arrays(3)]
    flat = plan.flatten(arrays)
    assert flat.dtype == np.float32
    np.testing.assert_array_equal(flat, plan.flatten(random_arrays(3)))


def test_trainable_mask_per_shard() -> None:
    plan = ShardPlan.build(SPECS, 3)
    expected = [spec.trainable for spec in SPECS for _ in range(spec.size)]
    np.testing.assert_array_equal(plan.trainable_mask(), expected)
    for index in range(3):
        layout = plan.shard(index)
        assert layout.trainable.dtype == bool and layout.trainable.shape == (layout.size,)
        np.testing.assert_array_equal(layout.trainable, expected[layout.start : layout.stop])
    # the shards see both kinds of weights somewhere
    assert not plan.shard(0).trainable[12:17].any() and plan.shard(0).trainable[:12].all()


def test_shard_index_out_of_range() -> None:
    plan = ShardPlan.build(SPECS, 3)
    for index in (-1, 3):
        with pytest.raises(ValueError, match="outside"):
            plan.shard(index)


def test_flatten_refuses_wrong_shapes_and_counts() -> None:
    plan = ShardPlan.build(SPECS, 2)
    arrays = random_arrays()
    with pytest.raises(ValueError, match=r"conv/kernel.*\(7, 4\).*\(7, 2, 2\)"):
        plan.flatten([*arrays[:2], arrays[2].reshape(7, 4), *arrays[3:]])
    with pytest.raises(ValueError, match=r"dense/kernel"):
        plan.flatten([arrays[0].T, *arrays[1:]])
    with pytest.raises(ValueError, match="expected 5 arrays, got 4"):
        plan.flatten(arrays[:4])
    with pytest.raises(ValueError, match="shape"):
        plan.unflatten(np.zeros(SIZE - 1, np.float32))
    with pytest.raises(ValueError, match="shape"):
        plan.unflatten(np.zeros((1, SIZE), np.float32))


def test_inconsistent_bounds_are_refused() -> None:
    variables = tuple(SPECS)
    with pytest.raises(ValidationError, match="at least one weight"):
        ShardPlan(variables=variables, bounds=(0, 20, 20, SIZE))
    with pytest.raises(ValidationError, match="from 0 to"):
        ShardPlan(variables=variables, bounds=(0, 20, SIZE - 1))
    with pytest.raises(ValidationError, match="from 0 to"):
        ShardPlan(variables=variables, bounds=(1, SIZE))


def test_plan_survives_json() -> None:
    plan = ShardPlan.build(SPECS, 4)
    again = ShardPlan.model_validate_json(plan.model_dump_json())
    assert again == plan
    np.testing.assert_array_equal(again.trainable_mask(), plan.trainable_mask())
