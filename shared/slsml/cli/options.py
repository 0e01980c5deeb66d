"""The training flags, generated from TrainingSpec's fields (the optimizer's from OptimizerConfig's), and the
spec they make; the argument types the commands share."""

from __future__ import annotations

import argparse
import types
from functools import partial
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from slsml.cli import display
from slsml.spec.config import (
    HYPER_PARAMETERS,
    KERAS_OPTIMIZERS,
    OPTIMIZER_NAMES,
    RUN_ID_PATTERN,
    OptimizerConfig,
    RegularExpression,
    TrainingSpec,
)
from slsml.spec.deployment import DEFAULT_FUNCTIONS, checked_settings
from slsml.spec.errors import BadInputError, renamed
from slsml.spec.flags import ARGUMENT_NAMES, dest, flag

# TrainingSpec fields with options of their own: the optimizer group (_optimizer_options) and --loss
OWN_OPTIONS = frozenset({"optimizer", "loss"})


def readings(spec: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """How argparse reads each of ``spec``'s fields (but OWN_OPTIONS) from its flag: ``add_argument``'s
    keywords other than the default and help. TypeError for a field no flag can set."""
    found = {}
    for name, field in spec.model_fields.items():
        if name in OWN_OPTIONS:
            continue
        reading = _reading(field.annotation)
        if reading is None or not field.description:
            raise TypeError(
                f"{spec.__name__}.{name}: no command-line option for a {field.annotation}"
                + ("" if field.description else " without a description")
            )
        found[name] = reading
    return found


def _reading(annotation: Any) -> dict[str, Any] | None:
    """``add_argument``'s keywords for a value of ``annotation``: an int, float, str or bool, a ``Literal``'s
    values, a number or a ``Literal``'s words (``int | Literal["auto"]``), or any of those or None; None for
    another type."""
    union = get_origin(annotation) in {Union, types.UnionType}
    members = [
        get_args(m)[0] if get_origin(m) is Annotated else m
        for m in (get_args(annotation) if union else (annotation,))
        if m is not type(None)
    ]
    words = [value for m in members if get_origin(m) is Literal for value in get_args(m)]
    kinds = [m for m in members if get_origin(m) is not Literal]
    if not kinds and len({type(word) for word in words}) == 1:
        return {"type": type(words[0]), "choices": words}
    if kinds == [bool] and not words:
        return {"action": argparse.BooleanOptionalAction}
    if len(kinds) != 1 or kinds[0] not in {int, float, str}:
        return None
    if not words:
        return {"type": kinds[0]}
    if kinds[0] is str or not all(isinstance(word, str) for word in words):
        return None
    return {
        "type": partial(_number_or_word, kinds[0], tuple(words)),
        "metavar": "|".join([kinds[0].__name__.upper(), *words]),
    }


def _number_or_word(kind: type, words: tuple[str, ...], text: str) -> Any:
    """``text`` as one of ``words``, else as a number of ``kind``."""
    if text in words:
        return text
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number ({kind.__name__}) or one of {', '.join(words)}"
        ) from None


SPEC_READINGS = readings(TrainingSpec)  # a field no flag can set fails here, at import


def training_flags(
    parser: argparse.ArgumentParser, iterations: int | None, required: bool, defaults: dict[str, Any] | None = None
) -> None:
    """A flag per TrainingSpec field, its type, default and help from the field (the optimizer's in a group of
    their own). ``iterations``: this command's iteration budget, --iterations ``required`` or not; ``defaults``:
    this command's own defaults of other fields (None: the flag's value is left to the command)."""
    group = parser.add_argument_group("training")
    for name, reading in SPEC_READINGS.items():
        field = TrainingSpec.model_fields[name]
        needed = field.is_required()
        default = None if needed else field.get_default(call_default_factory=True)
        if name == "iterations":  # each command's own budget (None: --iterations or --epochs is required), applied
            # where neither is given (``training_spec``), so that --iterations given beside --epochs is told apart
            parser.set_defaults(default_iterations=iterations)
            default, needed = None, False
        default = (defaults or {}).get(name, default)
        names = [flag(dest(name)), *([flag(ARGUMENT_NAMES[name])] if name in ARGUMENT_NAMES else [])]
        action = group.add_argument(*names, default=default, required=needed, **reading)
        # set after: BooleanOptionalAction adds a default of its own to the help it is given
        shown_default = iterations if name == "iterations" else default
        shown = "" if shown_default is None else f" (default {display.number(shown_default)})"
        action.help = f"{field.description}{shown}".replace("%", "%%")
    group.add_argument("--loss", help="Keras loss name (default: the model's compiled loss)")
    _optimizer_options(parser)


