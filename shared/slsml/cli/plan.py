"""`slsml plan`: a run's time, requests, dollars and quotas on AWS, predicted."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from slsml.cli import display, options, targets
from slsml.spec.errors import BadInputError, NotFoundError


def cmd_plan(args: argparse.Namespace) -> int:
    from slsml.cost import planreport
    from slsml.spec.config import TrainingSpec

    # the deployment planned for: --stack's, else the local service's if one is up (its function timeouts)
    found = targets.target(args)
    manifest = None
    if args.data:  # the dataset's samples, their bytes and its shards
        from slsml.data import datasets as data

        options.check_data_not_a_model(args.data)
        if Path(args.data).suffix or Path(args.data).exists():
            raise BadInputError(
                f"--data {args.data}: give a stored dataset's name (`slsml data put NAME {args.data}` stores a file);"
                " for data not stored, give its figures: --samples N --sample-bytes BYTES"
            )
        if found is None:
            raise NotFoundError(
                f"--data {args.data} names a dataset of a local service or stack: none is up and no --stack given"
                " (`slsml local up`, then `slsml data put NAME FILE`); or give --samples N --sample-bytes BYTES"
            )
        manifest = data.load_manifest(found[0].store, args.data)
        if args.samples is not None and args.samples != manifest.train.count:
            raise BadInputError(f"--samples {args.samples}: dataset {args.data!r} has {manifest.train.count:,}")
        args.samples = manifest.train.count
    options.check_run_length(args)
    workers_given = args.workers is not None  # without --workers, a plan of GPU workers chooses W
    if not workers_given:
        args.workers = TrainingSpec.model_fields["workers"].default
    stale_given = args.stale_weights is not None  # and, without --stale-weights, whether to run on stale weights
    if not stale_given:
        args.stale_weights = TrainingSpec.model_fields["stale_weights"].default
    spec = options.training_spec(
        argparse.Namespace(
            **{**vars(args), "reducers": args.reducers or 1, "pipeline_stages": args.pipeline_stages or 1}
        ),
        iterations=planreport.iterations(args),
    )
    limits = None if found is None else found[0].limits
    if limits is not None and limits.worker_accelerator_gib is not None and args.accelerator is None:
        # the deployment's GPU workers (functions.worker.accelerator_gib), on its instance types
        args.accelerator = f"worker={limits.worker_accelerator_gib}"
    return planreport.run(args, spec, display.results(args.json), manifest, limits, workers_given, stale_given)


def add_commands(commands: Any) -> None:
    """`slsml plan`."""
    from slsml.cost import planreport

    plan = commands.add_parser("plan", help="predict a run's time, requests, dollars and quotas on AWS")
    options.training_flags(
        plan,
        iterations=None,
        required=False,
        defaults={"reducers": None, "workers": None, "pipeline_stages": None, "stale_weights": None},
    )
    planreport.add_arguments(plan)
    plan.set_defaults(handler=cmd_plan)
