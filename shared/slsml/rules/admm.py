"""ADMM (LambdaML; Boyd et al., consensus form with the scaled dual) for models without hidden layers.

Worker slot w keeps its own partition of the training set (``data.round_batches``), its local model x_w and
its dual u_w, stored per slot and round in S3. A round k, entering with the consensus z:

1. the dual takes its step with the consensus the last round produced: u_w ← u_w + x_w − z;
2. the worker takes K local steps from x_w on its partition's loss plus the proximal term
   (ρ/2)·‖x − z + u_w‖², whose gradient ρ·(x − z + u_w) is added to each step's;
3. it sends z − (x_w + u_w) as its weight change, and the reducers' plain average (FedAvg: SGD at rate 1)
   makes the next consensus the samples-weighted mean of x_w + u_w.

A slot with no state of the round before (the first round, or its worker of that round has not stored one)
starts from the consensus with a zero dual. The local problem is convex only for a model whose one layer
with weights maps inputs to outputs (logistic regression, linear SVM, linear regression): ``check_model``
refuses the others."""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from slsml.rounds.accumulate import StepBatch
from slsml.rules import averaging
from slsml.rules.base import Round, SlotTraffic, UpdateRule, archive_bytes
from slsml.spec.config import OptimizerConfig, TrainingSpec
from slsml.spec.errors import BadInputError, RunFailed
from slsml.training import npz, progress
from slsml.training.progress import Progress

if TYPE_CHECKING:
    from slsml.training.modelio import Trainer, Update

# output activations under which a single Dense layer with a convex loss is a convex problem in its weights
CONVEX_ACTIVATIONS = ("linear", "sigmoid", "softmax")


class SlotState(NamedTuple):
    """A worker slot's local model and scaled dual after a round (flat, in plan order)."""

    model: np.ndarray
    dual: np.ndarray

    def encode(self) -> bytes:
        return npz.encode(model=self.model, dual=self.dual)

    @classmethod
    def decode(cls, body: bytes, size: int, where: str) -> SlotState:
        """A stored state → the state; BadInputError naming ``where`` unless it holds a model and a dual of
        ``size`` float32 weights each."""
        try:
            arrays = npz.decode(body)
        except (ValueError, OSError, zipfile.BadZipFile) as error:
            raise BadInputError(f"{where}: not an ADMM slot state ({error})") from None
        found = {
            name: (np.shape(arrays[name]), str(arrays[name].dtype)) if name in arrays else None
            for name in ("model", "dual")
        }
        if any(entry != ((size,), "float32") for entry in found.values()):
            raise BadInputError(
                f"{where}: an ADMM slot state holds a model and a dual of {size} float32 weights, not {found}"
            )
        return cls(arrays["model"], arrays["dual"])


class Admm(UpdateRule):
    """Each round stores the slot's new state create-only; a retry that finds a state stored sends the update of
    that state, so that the update and the state agree. The reducers' plain average makes the consensus."""

    kind = "weight change"
    rereads_slot = True  # the dual's step and the proximal anchor come from the stored slot state

    def round(self, work: Round) -> Update | Progress:
        size, trainable = work.trainer.plan.size, work.trainer.plan.trainable_mask()
        previous = _state(work.slot.previous(), size, work.slot.where(previous=True))  # again in each continuation
        ended = local_round(
            work.trainer,
            work.start,
            previous,
            work.batches,
            work.spec.local_optimizer_config(),
            work.spec.admm_rho,
            work.resumed,
            work.pause,
        )
        if isinstance(ended, Progress):
            return ended
        update, state = ended
        if work.slot.put(state.encode()):
            return update
        stored = _state(work.slot.current(), size, work.slot.where())
        return update if stored is None else update_of(work.start, stored, trainable, update.loss, update.metrics)

    def describe(self, spec: TrainingSpec, optimizer: str, local: str) -> str:
        return (
            f"ADMM: {spec.local_steps} local steps a round of {local} on each worker's own partition, proximal"
            f" weight rho {spec.admm_rho:g}; the reducers average the local models and duals into the consensus"
        )

    def check_model(self, model: Any) -> None:
        super().check_model(model)
        check_model(model)

    def server_optimizer(self, spec: TrainingSpec, optimizer: OptimizerConfig) -> OptimizerConfig:
        return averaging.SERVER_AVERAGE

    def slot_traffic(self, spec: TrainingSpec, params: int, trainable: int) -> SlotTraffic:
        empty = np.zeros(0, dtype=np.float32)
        return SlotTraffic(archive_bytes({"model": empty, "dual": empty}, params))


