"""Gradient clipping as ``keras.optimizers`` applies it (before weight decay and the update), on one
shard of the averaged gradient.

``clipvalue`` is element-wise. ``clipnorm`` (per variable) and ``global_clipnorm`` need sums of squares
that no one shard holds, since shards are contiguous slices of the flat vector and cut across
variables. Each reducer computes its ``shared_squares`` — for ``global_clipnorm`` its shard's sum, for
``clipnorm`` the sums of the pieces of variables that other shards also hold (at most two per shard) —
the reducers exchange them (``slsml.pipeline.steps.reducer``), and ``clip`` scales with the ``totals``.
"""

from __future__ import annotations

import numpy as np

from slsml.spec.config import OptimizerConfig
from slsml.spec.shardplan import ShardPlan

Squares = dict[str, float]
GLOBAL = "global"
_F = np.float32


def needs_exchange(config: OptimizerConfig, plan: ShardPlan) -> bool:
    """Whether reducers must exchange sums of squares before they step: norm clipping with shards that
    cut across the clipped variables (never with one reducer)."""
    if plan.reducers == 1:
        return False
    if config.global_clipnorm:
        return True
    return bool(config.clipnorm) and any(
        not piece.whole and piece.variable.trainable for r in range(plan.reducers) for piece in plan.pieces(r)
    )


def shared_squares(config: OptimizerConfig, plan: ShardPlan, shard: int, gradient: np.ndarray) -> Squares:
    """What shard ``shard`` contributes to the norms that span shards."""
    pieces = [p for p in plan.pieces(shard) if p.variable.trainable]
    if config.global_clipnorm:
        return {GLOBAL: sum(_squares(gradient[p.span]) for p in pieces)}
    if config.clipnorm:
        return {str(p.number): _squares(gradient[p.span]) for p in pieces if not p.whole}
    return {}


def totals(contributions: list[Squares]) -> Squares:
    """Every shard's ``shared_squares`` → the sums of squares of whole variables (or of the whole gradient)."""
    summed: Squares = {}
    for contribution in contributions:
        for key, value in contribution.items():
            summed[key] = summed.get(key, 0.0) + value
    return summed


def clip(
    config: OptimizerConfig, plan: ShardPlan, shard: int, gradient: np.ndarray, squares: Squares | None
) -> np.ndarray:
    """Shard ``shard``'s gradient clipped as Keras clips the whole gradient (non-trainable elements
    untouched). ``squares``: the ``totals`` of the exchange where ``needs_exchange``, else None."""
    if squares is None and needs_exchange(config, plan):
        raise ValueError(f"shard {shard} cannot clip by norm alone: its norms span shards")
    g = gradient.astype(_F, copy=True)
    pieces = [p for p in plan.pieces(shard) if p.variable.trainable]
    if config.clipnorm:
        limit = _F(config.clipnorm)
        for piece in pieces:
            total = _squares(g[piece.span]) if piece.whole else (squares or {})[str(piece.number)]
            g[piece.span] = (g[piece.span] * limit) / np.maximum(_F(np.sqrt(total)), limit)
    elif config.global_clipnorm:
        limit = _F(config.global_clipnorm)
        total = squares[GLOBAL] if squares is not None else sum(_squares(g[p.span]) for p in pieces)
        norm = _F(np.sqrt(total))
        scale = limit * np.minimum(_F(1) / norm, _F(1) / limit) + (norm - norm)  # NaN for a non-finite norm
        for piece in pieces:
            g[piece.span] *= scale
    elif config.clipvalue:
        limit = _F(config.clipvalue)
        for piece in pieces:
            np.clip(g[piece.span], -limit, limit, out=g[piece.span])
    return g


def _squares(values: np.ndarray) -> float:
    return float(np.square(values, dtype=np.float64).sum())
