"""A pydantic validation error reaches a user as one line per problem, naming the field and, for a field not
known, the nearest known name; never pydantic's own dump or its URL."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from slsml.cli import main as cli
from slsml.cli import options
from slsml.spec.config import DropInRequest, RunConfig, TrainingSpec
from slsml.spec.errors import BadInputError, problems


def _error(model: type, value: object) -> ValidationError:
    with pytest.raises(ValidationError) as raised:
        model.model_validate(value)
    return raised.value


def test_every_problem_is_one_line_naming_the_field_and_the_nearest_name_of_an_unknown_one() -> None:
    error = _error(TrainingSpec, {"iterationz": 3, "workers": 0, "optimizer": {"nmae": "adam"}})
    assert problems(error) == [
        "workers: Input should be greater than or equal to 1 or 'auto'",
        "optimizer.nmae: unknown field (did you mean 'name'?)",
        "iterationz: unknown field (did you mean 'iterations'?)",
    ]


def test_a_name_near_no_field_is_said_unknown_and_the_input_is_not_echoed() -> None:
    (said,) = problems(_error(DropInRequest, {"zzzz": "a secret value"}))
    assert said == "zzzz: unknown field"


def test_a_run_id_of_the_wrong_form_names_the_field_without_pydantics_dump() -> None:
    said = problems(_error(RunConfig, {"run_id": "Bad_Id"}))
    assert "run_id: run id 'Bad_Id' must be 1-63 lowercase letters, digits or '-'" in said, said


def test_the_command_shows_a_validation_error_one_line_per_problem(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def invalid(args: object) -> int:
        TrainingSpec.model_validate({"iterationz": 3, "epoch": 2})
        return 0

    monkeypatch.setattr(cli, "build_parser", _parser_of(invalid))
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: iterationz: unknown field (did you mean 'iterations'?)",
        "error: epoch: unknown field (did you mean 'epochs'?)",
    ], err
    assert "pydantic" not in err and "validation error" not in err


def _parser_of(handler: object) -> object:
    def build() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser()
        parser.set_defaults(handler=handler)
        return parser

    return build


def test_a_flag_that_no_member_of_its_union_takes_is_one_problem() -> None:
    args = cli.build_parser().parse_args(
        ["run", "start", "--model", "m.keras", "--data", "d.npz", "--iterations", "3", "--workers", "0"]
    )
    with pytest.raises(BadInputError) as refused:
        options.training_spec(args)
    assert str(refused.value) == "--workers: Input should be greater than or equal to 1 or 'auto'"