def _state(body: bytes | None, size: int, where: str) -> SlotState | None:
    """A stored slot state (None: none); RunFailed naming it if it does not fit the model."""
    if body is None:
        return None
    try:
        return SlotState.decode(body, size, where)
    except BadInputError as error:
        raise RunFailed(str(error)) from None


def check_model(model) -> None:
    """BadInputError, with the reason, unless ADMM applies to ``model``: one layer with weights, Dense, with a
    linear, sigmoid or softmax output."""
    weighted = [layer for layer in model.layers if layer.trainable_weights]
    names = ", ".join(f"{layer.name} ({type(layer).__name__})" for layer in weighted)
    if len(weighted) != 1:
        raise BadInputError(
            f"--algorithm admm applies to models without hidden layers (logistic regression, linear SVM), whose"
            f" local problems are convex; this model has {len(weighted)} layers with weights: {names}"
        )
    layer = weighted[0]
    if type(layer).__name__ != "Dense":
        raise BadInputError(
            f"--algorithm admm applies to a single Dense layer (logistic regression, linear SVM);"
            f" this model's layer with weights is {names}"
        )
    activation = getattr(layer.activation, "__name__", str(layer.activation))
    if activation not in CONVEX_ACTIVATIONS:
        raise BadInputError(
            f"--algorithm admm needs a convex local problem: layer {layer.name}'s activation {activation} is not one"
            f" of {', '.join(CONVEX_ACTIVATIONS)}"
        )


def local_round(
    trainer: Trainer,
    consensus: np.ndarray,
    state: SlotState | None,
    batches: Sequence[StepBatch],
    optimizer: OptimizerConfig,
    rho: float,
    resumed: Progress | None = None,
    pause: Callable[[], bool] = progress.never,
) -> tuple[Update, SlotState] | Progress:
    """One round of slot w from the consensus ``consensus`` and the slot's state of the round before (None:
    none); returns the update (z − (x + u) for trainable weights, the values after the last forward pass for the others,
    the mean loss and the metrics' summed state over the steps, the proximal term left out) and the new state, or the
    round's progress where ``pause`` stopped it (``resumed``: going on from it, as ``averaging.local_steps``)."""
    trainable = trainer.plan.trainable_mask()
    if state is None:
        current, dual = consensus.copy(), np.zeros_like(consensus)
    else:
        current, dual = state.model, state.dual + state.model - consensus
        dual[~trainable] = 0
    anchor = (consensus - dual)[trainable]  # the proximal term pulls x toward z − u
    rho32 = np.float32(rho)
    reached, finished = averaging.local_steps(
        trainer, current, batches, optimizer, None, lambda weights: rho32 * (weights - anchor), resumed, pause
    )
    if not finished:
        return reached
    state = SlotState(reached.weights, dual)
    return update_of(consensus, state, trainable, reached.loss, reached.metrics), state


def update_of(
    consensus: np.ndarray, state: SlotState, trainable: np.ndarray, loss: float, metrics: np.ndarray | None
) -> Update:
    """The update a slot in ``state`` sends: z − (x + u) for trainable weights, x for the others."""
    from slsml.training.modelio import Update

    change = state.model.copy()
    change[trainable] = consensus[trainable] - (state.model[trainable] + state.dual[trainable])
    return Update(vector=change, loss=loss, metrics=metrics)


RULE = Admm()
