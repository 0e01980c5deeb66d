"""A Keras model as pipeline stages: its cut points (the layer boundaries every path from its inputs to its outputs
passes through as one tensor: every boundary of a Sequential model), the stage sub-models of a split (sharing the
model's layers, so its weights), and a step's gradients computed stage by stage as a GPipe round does. The blocks
between cut points in figures, and the split that balances them, are ``slsml.rounds.stages`` and
``slsml.cost.stages``.

A round's micro-batches flow forward stage by stage, each stage's input kept (the activation a stage function stores
and announces to the next); then backward, each stage computing its forward pass again from its kept input and
taking the gradient of its output against the activation gradient handed back (GPipe's re-materialization). The
gradient of each stage's weights is summed over the micro-batches, each weighted by its share of the batch's
samples, as ``slsml.rounds.accumulate`` weights them: the same as the whole model's to round-off.

BatchNormalization under stages is as under micro-batches (``slsml.rounds.accumulate``): each micro-batch's forward
pass normalizes by its own batch statistics, starting from the step's moving statistics; the step's new moving
statistics are the micro-batches' values after their forward passes averaged by share. The forward pass computed
again at the backward pass starts from the same values and random generators' states (a Dropout draws the forward
pass's masks) and leaves them as they were: the generators advance once a micro-batch, as in one process."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from slsml.spec import samples
from slsml.spec.errors import BadInputError
from slsml.training.generators import Draws


class Graph(NamedTuple):
    """A functional model's layer calls in an order they can run in, its inputs and outputs (symbolic tensors)."""

    nodes: list[Any]
    inputs: list[Any]
    outputs: list[Any]


def graph(model: keras.Model) -> Graph:
    """The layer calls of ``model`` (a Sequential model's: of the functional model it builds). BadInputError for a
    subclassed model, whose calls Keras does not record."""
    functional = model._functional if isinstance(model, keras.Sequential) else model
    by_depth = getattr(functional, "_nodes_by_depth", None)
    if by_depth is None:
        raise BadInputError(
            f"model {model.name!r} is subclassed: its layer calls are not recorded, so it cannot be cut into stages"
            " (build it as a Sequential or functional model)"
        )
    nodes = [n for depth in sorted(by_depth, reverse=True) for n in by_depth[depth] if n.operation and not n.is_input]
    return Graph(nodes, list(functional.inputs), list(functional.outputs))


def _crossing(g: Graph, position: int) -> list[Any]:
    """The tensors made before layer call ``position`` (or model inputs) that a later call, or the model's output,
    takes: what a cut there hands on."""
    made = {id(t): t for t in g.inputs} | {id(t): t for n in g.nodes[:position] for t in n.outputs}
    taken = {id(t) for n in g.nodes[position:] for t in n.input_tensors} | {id(t) for t in g.outputs}
    return [t for key, t in made.items() if key in taken]  # the earliest made first


def cut_points(model: keras.Model) -> list[int]:
    """The positions (layer calls before them, 1 to calls − 1) where ``model`` can be cut: one tensor crosses there,
    and no layer is called on both sides (its weights would be in two stages)."""
    g = graph(model)
    points = []
    for position in range(1, len(g.nodes)):
        before = {id(n.operation) for n in g.nodes[:position]}
        shared = any(id(n.operation) in before for n in g.nodes[position:])
        if not shared and len(_crossing(g, position)) == 1:
            points.append(position)
    return points


def refusal(model: keras.Model, count: int) -> str | None:
    """Why ``model`` cannot be cut into ``count`` stages, in one line naming the layer that prevents it (None: it
    can)."""
    g = graph(model)
    points = cut_points(model)
    if count <= len(points) + 1:
        return None
    if len(g.nodes) == 1:
        reason = f"its one layer, {g.nodes[0].operation.name!r}, has no boundary to cut at"
    else:
        blocker, source = _blocker(g, points)
        reason = (
            f"layer {blocker!r} takes the output of {source!r} across every boundary between them"
            if source is not None
            else f"layer {blocker!r} is called on both sides of every boundary between its calls"
        )
    most = len(points) + 1
    fewer = f"give --pipeline-stages {most} or fewer" if most > 1 else "train it in one stage (--pipeline-stages 1)"
    return (
        f"--pipeline-stages {count}: model {model.name!r} can be cut at {len(points)} layer boundaries, into"
        f" {most} stage{'s' * (most > 1)} at most: {reason}; {fewer}"
    )


