"""The interface every update rule implements (``UpdateRule``): the worker's round, what the reducers apply,
what a worker slot keeps between rounds, and what all of it costs in the plan.

A rule's module defines one ``UpdateRule`` as ``RULE``, and its declaration in ``slsml.spec.algorithms`` registers
it under the name ``--algorithm`` takes. The worker and reducer steps, the cost model and the CLI ask the run's rule
(``slsml.rules.of``) and never branch on its name. Rules import TensorFlow only inside a round, so that the zip
functions (the reducer) read a rule's declarations without it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.errors import BadInputError
from slsml.training import npz, progress
from slsml.training.progress import Progress

if TYPE_CHECKING:
    from slsml.rounds.accumulate import StepBatch

if TYPE_CHECKING:
    from slsml.training.modelio import Trainer, Update


class Slot(Protocol):
    """A worker slot's stored state (one object per slot and round, create-only)."""

    def previous(self) -> bytes | None:
        """The state the slot stored after the round before (None: none, or the first round)."""

    def put(self, body: bytes) -> bool:
        """Store this round's state; False (nothing written) if a try of this round stored one first."""

    def current(self) -> bytes | None:
        """This round's state as stored (None: none)."""

    def where(self, previous: bool = False) -> str:
        """The name of this round's state object (``previous``: the round before's), for messages."""


@dataclass(frozen=True)
class Round:
    """What a worker's round starts from; ``resumed``: the progress an invocation before handed the round on with,
    ``batches`` being the ones left, the first of them its micro-batches left (``slsml.training.progress``)."""

    trainer: Trainer
    start: np.ndarray  # the flat weights entering the round (the consensus, under ADMM)
    batches: Sequence[StepBatch]  # the worker's batches of the round, in order, each as its micro-batches
    spec: TrainingSpec
    slot: Slot
    resumed: Progress | None = None
    pause: Callable[[], bool] = progress.never  # before a micro-batch: whether to hand the round on instead


@dataclass(frozen=True)
class SlotTraffic:
    """What a worker slot's stored state moves per steady round: one read of the round before's object and one
    write of its own, of ``bytes`` each (none when ``bytes`` is 0)."""

    bytes: int = 0

    @property
    def objects(self) -> int:
        """Objects read, and objects written, per worker and round."""
        return 1 if self.bytes else 0


class UpdateRule(ABC):
    """How a worker's round turns weights and data into an update, and what the reducers apply with it."""

    kind: ClassVar[str]  # what an update holds: the update format's kind (slsml.training.updates.KINDS)
    # whether the reducers' optimizer state is the one Keras's fit would hold for the same steps, so that the final
    # model is saved with it (``fit`` goes on from it as from single-process training)
    fit_state: ClassVar[bool] = False
    # whether each invocation that goes on with a round handed on (``Round.pause``) reads the slot's state of the
    # round before again (``slot_traffic``'s bytes)
    rereads_slot: ClassVar[bool] = False
    # whether a worker scales its loss for the run's optimizer (``slsml.training.precision``): the rule's gradients
    # are the ones the reducers step that optimizer with, whose loss scale they decide on
    scales_loss: ClassVar[bool] = False
    # whether its rounds can run in pipeline stages (slsml.pipeline.staged): one gradient of one batch a round,
    # nothing kept in the worker slot
    staged: ClassVar[bool] = False

    @abstractmethod
    def round(self, work: Round) -> Update | Progress:
        """The worker's round: its update (the trainer's model ends at the round's end weights), or its progress
        where ``work.pause`` stopped it."""

    @abstractmethod
    def describe(self, spec: TrainingSpec, optimizer: str, local: str) -> str:
        """One line: what a round takes and what the reducers apply, ``optimizer`` describing the run's optimizer and
        ``local`` the local optimizer (``spec.local_optimizer_config()``)."""

    def check_model(self, model: Any) -> None:
        """BadInputError, with the reason, unless the rule applies to ``model``: a model that computes in float16
        needs loss scaling, which only a rule that ``scales_loss`` applies."""
        from slsml.training.modelio import computes_float16

        if not self.scales_loss and computes_float16(model):
            raise BadInputError(
                "the model computes in float16 (mixed_float16), whose gradients need loss scaling, and this"
                " algorithm's local steps take none: build it under mixed_bfloat16, or train it with --algorithm"
                " gradient"
            )

    def server_optimizer(self, spec: TrainingSpec, optimizer: OptimizerConfig) -> OptimizerConfig:
        """What the reducers step with the averaged update, the run's optimizer being ``optimizer``."""
        return optimizer

    def slot_traffic(self, spec: TrainingSpec, params: int, trainable: int) -> SlotTraffic:
        """What a worker slot's stored state moves per round, for a model of ``params`` float32 weights of which
        ``trainable`` are trainable (nothing stored: none)."""
        return SlotTraffic()

    def compute_steps(self, spec: TrainingSpec) -> int:
        """Gradient computations a worker's round takes, each on its share of one global batch."""
        return spec.local_batches


def archive_bytes(template: dict[str, np.ndarray], elements: int) -> int:
    """Bytes of the ``.npz`` archive of ``template``'s arrays with each empty 1-D array holding ``elements``
    entries (as ``slsml.training.npz`` stores them), without building it."""
    grown = [array for array in template.values() if array.ndim == 1 and array.size == 0]
    return len(npz.encode(**template)) + sum(array.dtype.itemsize for array in grown) * elements