def training_options(parser: argparse.ArgumentParser, iterations: int | None) -> None:
    """The training flags (``training_flags``) and a run's. ``iterations``: this command's iteration budget
    (None: --iterations is required)."""
    training_flags(parser, iterations, required=iterations is None)
    group = parser.add_argument_group("run")
    group.add_argument(
        "--run-id", type=run_name, help="run name: 1-63 lowercase letters, digits or '-' (default: generated)"
    )
    group.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    group.add_argument("--timeout", type=float, default=3600, help="stop waiting (and fail the run) after this long")
    group.add_argument(
        "--pool",
        type=int,
        help="local runs: the most warm processes per function (default: from"
        " this machine's cores and memory, or the SLSML_POOL environment variable)",
    )
    function_options(group)
    group.add_argument(
        "--faults",
        type=_faults,
        help="local runs: inject faults, e.g. 'seed=3,duplicate=0.5,worker_crash=0.25,"
        "s3_get_delay=0.2:1.5' (also reducer_crash, merger_crash_once, sns_delay, "
        "worker_hang=p with hang_s=SECONDS, crash_every_receive, slow_worker=WORKER:SECONDS)",
    )


# a local run's (or the local service's) function settings, as a deployment's functions.<name>.<field> sets them:
# flag → (the FunctionSettings field it sets, its unit, what Lambda does past it)
FUNCTION_OPTIONS = {
    "--memory": ("memory_mb", "MB", "a process past it is killed, as Lambda kills its container"),
    "--function-timeout": (
        "timeout_s",
        "SECONDS",
        "an invocation past it is ended, as Lambda ends it; the worker's and reducer's are the shortest deadline a run"
        " may have",
    ),
    "--accelerator": (
        "accelerator_gib",
        "GIB",
        "each warm worker process gets a logical GPU of that memory on this machine's GPU, as an execution"
        " environment of a GPU function does (refused where TensorFlow sees no GPU)",
    ),
}
ACCELERATOR_EXAMPLE_GIB = 24  # a deployment's workers have none: the flag's example


def function_options(group: Any) -> None:
    """``FUNCTION_OPTIONS``, each ``FLAG FUNCTION=VALUE`` repeated: a local run's (or the local service's) function
    settings; ``args.memory``, ``args.function_timeout`` and ``args.accelerator`` hold the pairs given."""
    for option, (field, unit, effect) in FUNCTION_OPTIONS.items():
        default = getattr(DEFAULT_FUNCTIONS["worker"], field)
        example = f"worker={default if default is not None else ACCELERATOR_EXAMPLE_GIB}"
        group.add_argument(
            option,
            type=partial(_function_setting, field, unit, example),
            action="append",
            metavar=f"FUNCTION={unit}",
            help=f"local runs: a function's {field}, as a deployment's functions.<name>.{field} sets it (default:"
            f" the deployment's{f', e.g. worker={default}' if default is not None else ': none'}); {effect}."
            " Repeat it for more functions",
        )


def _function_setting(field: str, unit: str, example: str, text: str) -> tuple[str, int]:
    function, _, value = text.partition("=")
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give FUNCTION={unit}, e.g. {example}")
    try:
        checked_settings(field, {function: int(value)}, DEFAULT_FUNCTIONS)
    except BadInputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return function, int(value)


