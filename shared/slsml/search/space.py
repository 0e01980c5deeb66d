"""The search space a build function declares with KerasTuner's ``HyperParameters`` (``hp.Int``, ``hp.Float``,
``hp.Choice``, ``hp.Boolean``, ``hp.Fixed``), as Optuna distributions: a choice or a boolean is categorical; a number
is drawn in KerasTuner's own cumulative-probability space (0 to 1, uniform in its ``sampling``: linear, log or
reverse_log, on its ``step``) and turned into its value by KerasTuner, so that a trial's value is one KerasTuner
itself could have drawn."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from slsml.spec.errors import BadInputError

BuildModel = Callable[[Any], Any]  # KerasTuner's hypermodel function: HyperParameters → a compiled Keras model


def hyperparameters(values: Mapping[str, Any] | None = None) -> Any:
    """A KerasTuner ``HyperParameters`` whose hyperparameters take ``values`` where they name them (their defaults
    elsewhere) as the build function declares them."""
    import keras_tuner

    hp = keras_tuner.HyperParameters()
    hp.values.update(values or {})
    return hp


def build(build_model: BuildModel, hp: Any) -> Any:
    """The model ``build_model`` returns for ``hp``; BadInputError unless it is a compiled Keras model."""
    import keras

    model = build_model(hp)
    if not isinstance(model, keras.Model):
        raise BadInputError(
            f"the build function returned {type(model).__name__}, not a Keras model: it takes the hyperparameters"
            " (hp) and returns a compiled model, as a KerasTuner hypermodel does"
        )
    return model


def declared(hp: Any) -> dict[str, Any]:
    """The hyperparameters ``hp`` holds once a build function has declared them: name → KerasTuner's object."""
    return {h.name: h for h in hp.space}


def chosen(hp: Any) -> dict[str, Any]:
    """The values of the hyperparameters the build function used (those of inactive conditional scopes left out)."""
    return {h.name: hp.values[h.name] for h in hp.space if hp.is_active(h) and h.name in hp.values}


def distributions(space: Mapping[str, Any]) -> dict[str, Any]:
    """The Optuna distribution each declared hyperparameter is drawn from (a ``Fixed`` one is not drawn)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    drawn: dict[str, Any] = {}
    for name, declared_hp in space.items():
        kind = type(declared_hp).__name__
        if kind == "Fixed":
            continue
        if kind == "Choice":
            drawn[name] = CategoricalDistribution(list(declared_hp.values))
        elif kind == "Boolean":
            drawn[name] = CategoricalDistribution([False, True])
        elif kind in {"Int", "Float"}:
            drawn[name] = FloatDistribution(0.0, 1.0)
        else:
            raise BadInputError(f"hyperparameter {name!r} is a {kind}: a search draws Int, Float, Choice and Boolean")
    return drawn


def values(space: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """The hyperparameters' values of a trial's Optuna ``params``: a number's probability turned into its value by
    KerasTuner (its range, step and sampling)."""
    return {
        name: space[name].prob_to_value(param) if type(space[name]).__name__ in {"Int", "Float"} else param
        for name, param in params.items()
        if name in space
    }
