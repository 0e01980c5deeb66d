"""The random generators of a model's stochastic layers (Dropout, GaussianNoise, random augmentation): Keras's
``SeedGenerator``, whose state is [seed, counter], a draw taking the whole state and adding one to the counter.

A worker's model is warm in a process that computed other rounds, runs and attempts before, and a model loaded from
its ``.keras`` file draws a fresh seed for every layer built without one (``Dropout(0.5)``): the masks a round drew
would depend on which process computed it. So a round sets every generator's state before each micro-batch it
computes (``Draws``): the seed, the layer's own where its config names one, as Keras draws, else one of the run's
``--seed`` and the generator's place in the model; the counter, the micro-batch's place in the run,
(iteration × W + slot) × M + m, M a round's micro-batches and m the micro-batch's number in the round. A run's masks are
then the same whatever process computes a round, its hand-ons, its retries and its pipeline stages; and a run of one
worker in whole batches draws what Keras's ``fit`` draws, one draw a step from a counter of 0."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import keras


def generators(model: keras.Model) -> list[tuple[Any, Any]]:
    """Each stochastic layer of ``model`` with one of its random generators, in the model's layer order."""
    return [(layer, g) for layer in model._flatten_layers() for g in getattr(layer, "_seed_generators", ())]


def seeds(model: keras.Model, run_seed: int) -> list[int]:
    """The seed each generator of ``model`` (``generators``) draws from: its layer's configured seed, else one made
    of the run's seed and the generator's place (a layer built without a seed draws a fresh one as it is loaded)."""
    found = []
    for place, (layer, _) in enumerate(generators(model)):
        own = layer.get_config().get("seed")
        if isinstance(own, int):
            found.append(own)
        else:
            digest = hashlib.blake2b(f"{run_seed}/{place}".encode(), digest_size=4).digest()
            found.append(int.from_bytes(digest, "big") >> 1)
    return found


class Draws:
    """The generators of slot ``slot``'s round of ``iteration`` (``workers`` slots, each round of ``per_round``
    micro-batches) set before each micro-batch: ``at(number)``, or ``next()`` for the micro-batches in turn from
    ``first`` (a continuation's)."""

    def __init__(
        self,
        model: keras.Model,
        run_seed: int,
        iteration: int,
        workers: int,
        slot: int,
        per_round: int,
        first: int = 0,
    ) -> None:
        self._states = [g.state for _, g in generators(model)]
        self._seeds: Sequence[int] = seeds(model, run_seed) if self._states else ()
        self.base, self.number = (iteration * workers + slot) * per_round, first

    def at(self, number: int) -> None:
        """Set every generator for micro-batch ``number`` of the round."""
        for state, seed in zip(self._states, self._seeds, strict=True):
            state.assign(np.array([seed, self.base + number], dtype=state.dtype))

    def next(self) -> None:
        """Set every generator for the round's next micro-batch."""
        self.at(self.number)
        self.number += 1
