"""The CLI's training flags: their defaults and help come from TrainingSpec's fields."""

from __future__ import annotations

import pytest

from slsml import cli
from slsml.config import TrainingSpec

RUN_START = ("run", "start", "--local", "--model", "m.keras", "--data", "d.npz", "--iterations", "3")


@pytest.mark.parametrize("command", [("demo",), RUN_START])
def test_flags_left_out_give_the_specs_defaults(command: tuple[str, ...]) -> None:
    args = cli.build_parser().parse_args(command)
    spec = cli._spec(args)
    assert spec == TrainingSpec(iterations=spec.iterations)
    assert spec.iterations == (150 if command == ("demo",) else 3)


def test_every_flag_of_a_spec_field_has_its_default_and_description() -> None:
    parser = cli.build_parser()
    start = parser._subparsers._group_actions[0].choices["run"]._subparsers._group_actions[0].choices["start"]
    actions = {action.dest: action for action in start._actions}
    for dest, field_name in cli.SPEC_FLAGS.items():
        field = TrainingSpec.model_fields[field_name]
        action = actions[dest]
        assert action.option_strings == ["--" + dest.replace("_", "-")]
        assert action.default == field.default and action.type is field.annotation, dest
        assert action.help.startswith(field.description), dest
    assert actions["workers"].help == "data-parallel workers (default 4)"
    assert actions["time_budget"].help == "seconds: the run fails if it takes longer (default 604800)"


def test_flags_set_the_spec() -> None:
    args = cli.build_parser().parse_args([*RUN_START, "--workers", "8", "--batch", "256", "--quorum", "0.75",
                                          "--deadline", "30", "--deadline-retries", "0", "--time-budget", "60"])
    spec = cli._spec(args)
    assert (spec.workers, spec.global_batch, spec.quorum, spec.deadline_s, spec.deadline_retries,
            spec.time_budget_s) == (8, 256, 0.75, 30.0, 0, 60)
