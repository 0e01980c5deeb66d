"""A training option is declared once, as a TrainingSpec field: given as its flag, it reaches the run's
execution, its record and its summary with nothing else to change."""

from __future__ import annotations

import json

from slsml.cli import main as cli
from slsml.cli import options
from slsml.client import runs

from .conftest import DIGITS, finish, train

RUN_ID = "spec-options"


def test_an_option_given_as_its_flag_is_in_the_run_record_and_the_summary(services, digits) -> None:
    args = cli.build_parser().parse_args(
        [
            "run",
            "start",
            "--local",
            "--model",
            "m.keras",
            "--data",
            DIGITS,
            "--iterations",
            "3",
            "--workers",
            "2",
            "--reducers",
            "1",
            "--batch",
            "64",
            "--eval-every",
            "3",
            "--deadline-floor",
            "0.7",
        ]
    )
    spec = options.training_spec(args)
    train(services, spec, RUN_ID)
    run = finish(services, RUN_ID, timeout_s=120)
    assert run.status == "COMPLETED", run.reason
    assert run.training == spec and (run.training.eval_every, run.training.deadline_floor) == (3, 0.7)
    item = services.table.table.get_item(Key={"pk": f"RUN#{RUN_ID}", "sk": "META"})["Item"]
    assert json.loads(item["training"]) == json.loads(spec.model_dump_json())  # stored once, by the state machine
    assert not item.keys() & {"iterations", "reducers", "quorum", "deadline_s", "heartbeat_s", "eval_every"}
    assert item["workers"] == 2  # what the pipeline trains with now, beside the spec
    summary = json.loads(runs.summarize(run, services.table.list_iterations(RUN_ID), 1.0).model_dump_json())
    assert summary["training"] == json.loads(spec.model_dump_json())
    assert (summary["iterations"], summary["workers"], summary["reducers"], summary["quorum"]) == (3, 2, 1, 1.0)