def run_name(text: str) -> str:
    """A ``--run-id``, checked as the run's config checks it, so that a bad one is refused in one line."""
    if not RUN_ID_PATTERN.match(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a run id is 1-63 lowercase letters, digits or '-'")
    return text


def _optimizer_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "optimizer", "default: the optimizer the model was compiled with; an option left out keeps Keras's default"
    )
    group.add_argument("--optimizer", choices=OPTIMIZER_NAMES, help="the optimizer the reducers apply")
    group.add_argument(
        "--learning-rate",
        type=float,
        help="a constant learning rate (a schedule comes from the model file); without --optimizer:"
        " the model's compiled optimizer at this rate",
    )
    for name in HYPER_PARAMETERS:
        field = OptimizerConfig.model_fields[name]
        kind = field.annotation
        if get_origin(kind) in {Union, types.UnionType}:
            kinds = set(get_args(kind)) - {type(None)}
            kind = kinds.pop() if len(kinds) == 1 else kind
        owners = OptimizerConfig.optimizers_of(name)
        about = "; ".join(
            filter(
                None,
                [
                    field.description,
                    None if owners == OPTIMIZER_NAMES else ", ".join(KERAS_OPTIMIZERS[n] for n in owners),
                ],
            )
        )
        if kind is bool:
            group.add_argument(flag(name), action="store_true", default=None, help=about or None)
        elif kind is int or kind is float:
            group.add_argument(flag(name), type=int if kind is int else float, help=about or None)
        elif get_origin(kind) is tuple and get_args(kind) == (RegularExpression, ...):
            group.add_argument(
                flag(name),
                type=_patterns,
                action="extend",
                metavar="PATTERN[,PATTERN]",
                help=f"{about} (comma-separated or repeated)",
            )
        else:
            raise TypeError(f"OptimizerConfig.{name}: no command-line option for a {field.annotation}")


def _patterns(text: str) -> list[str]:
    return [pattern for pattern in text.split(",") if pattern]


def _faults(text: str) -> Any:
    from slsml.local.faults import Faults

    try:
        return Faults.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,4,16") from None
    if min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: counts start at 1")
    return counts


def gigabytes(text: str) -> tuple[float, ...]:
    try:
        sizes = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give sizes in GB separated by commas, e.g. 0.5,2") from None
    if not min(sizes) > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes are above 0")
    return sizes


def workers(text: str) -> int:
    try:
        workers = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of workers") from None
    if workers < 1:
        raise argparse.ArgumentTypeError(f"{workers}: a run trains with at least 1 worker")
    return workers


def check_run_length(args: argparse.Namespace) -> None:
    """BadInputError if both --iterations and --epochs are given: each gives the run's length."""
    if args.iterations is not None and args.epochs is not None:
        raise BadInputError(
            f"--iterations {args.iterations} and --epochs {args.epochs} both give the run's length: give one"
        )


def check_data_not_a_model(data: str) -> None:
    """BadInputError where ``--data`` names a Keras model file: the two were swapped, or the model given twice."""
    if data.endswith(".keras"):
        raise BadInputError(
            f"--data {data} is a Keras model, not data: give it as --model, and the samples as --data (a .npz file"
            " of arrays x, y, or a dataset stored with `slsml data put`)"
        )


def check_local_options_apply(args: argparse.Namespace, one_shot: bool) -> None:
    """BadInputError naming the first flag of a one-shot local run's own cloud (--faults, --pool, ``FUNCTION_OPTIONS``)
    given to a run that goes to the local service (which runs as `slsml local up` set it) or to a stack."""
    if one_shot:
        return
    given = [("--faults", args.faults, str(args.faults)), ("--pool", args.pool, str(args.pool))]
    for option in FUNCTION_OPTIONS:
        pairs = getattr(args, option.removeprefix("--").replace("-", "_"))
        given.append((option, pairs, " ".join(f"{name}={value}" for name, value in pairs or ())))
    for given_flag, value, text in given:
        if value is None:
            continue
        faults = given_flag == "--faults"
        where = (
            "faults are injected into a one-shot local run only"
            if faults
            else "it sets a one-shot local run's own cloud"
        )
        if args.stack:
            raise BadInputError(
                f"{given_flag} {text}: {where}, not {'into ' if faults else ''}--stack {args.stack}: leave"
                f" {given_flag} out, or run it with --local and no local service up"
            )
        if faults:
            raise BadInputError(
                f"--faults {text}: {where}, and the local service is up (the run would go to it, which injects none):"
                " stop it (`slsml local down`) to run on a cloud of its own with --faults, or leave --faults out"
            )
        raise BadInputError(
            f"{given_flag} {text}: {where}, and the local service is up (the run would go to it, which runs as"
            f" `slsml local up` set it): give {given_flag} to `slsml local up`, or leave it out"
        )


