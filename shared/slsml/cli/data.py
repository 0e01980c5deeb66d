"""`slsml data`: datasets in S3; reading a .npz file of arrays."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from slsml.cli import display, targets
from slsml.data.manifest import DEFAULT_SHARD_MB
from slsml.spec.errors import BadInputError

_console = display.console


def read_arrays(path: Path, test_fraction: float, seed: int) -> tuple[Any, ...]:
    import numpy as np

    from slsml.data.datasets import split_train_test

    if not path.exists():
        raise BadInputError(f"{path} does not exist")
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as error:
        raise BadInputError(f"{path} is not a .npz file of arrays: {error}") from None
    names = set(archive.files)
    if not {"x", "y"} <= names:
        raise BadInputError(f"{path} must hold arrays named x and y (it has {sorted(names)})")
    if {"x_test", "y_test"} <= names:
        return archive["x"], archive["y"], archive["x_test"], archive["y_test"]
    return split_train_test(archive["x"], archive["y"], test_fraction, seed)


def cmd_data_put(args: argparse.Namespace) -> int:
    from slsml.aws import clients as aws
    from slsml.aws.storage import ObjectStore
    from slsml.data import datasets as data

    if args.bucket and args.stack:
        raise BadInputError("say where to upload: --stack NAME (a deployed stack) or --bucket BUCKET, not both")
    arrays = read_arrays(Path(args.file), args.test_fraction, args.seed)
    store = ObjectStore(aws.client("s3"), args.bucket) if args.bucket else targets.required_target(args)[0].store
    with _console().status(f"uploading {args.name} to s3://{store.bucket}/datasets/{args.name}/…"):
        manifest = data.put_dataset(store, args.name, *arrays, shard_mb=args.shard_mb)
    _console().print(
        f"dataset {manifest.name}: {manifest.train.count} train / {manifest.test.count} test samples "
        f"of shape {manifest.x_shape}, {len(manifest.train.shards) + len(manifest.test.shards)} shards"
    )
    return 0


def add_commands(commands: Any) -> None:
    """`slsml data` and its actions."""
    datasets = commands.add_parser("data", help="datasets in S3").add_subparsers(dest="action", required=True)
    put = datasets.add_parser("put", help="upload x/y arrays (.npz) as shards plus a manifest")
    put.add_argument("name", help="dataset name (lowercase letters, digits, '-')")
    put.add_argument("file", help="a .npz file with x, y (optional x_test, y_test)")
    put.add_argument("--stack", help="upload to the bucket of the deployed stack of this name (default: the local"
                     " service's bucket)")
    put.add_argument("--bucket", help="or to this bucket (AWS credentials and AWS_ENDPOINT_URL apply)")
    put.add_argument("--test-fraction", type=float, default=0.2, help="held out when the file has no x_test")
    put.add_argument("--shard-mb", type=float, default=DEFAULT_SHARD_MB, help="MB per shard object")
    put.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    put.set_defaults(handler=cmd_data_put)
