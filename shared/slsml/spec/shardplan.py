"""The shard plan: a model's weights as one flat float32 vector, in ``model.weights`` order, split
into R contiguous, size-balanced shards (one per reducer). Pure numpy: reducers never import
TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class VariableSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    shape: tuple[int, ...]
    trainable: bool

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Piece:
    """The part of one variable that one shard holds."""

    number: int  # the variable's index in the plan
    variable: VariableSpec
    span: slice  # its elements within the shard
    whole: bool  # the shard holds all of the variable


@dataclass(frozen=True)
class ShardLayout:
    """One shard's place in the flat vector and which of its elements the optimizer trains."""

    start: int
    stop: int
    trainable: np.ndarray  # bool mask, one entry per element of the shard

    @property
    def size(self) -> int:
        return self.stop - self.start


class ShardPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    variables: tuple[VariableSpec, ...] = Field(min_length=1)
    bounds: tuple[int, ...] = Field(description="R+1 offsets into the flat vector")

    @classmethod
    def build(cls, variables: list[VariableSpec], reducers: int) -> ShardPlan:
        size = sum(v.size for v in variables)
        if reducers > size:
            raise ValueError(f"{reducers} reducers but the model has only {size} weights")
        bounds = tuple(round(r * size / reducers) for r in range(reducers + 1))
        return cls(variables=tuple(variables), bounds=bounds)

    @model_validator(mode="after")
    def _consistent(self) -> ShardPlan:
        size = sum(v.size for v in self.variables)
        if len(self.bounds) < 2 or self.bounds[0] != 0 or self.bounds[-1] != size:
            raise ValueError(f"shard bounds {self.bounds[:3]}… must run from 0 to {size}")
        if any(a >= b for a, b in zip(self.bounds, self.bounds[1:], strict=False)):
            raise ValueError("every shard must hold at least one weight")
        return self

    @property
    def size(self) -> int:
        return self.bounds[-1]

    @property
    def reducers(self) -> int:
        return len(self.bounds) - 1

    def shard(self, index: int) -> ShardLayout:
        mask = self.mask(index, lambda v: v.trainable)
        return ShardLayout(self.bounds[index], self.bounds[index + 1], mask)

    def pieces(self, index: int) -> list[Piece]:
        """The variables that shard ``index`` holds all or part of, in order, with their slices of it."""
        if not 0 <= index < self.reducers:
            raise ValueError(f"shard {index} outside 0..{self.reducers - 1}")
        start, stop = self.bounds[index], self.bounds[index + 1]
        pieces, offset = [], 0
        for number, variable in enumerate(self.variables):
            first, last = max(offset, start), min(offset + variable.size, stop)
            if first < last:
                whole = first == offset and last == offset + variable.size
                pieces.append(Piece(number, variable, slice(first - start, last - start), whole))
            offset += variable.size
        return pieces

    def mask(self, index: int, predicate: Callable[[VariableSpec], bool]) -> np.ndarray:
        """One bool per element of shard ``index``: whether its variable satisfies ``predicate``."""
        pieces = self.pieces(index)
        mask = np.empty(self.bounds[index + 1] - self.bounds[index], dtype=bool)
        for piece in pieces:
            mask[piece.span] = predicate(piece.variable)
        return mask

    def trainable_mask(self) -> np.ndarray:
        return np.concatenate([np.full(v.size, v.trainable) for v in self.variables])

    def flatten(self, arrays: list[np.ndarray]) -> np.ndarray:
        """Per-variable arrays (plan order) → one float32 vector."""
        if len(arrays) != len(self.variables):
            raise ValueError(f"expected {len(self.variables)} arrays, got {len(arrays)}")
        for spec, array in zip(self.variables, arrays, strict=True):
            if tuple(array.shape) != spec.shape:
                raise ValueError(f"{spec.name}: shape {tuple(array.shape)} does not match the plan's {spec.shape}")
        return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])

    def unflatten(self, flat: np.ndarray) -> list[np.ndarray]:
        """One flat vector → per-variable arrays (plan order)."""
        if flat.shape != (self.size,):
            raise ValueError(f"flat vector has shape {flat.shape}, the plan needs ({self.size},)")
        out, offset = [], 0
        for spec in self.variables:
            out.append(flat[offset : offset + spec.size].reshape(spec.shape))
            offset += spec.size
        return out