def training_spec(
    args: argparse.Namespace, default_learning_rate: float | None = None, iterations: int | None = None
) -> TrainingSpec:
    """The run the flags ask for. Without --optimizer its optimizer is None (the model's compiled one): the
    optimizer flags apply on top of it once the model is read (``with_flags``). ``iterations``: the run's length as
    the command reckoned it (``slsml plan``: its --epochs over the samples), in place of the flags'. BadInputError on
    one line naming the flags for values that do not make a spec."""
    optimizer = _optimizer(args, default_learning_rate)
    values = {name: getattr(args, dest(name)) for name in SPEC_READINGS}
    if iterations is not None:
        values["iterations"] = iterations
    else:
        check_run_length(args)
        if values["epochs"] is not None:
            del values["iterations"]  # set from the epochs once the dataset's size is known
        elif values["iterations"] is None:
            values["iterations"] = getattr(args, "default_iterations", None)
            if values["iterations"] is None:
                raise BadInputError("give the run's length: --iterations N or --epochs N")
    try:
        return TrainingSpec(**values, optimizer=optimizer, loss=args.loss)
    except ValidationError as error:
        flags = {name: flag(dest(name)) for name in SPEC_READINGS}
        raise BadInputError(_flagged(error, flags)) from None


def _optimizer_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The optimizer flags given (other than --optimizer), by OptimizerConfig field."""
    given = {name: getattr(args, name) for name in HYPER_PARAMETERS if getattr(args, name) is not None}
    return given if args.learning_rate is None else {"learning_rate": args.learning_rate, **given}


def _optimizer(args: argparse.Namespace, default_learning_rate: float | None) -> OptimizerConfig | None:
    """The optimizer --optimizer names, with the other optimizer flags; None without --optimizer."""
    if not args.optimizer:
        return None
    fields: dict[str, Any] = {"name": args.optimizer, **_optimizer_flags(args)}
    if default_learning_rate and "learning_rate" not in fields:
        fields["learning_rate"] = default_learning_rate
    return _optimizer_config(fields)


def with_flags(args: argparse.Namespace, spec: TrainingSpec, model: Any) -> TrainingSpec:
    """``spec`` with the optimizer in effect: without --optimizer, the model's compiled optimizer with the
    optimizer flags given applied on top of it (a flag that is not one of its options is an error)."""
    flags = _optimizer_flags(args)
    if spec.optimizer is not None or not flags:
        return spec
    from slsml.training import modelio

    compiled = modelio.optimizer_config(model)
    return spec.model_copy(update={"optimizer": _optimizer_config({**dict(compiled), **flags}, compiled.name)})


def _optimizer_config(fields: dict[str, Any], compiled: str | None = None) -> OptimizerConfig:
    """OptimizerConfig(**fields); BadInputError on one line naming flags. ``compiled``: the fields are the
    model's compiled optimizer of this name with flags on top."""
    try:
        return OptimizerConfig(**fields)
    except ValidationError as error:
        message = _flagged(error)
        if compiled:
            message += (
                f" (the optimizer the model is compiled with is {KERAS_OPTIMIZERS[compiled]}; --optimizer"
                " NAME replaces it)"
            )
        raise BadInputError(message) from None


def _flagged(error: ValidationError, flags: dict[str, str] | None = None) -> str:
    """A pydantic error's problems on one line, naming flags rather than fields: ``flags``, field → flag (default:
    OptimizerConfig's)."""
    return renamed(error, flags or {name: flag(name) for name in (*HYPER_PARAMETERS, "learning_rate")})
