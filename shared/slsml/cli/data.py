"""`slsml data`: datasets in S3, ingested from the formats users have, listed, shown and removed; a file given
to `run start` uploaded (or recognised by its content)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from slsml.cli import display, display_data, targets
from slsml.spec.errors import BadInputError

# ---- a source from the command line: each format's options are flags ------------------------------------------


def _source_fields() -> dict[str, Any]:
    """Every format's option fields by name (a field two formats share, such as label, is one flag)."""
    from slsml.data import sources

    return {name: field for format in sources.FORMATS.values() for name, field in format.options.model_fields.items()}


def _source_flags(parser: argparse.ArgumentParser) -> None:
    from slsml.data import sources

    group = parser.add_argument_group("source formats")
    group.add_argument(
        "--format",
        choices=list(sources.FORMATS),
        help="how to read SOURCE (default: by its suffix; a folder by its files' suffixes, or images in"
        " class subfolders)",
    )
    for name, field in _source_fields().items():
        flag, default = f"--{name.replace('_', '-')}", field.get_default()
        if field.annotation is bool:
            group.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=field.description)
            continue
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        group.add_argument(
            flag,
            default=argparse.SUPPRESS,
            metavar=name.upper(),
            help=field.description + ("" if field.is_required() or default is None else f" (default {shown})"),
        )


def _source(args: argparse.Namespace) -> Any:
    """The source ``args`` name, read with the format flags given (a flag of another format is refused)."""
    from slsml.data import sources

    path = Path(args.source)
    format = sources.FORMATS[args.format] if args.format else sources.detect(path)
    given = {name: getattr(args, name) for name in _source_fields() if hasattr(args, name)}
    foreign = [name for name in given if name not in format.options.model_fields]
    if foreign:
        flag = f"--{foreign[0].replace('_', '-')}"
        raise BadInputError(f"{flag} does not apply to {path}, a source of format {format.name}")
    return sources.open_source(path, format.name, **given)


def _ingest(
    store: Any,
    name: str,
    source: Any,
    origin: Callable[[], Any],
    test_fraction: float,
    seed: int,
    shard_mb: float | None = None,
) -> Any:
    """Stream ``source`` into dataset ``name`` with a progress bar, having said what the source found by itself
    (``Source.found``: a TFRecord's features); its manifest."""
    from slsml.data import ingest
    from slsml.data.manifest import DEFAULT_SHARD_MB

    if source.found is not None:
        display.say(f"found: {source.found}")

    with display_data.samples_progress(f"ingesting {name}", source.count()) as advance:
        return ingest.put(store, name, source, test_fraction, seed, shard_mb or DEFAULT_SHARD_MB, origin, advance)


def upload_file(store: Any, path: Path, name: str | None, test_fraction: float, seed: int) -> str:
    """The dataset of file ``path`` for a run: one read from the same content the same way if there is one, else
    the file uploaded as ``name`` (default: named after the file). Its name."""
    from slsml.data import catalog, ingest, sources

    source = sources.open_source(path)
    origin = ingest.origin_of(path, source, test_fraction, seed)
    same = catalog.same_origin(store, origin)
    if same is not None:
        display.say(f"{path} is dataset {same.name} already (same content): training on it")
        return same.name
    name = name or path.stem.lower().replace("_", "-")[:63]
    if catalog.exists(store, name):
        raise BadInputError(
            f"dataset {name!r} already exists and holds other data: name this one with --dataset NAME"
            f" (or train on that one with --data {name})"
        )
    return _ingest(store, name, source, lambda: origin, test_fraction, seed).name


# ---- the commands --------------------------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> Any:
    from slsml.aws import clients as aws
    from slsml.aws.storage import ObjectStore

    if getattr(args, "bucket", None) and args.stack:
        raise BadInputError("say where the datasets are: --stack NAME (a deployed stack) or --bucket BUCKET, not both")
    return (
        ObjectStore(aws.client("s3"), args.bucket)
        if getattr(args, "bucket", None)
        else (targets.required_target(args)[0].store)
    )


def _show(manifest: Any, as_json: bool) -> None:
    from slsml.data import catalog

    summary = catalog.summary(manifest)
    if as_json:
        print(json.dumps(summary))
    else:
        display_data.print_dataset(summary)