def _blocker(g: Graph, points: list[int]) -> tuple[str, str | None]:
    """The layer that rules out the most boundaries, and the layer (or input) whose output it takes past them (None:
    it is itself called on both sides)."""
    producer = {id(t): "the input" for t in g.inputs} | {id(t): n.operation.name for n in g.nodes for t in n.outputs}
    blocked: dict[tuple[str, str | None], int] = {}
    for position in range(1, len(g.nodes)):
        if position in points:
            continue
        before = {id(n.operation) for n in g.nodes[:position]}
        for n in g.nodes[position:]:
            if id(n.operation) in before:
                key: tuple[str, str | None] = (n.operation.name, None)
                blocked[key] = blocked.get(key, 0) + 1
        crossing = _crossing(g, position)
        if len(crossing) > 1:
            far = crossing[0]  # the earliest made: the longest reach
            for n in g.nodes[position:]:
                if any(t is far for t in n.input_tensors):
                    key = (n.operation.name, producer[id(far)])
                    blocked[key] = blocked.get(key, 0) + 1
                    break
    return max(blocked, key=lambda k: blocked[k])


def submodel(model: keras.Model, start: int, stop: int) -> keras.Model:
    """The layer calls ``start`` to ``stop`` (cut points, or the ends) of ``model`` as a model of their own: its
    input the tensor crossing ``start`` (the model's inputs at 0), its output the one crossing ``stop`` (the model's
    outputs at the end); the layers are the model's own."""
    g = graph(model)
    given = g.inputs if start == 0 else _crossing(g, start)
    fresh = [
        keras.Input(shape=t.shape[1:], dtype=t.dtype, name=f"{model.name}_{start}_{i}") for i, t in enumerate(given)
    ]
    tensors = {id(t): f for t, f in zip(given, fresh, strict=True)}
    for node in g.nodes[start:stop]:
        args, kwargs = node.arguments.fill_in(tensors)
        made = node.operation(*args, **kwargs)
        for t, f in zip(node.outputs, tf.nest.flatten(made), strict=True):
            tensors[id(t)] = f
    wanted = g.outputs if stop == len(g.nodes) else _crossing(g, stop)
    outputs = [tensors[id(t)] for t in wanted]
    return keras.Model(fresh if len(fresh) > 1 else fresh[0], outputs if len(outputs) > 1 else outputs[0])


def split(model: keras.Model, sizes: Sequence[int]) -> list[keras.Model]:
    """The stage sub-models of ``model`` whose stages hold ``sizes`` blocks each (in order). BadInputError, naming
    the layer that prevents it, where the model has fewer blocks than the stages need."""
    if (why := refusal(model, len(sizes))) is not None:
        raise BadInputError(why)
    g = graph(model)
    bounds = [0, *cut_points(model), len(g.nodes)]
    if sum(sizes) != len(bounds) - 1:
        raise ValueError(f"stages of {sum(sizes)} blocks for a model of {len(bounds) - 1}")
    ends = np.cumsum([0, *sizes])
    return [submodel(model, bounds[a], bounds[b]) for a, b in itertools.pairwise(ends)]


class StageStep(NamedTuple):
    """One step computed through the stages: its loss and, per stage, the gradient of its trainable weights, its
    non-trainable weights' new values and the seconds it computed (every micro-batch's forward pass, its forward
    pass again and its backward pass)."""

    loss: float
    gradients: list[list[np.ndarray]]
    untrained: list[list[np.ndarray]]
    seconds: list[float]


