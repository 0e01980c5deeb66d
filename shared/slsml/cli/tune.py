"""`slsml tune`: a hyperparameter search of a KerasTuner build function on a stored dataset, each trial a run of the
local service or a deployed stack; a line per trial as it ends, the table of trials (or ``--json``), its report on
request; ``--resume NAME`` goes on with an interrupted search."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

from slsml.cli import display, display_tune, options, targets
from slsml.pipeline import launch
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError, NotFoundError


def cmd_tune(args: argparse.Namespace) -> int:
    began = time.time()  # the search's wall_s: the whole command's
    from slsml.client import tune
    from slsml.search import records

    services, usage = targets.required_target(args)
    target = tune.Target(services, usage)
    if args.resume:
        settings = records.load_settings(services.store, args.resume)
        if settings is None:
            where = f"stack {args.stack}" if args.stack else "the local service"
            raise NotFoundError(f"--resume {args.resume}: no search of this name in {where} (`slsml tune -h`)")
        build_model = load_build(args.build or settings.build or "")
    else:
        settings, build_model = _new_search(args, services)
    try:
        result = tune.run_search(target, build_model, settings, display.say, began)
    except tune.SearchInterrupted as interrupted:  # which trials it stopped and how to resume: said as it stopped them
        display_tune.print_search(interrupted.result, args.json)  # what it had
        return 130
    display_tune.print_search(result, args.json)
    if args.report:
        from slsml.cli import tune_report

        with display.console().status(f"writing the report of search {settings.name}…"):
            page = tune_report.write_report(result, Path(args.report))
        display.say(f"report: {page}")
    return 0 if result.best_trial is not None else 1


def _new_search(args: argparse.Namespace, services: Any) -> tuple[Any, Any]:
    """A new search's settings, checked and kept in the bucket, and its build function."""
    import numpy as np

    from slsml.client import tune
    from slsml.data import datasets as data
    from slsml.search import records

    missing = [flag for flag, value in (("--build", args.build), ("--data", args.data)) if value is None]
    if missing:
        raise BadInputError(f"a new search needs {' and '.join(missing)} (or --resume NAME to go on with one)")
    build_model = load_build(args.build)
    manifest = data.load_manifest(services.store, args.data)
    training = {"workers": args.workers, "reducers": args.reducers}
    if args.validation_split is not None:
        training["validation_split"] = args.validation_split
    elif manifest.test.count == 0:
        raise BadInputError(f"dataset {args.data!r} has no test split to validate on: give --validation-split F")
    name = args.name or launch.new_run_id("tune")
    records.check_new(services.store, name)
    path, _, function = args.build.rpartition(":")
    settings = tune.search_settings(
        build_model,
        data.DatasetReader(services.store, manifest).take("train", np.arange(min(2, manifest.train.count))),
        name=name,
        dataset=args.data,
        validation="split" if args.validation_split is not None else "test",
        objective=args.objective,
        max_trials=args.max_trials,
        parallel=args.parallel,
        epochs=args.epochs,
        batch_size=args.batch_size,
        budget_usd=args.budget_usd,
        pruner=args.pruner,
        seed=args.seed,
        training=training,
        build=f"{Path(path).resolve()}:{function}",
    )
    records.save_settings(services.store, settings)
    return settings, build_model


def load_build(spec: str) -> Any:
    """The build function ``FILE.py:FUNCTION`` names; BadInputError naming what is wrong with it."""
    path, _, function = spec.rpartition(":")
    file = Path(path)
    if not path or not function:
        raise BadInputError(f"--build {spec!r}: give FILE.py:FUNCTION, e.g. --build model.py:build_model")
    if not file.is_file():
        raise BadInputError(f"--build {spec}: no file {file}")
    loader = importlib.util.spec_from_file_location(f"slsml_build_{file.stem}", file)
    if loader is None or loader.loader is None:
        raise BadInputError(f"--build {spec}: {file} is not a Python file")
    module = importlib.util.module_from_spec(loader)
    sys.path.insert(0, str(file.resolve().parent))  # its own imports of modules beside it
    try:
        loader.loader.exec_module(module)
    finally:
        sys.path.remove(str(file.resolve().parent))
    found = getattr(module, function, None)
    if not callable(found):
        raise BadInputError(f"--build {spec}: {file} defines no function {function!r}")
    return found


def add_commands(commands: Any) -> None:
    """`slsml tune`."""
    from slsml.search.records import SearchSettings

    described = SearchSettings.model_fields
    tune = commands.add_parser(
        "tune",
        help="search a KerasTuner build function's hyperparameters: trials in parallel, the weak ones stopped early",
    )
    tune.add_argument(
        "--build",
        metavar="FILE.py:FUNCTION",
        help="the build function: takes KerasTuner's HyperParameters (hp.Int, hp.Float, hp.Choice, hp.Boolean) and"
        " returns a compiled Keras model (with --resume: default the one the search started with)",
    )
    tune.add_argument(
        "--data", metavar="NAME", help="a dataset stored with `slsml data put` (validated on its test split)"
    )
    for name in ("max_trials", "parallel", "epochs", "batch_size"):
        field = described[name]
        tune.add_argument(
            f"--{name.replace('_', '-')}",
            type=int,
            default=field.default,
            help=f"{field.description} (default {field.default})",
        )
    tune.add_argument(
        "--validation-split",
        type=float,
        metavar="F",
        help="validate on this fraction held out of the training samples instead of the dataset's test split",
    )
    tune.add_argument(
        "--objective", default="val_loss", help=f"{described['objective'].description} (default val_loss)"
    )
    tune.add_argument(
        "--workers",
        type=int,
        default=2,
        help=f"each trial's {str(TrainingSpec.model_fields['workers'].description).split(';')[0]} (default 2)",
    )
    tune.add_argument(
        "--reducers",
        type=int,
        default=1,
        help=f"each trial's {TrainingSpec.model_fields['reducers'].description} (default 1)",
    )
    tune.add_argument(
        options.flag("budget_usd"),
        type=float,
        metavar="DOLLARS",
        help="the whole search's dollars: the plan prices each trial before it starts, and none is started that would"
        " take the spend past this; the running ones are stopped once it is spent",
    )
    tune.add_argument(
        "--pruner",
        choices=("hyperband", "asha", "median", "none"),
        default="hyperband",
        help="what stops weak trials early, told each trial's objective at each epoch's end (default hyperband)",
    )
    tune.add_argument("--seed", type=int, default=0, help=f"{described['seed'].description} (default 0)")
    tune.add_argument("--name", help="the search's name (default tune-<time>-<hex>); its trials are runs <name>-t<n>")
    tune.add_argument(
        "--resume", metavar="NAME", help="go on with the interrupted search NAME, its settings as they were"
    )
    tune.add_argument("--stack", help="the deployed stack of this name (default: the local service)")
    tune.add_argument("--report", metavar="DIR", help="when the search ends, write its report: DIR/index.html and PNGs")
    tune.add_argument("--json", action="store_true", help="print the search's summary as one JSON line")
    tune.set_defaults(handler=cmd_tune)