def cmd_data_put(args: argparse.Namespace) -> int:
    from slsml.data import ingest

    source = _source(args)
    store = _store(args)
    origin = partial(ingest.origin_of, Path(args.source), source, args.test_fraction, args.seed)
    manifest = _ingest(store, args.name, source, origin, args.test_fraction, args.seed, args.shard_mb)
    _show(manifest, args.json)
    return 0


def cmd_data_list(args: argparse.Namespace) -> int:
    from slsml.data import catalog

    summaries = catalog.listing(_store(args))
    if args.json:
        print(json.dumps(summaries))
    else:
        display_data.print_datasets(summaries)
    return 0


def cmd_data_show(args: argparse.Namespace) -> int:
    from slsml.data import datasets as data

    _show(data.load_manifest(_store(args), args.name), args.json)
    return 0


def cmd_data_rm(args: argparse.Namespace) -> int:
    from slsml.data import catalog
    from slsml.state.records import RunStatus

    services = targets.required_target(args)[0]
    runs = [run for run in services.table.list_runs() if run.dataset == args.name]
    using = [run.run_id for run in runs if run.status == RunStatus.RUNNING]
    if using:
        raise BadInputError(f"dataset {args.name!r} is in use by run {', '.join(using)}: stop it first")
    resumable = [run.run_id for run in runs if run.status in (RunStatus.STOPPED, RunStatus.FAILED)]
    if resumable and not args.force:
        raise BadInputError(
            f"dataset {args.name!r} is the one run {', '.join(resumable)} would resume on (`slsml run resume`):"
            f" removed, it cannot resume; remove it all the same with `slsml data rm {args.name} --force`"
        )
    removed = catalog.remove(services.store, args.name)
    display.done(
        f"dataset {args.name} removed ({removed} objects)", args.json, {"dataset": args.name, "objects": removed}
    )
    return 0


def add_commands(commands: Any) -> None:
    """`slsml data` and its actions."""
    datasets = commands.add_parser("data", help="datasets in S3").add_subparsers(dest="action", required=True)
    stack_help = "the deployed stack of this name (default: the local service)"
    put = datasets.add_parser(
        "put",
        help="stream a file or folder into a dataset: shards, then the manifest (run it"
        " again to continue an interrupted upload)",
    )
    put.add_argument("name", help="dataset name (lowercase letters, digits, '-')")
    put.add_argument(
        "source",
        help="a .npz (x, y, optional x_test, y_test) or .npy file, a folder of images in class"
        " subfolders, Parquet or CSV tables, TFRecord files (a file or a folder of them)",
    )
    put.add_argument("--stack", help=f"upload to {stack_help}")
    put.add_argument("--bucket", help="or to this bucket (AWS credentials and AWS_ENDPOINT_URL apply)")
    put.add_argument(
        "--test-fraction", type=float, default=0.2, help="held out when the source has no test part (default 0.2)"
    )
    put.add_argument("--seed", type=int, default=0, help="seed of the held-out samples (default 0)")
    put.add_argument("--shard-mb", type=float, help="MB per shard object (default 64)")
    put.add_argument("--json", action="store_true", help="print the dataset as one JSON line")
    _source_flags(put)
    put.set_defaults(handler=cmd_data_put)
    listing = datasets.add_parser("list", help="the datasets: samples, shapes, classes, bytes, format")
    show = datasets.add_parser("show", help="a dataset's manifest: samples, shapes, classes, bytes, format, origin")
    show.add_argument("name")
    remove = datasets.add_parser(
        "rm", help="remove a dataset (refused while a run uses it, or a stopped or failed run may resume on it)"
    )
    remove.add_argument("name")
    remove.add_argument(
        "--force", action="store_true", help="remove it though stopped or failed runs would resume on it"
    )
    for parser, handler in ((listing, cmd_data_list), (show, cmd_data_show), (remove, cmd_data_rm)):
        parser.add_argument("--stack", help=stack_help)
        if parser is not remove:
            parser.add_argument("--bucket", help="or this bucket (AWS credentials and AWS_ENDPOINT_URL apply)")
        parser.add_argument("--json", action="store_true", help="print it as one JSON line")
        parser.set_defaults(handler=handler)