class StageRunner:
    """One stage's part of a step (the module's docstring), micro-batch by micro-batch, in any order that runs each
    micro-batch's ``forward`` before its ``backward`` (the last stage has no ``forward``: its backward pass computes
    it); ``finish`` gives its gradient and non-trainable values. Each micro-batch is weighted by ``share``, its share
    of the step's samples. One process runs every stage of a step (``step``), or a stage function one."""

    def __init__(self, stage: keras.Model, last: bool, draws: Draws | None = None) -> None:
        self.stage, self.last, self.draws = stage, last, draws  # draws: sets the generators for each micro-batch
        self.starting = _values(stage.non_trainable_weights)  # every micro-batch's forward pass starts from these
        self.gradients = [np.zeros(v.shape, np.float64) for v in stage.trainable_weights]
        self.untrained = [np.zeros(v.shape, np.float64) for v in stage.non_trainable_weights]
        self.loss = 0.0  # the loss (the last stage), or the stage's regularization, summed by share
        self.regularization = 0.0  # the stage's regularization losses at its last backward pass
        self.seconds = 0.0
        self._seeds: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}  # micro-batch → states before, after

    def forward(self, number: int, given: Any, share: float) -> Any:
        """The stage's output of micro-batch ``number`` on its input ``given`` (not the last stage)."""
        _assign(self.stage.non_trainable_weights, self.starting)
        if self.draws is not None:
            self.draws.at(number)
        before = _values(_seed_states(self.stage))
        started = time.perf_counter()
        output = self.stage(given, training=True)
        self.seconds += time.perf_counter() - started
        self._add_untrained(share)
        self._seeds[number] = before, _values(_seed_states(self.stage))
        return output

    def backward(self, number: int, given: Any, share: float, objective_of: Any) -> Any:
        """The gradient of the loss with respect to the stage's input ``given`` of micro-batch ``number`` (None for an
        input that is not floating), its weights' gradient added up. ``objective_of(output)``: the loss of the
        output (the last stage: its labels' mean loss) or, before it, the gradient handed back (``handed_back``)."""
        _assign(self.stage.non_trainable_weights, self.starting)
        if not self.last:  # computed again as it was: its Dropout draws the forward pass's masks
            _assign(_seed_states(self.stage), self._seeds[number][0])
        elif self.draws is not None:
            self.draws.at(number)
        given = tf.nest.map_structure(tf.convert_to_tensor, given)
        started = time.perf_counter()
        with tf.GradientTape() as tape:
            watched = [t for t in tf.nest.flatten(given) if t.dtype.is_floating]
            tape.watch(watched)
            output = self.stage(given, training=True)
            loss = objective_of(output) if self.last else tf.constant(0.0)
            objective = share * loss if self.last else objective_of(output)
            if self.stage.losses:
                regularization = tf.add_n(self.stage.losses)
                loss, objective = loss + regularization, objective + share * regularization
                self.regularization = float(regularization)
        found = tape.gradient(objective, [*self.stage.trainable_weights, *watched])
        self.seconds += time.perf_counter() - started
        self.loss += share * float(loss)
        if self.last:
            self._add_untrained(share)
        else:
            _assign(_seed_states(self.stage), self._seeds.pop(number)[1])
        weights = len(self.stage.trainable_weights)
        for sum_, g in zip(self.gradients, found[:weights], strict=True):
            if g is not None:
                sum_ += np.asarray(tf.convert_to_tensor(g), np.float64)
        return found[weights] if watched else None

    def saved(self) -> dict[str, np.ndarray]:
        """What the stage has computed so far, by name, for another process to go on from (``restore``): its sums,
        its compute seconds, its random generators' states now and, of each micro-batch whose forward pass is done and
        whose backward pass is not, those before and after that forward pass."""
        arrays = {f"gradient.{i}": g for i, g in enumerate(self.gradients)}
        arrays |= {f"untrained.{i}": u for i, u in enumerate(self.untrained)}
        arrays |= {"loss": np.array(self.loss), "seconds": np.array(self.seconds)}
        arrays |= {f"seed.{i}": v for i, v in enumerate(_values(_seed_states(self.stage)))}
        arrays["pending"] = np.array(sorted(self._seeds), np.int64)
        for number, (before, after) in self._seeds.items():
            arrays |= {f"pending.{number}.before.{i}": v for i, v in enumerate(before)}
            arrays |= {f"pending.{number}.after.{i}": v for i, v in enumerate(after)}
        return arrays

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Go on from ``saved``'s arrays, as the stage was when it saved them. ValueError unless they are a saved state
        of this stage."""
        shapes = {f"gradient.{i}": g.shape for i, g in enumerate(self.gradients)}
        shapes |= {f"untrained.{i}": u.shape for i, u in enumerate(self.untrained)}
        states = _seed_states(self.stage)
        shapes |= {f"seed.{i}": tuple(v.shape) for i, v in enumerate(states)}
        wrong = [name for name, shape in shapes.items() if name not in arrays or arrays[name].shape != shape]
        wrong += [name for name in ("loss", "seconds", "pending") if name not in arrays]
        if wrong:
            raise ValueError(f"not a saved state of this stage (wrong or missing: {', '.join(wrong)})")
        self.gradients = [np.array(arrays[f"gradient.{i}"], np.float64) for i in range(len(self.gradients))]
        self.untrained = [np.array(arrays[f"untrained.{i}"], np.float64) for i in range(len(self.untrained))]
        self.loss, self.seconds = float(arrays["loss"]), float(arrays["seconds"])
        _assign(states, [arrays[f"seed.{i}"] for i in range(len(states))])
        try:
            self._seeds = {
                number: (
                    [arrays[f"pending.{number}.before.{i}"] for i in range(len(states))],
                    [arrays[f"pending.{number}.after.{i}"] for i in range(len(states))],
                )
                for number in map(int, arrays["pending"])
            }
        except KeyError as missing:
            raise ValueError(f"not a saved state of this stage (missing: {missing})") from None

    def finish(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The stage's gradient and new non-trainable values (float32), the latter set on its weights."""
        untrained = [s.astype(np.float32) for s in self.untrained]
        _assign(self.stage.non_trainable_weights, untrained)
        return [g.astype(np.float32) for g in self.gradients], untrained

    def _add_untrained(self, share: float) -> None:
        for sum_, value in zip(self.untrained, _values(self.stage.non_trainable_weights), strict=True):
            sum_ += share * value.astype(np.float64)


