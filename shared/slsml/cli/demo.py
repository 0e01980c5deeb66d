"""`slsml demo`: a small CNN trained on digits through the whole local pipeline."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from slsml.cli import follow, options

DEMO_LEARNING_RATE = 3e-3  # the demo's model: Adam at this rate


def cmd_demo(args: argparse.Namespace) -> int:
    # bad flags fail before TensorFlow loads
    spec = options.training_spec(args, default_learning_rate=DEMO_LEARNING_RATE)
    runtime = follow.one_shot_runtime(args, spec)
    from slsml.client import demo
    from slsml.data import datasets as data
    from slsml.training import modelio

    model = demo.digits_cnn(learning_rate=DEMO_LEARNING_RATE, seed=args.seed)  # compiled: Adam
    spec = options.with_flags(args, spec, model)
    out = Path(args.out) if args.out else None
    arrays = demo.digits(args.seed)
    return follow.train_locally(
        args,
        runtime,
        spec,
        modelio.save_model(model),
        lambda store: data.put_dataset(store, "digits", *arrays).name,
        out,
    )


def add_commands(commands: Any) -> None:
    """`slsml demo`."""
    demo = commands.add_parser("demo", help="train a small CNN on digits through the whole local pipeline")
    options.training_options(demo, iterations=150)
    demo.add_argument("--out", help="where to save the final model (default runs/<run>/final.keras)")
    demo.add_argument(
        "--report", metavar="DIR", help="when the run ends, write its report: DIR/index.html and its PNGs"
    )
    demo.set_defaults(handler=cmd_demo)