def handed_back(gradient: Any) -> Any:
    """The objective of a stage before the last whose output's gradient ``gradient`` was handed back to it."""
    return lambda output: tf.reduce_sum(output * gradient)


def step(stages: Sequence[keras.Model], loss_fn: Any, micro_batches: Sequence[tuple[Any, Any]]) -> StageStep:
    """The step of the batch made of ``micro_batches`` ((x, y) each) through ``stages`` (``StageRunner`` each, in one
    process); ``loss_fn(y, prediction)`` the run's loss (a mean over the batch), each stage's own regularization
    losses added. The last stage's forward pass is its backward pass's: one stage computes a plain step."""
    total = sum(samples.count(y) for _, y in micro_batches)
    runners = [StageRunner(stage, number == len(stages) - 1) for number, stage in enumerate(stages)]
    for number, (x, y) in enumerate(micro_batches):
        share = samples.count(y) / total
        kept = [tf.nest.map_structure(tf.convert_to_tensor, x)]  # each stage's input: the activations handed on
        for runner in runners[:-1]:
            kept.append(runner.forward(number, kept[-1], share))
        gradient = None
        for runner, given in zip(reversed(runners), reversed(kept), strict=True):
            objective = (lambda output, y=y: loss_fn(y, output)) if runner.last else handed_back(gradient)
            gradient = runner.backward(number, given, share, objective)
    finished = [runner.finish() for runner in runners]
    return StageStep(
        sum(runner.loss for runner in runners),
        [gradients for gradients, _ in finished],
        [untrained for _, untrained in finished],
        [runner.seconds for runner in runners],
    )


def _seed_states(stage: keras.Model) -> list[Any]:
    """The stage's random generators' states (a Dropout's): variables, not weights."""
    weights = {id(v) for v in stage.non_trainable_weights}
    return [v for v in stage.non_trainable_variables if id(v) not in weights]


def _values(variables: Sequence[Any]) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in variables]


def _assign(variables: Sequence[Any], values: Sequence[np.ndarray]) -> None:
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)
