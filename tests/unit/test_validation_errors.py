"""A pydantic validation error reaches a user as one line, naming the field (the flag, the Python argument) and, for
a field not known, the nearest known name; never pydantic's own dump or its URL. A keyword ``slsml.fit`` or
``slsml.tune`` does not take is Python's TypeError naming the closest one."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from pydantic import ValidationError

from slsml.cli import main as cli
from slsml.cli import options
from slsml.client.arguments import KEYWORDS
from slsml.spec.config import DropInRequest, RunConfig, TrainingSpec
from slsml.spec.errors import BadInputError, problems
from slsml.spec.flags import as_keywords


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


def test_the_command_shows_a_validation_error_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def invalid(args: object) -> int:
        TrainingSpec.model_validate({"iterationz": 3, "epoch": 2})
        return 0

    monkeypatch.setattr(cli, "build_parser", _parser_of(invalid))
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "error: iterationz: unknown field (did you mean 'iterations'?); epoch: unknown field (did you mean 'epochs'?)"
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


def _uncompiled() -> object:
    import keras

    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])


XY = np.zeros((8, 3), np.float32), np.zeros(8, np.int64)


@pytest.mark.parametrize(
    ("keywords", "said"),
    [
        ({"wrokers": 2}, "fit() got an unexpected keyword argument 'wrokers' (did you mean 'workers'?)"),
        ({"iterations": 3}, "fit() got an unexpected keyword argument 'iterations' (did you mean 'epochs'?)"),
        ({"global_batch": 3}, "fit() got an unexpected keyword argument 'global_batch' (did you mean 'batch_size'?)"),
        ({"run_id": "mine"}, "fit() got an unexpected keyword argument 'run_id'"),
    ],
)
def test_a_keyword_fit_does_not_take_is_a_type_error_naming_the_closest_one(keywords: dict, said: str) -> None:
    import slsml

    with pytest.raises(TypeError) as refused:
        slsml.fit(_uncompiled(), *XY, loss="binary_crossentropy", optimizer="adam", verbose=0, **keywords)
    assert str(refused.value) == said


def test_a_keyword_tune_does_not_take_is_a_type_error_naming_the_closest_one() -> None:
    import slsml

    with pytest.raises(TypeError) as refused:
        slsml.tune(_uncompiled, *XY, max_trials=1, parallel=1, epochs=1, batch_size=4, validation_split=0.25, reducrs=2)
    assert str(refused.value) == "tune() got an unexpected keyword argument 'reducrs' (did you mean 'reducers'?)"


@pytest.mark.parametrize(
    ("keywords", "said"),
    [
        (
            {"optimizer": "adamx"},
            "optimizer='adamx' is not an optimizer slsml applies (did you mean 'adamax' or 'adam'?)",
        ),
        ({"optimizer": "adam", "workers": 0}, "workers: Input should be greater than or equal to 1 or 'auto'"),
        (
            {"optimizer": "adam", "batch_size": 2, "workers": 3},
            "batch_size (2) must be at least the number of workers (3)",
        ),
        ({"optimizer": "adam", "loss": "binary_crossentropi"}, "unknown loss 'binary_crossentropi' (did you mean"),
        ({}, 'the model is not compiled: give loss= (e.g. loss="sparse_categorical_crossentropy") and optimizer='),
        ({"optimizer": "adam", "batch_size": 0}, "batch_size=0: give the samples of a step, 1 or more"),
        ({"optimizer": "adam", "shuffle": False}, "shuffle=False: slsml draws each epoch's global batches anew"),
        ({"optimizer": "adam", "shuffle": "batch"}, "shuffle: Input should be 'global' or 'blocks'"),
        ({"optimizer": "adam", "initial_epoch": 2}, "initial_epoch=2: a fit trains from its first epoch"),
        ({"optimizer": "adam", "validation_steps": 2}, "validation_steps=2: slsml validates on every sample"),
        ({"optimizer": "adam", "validation_freq": 2}, "validation_freq=2: slsml validates at the end of every epoch"),
        (
            {"optimizer": "adam", "pipeline_stages": 2},
            "pipeline_stages=2: model 'sequential",
        ),
    ],
)
def test_fits_arguments_that_make_no_run_are_one_line_naming_the_arguments(keywords: dict, said: str) -> None:
    import slsml

    keywords = {"loss": "binary_crossentropy", **keywords} if keywords else {}
    with pytest.raises(BadInputError) as refused:
        slsml.fit(_uncompiled(), *XY, verbose=0, **keywords)
    message = str(refused.value)
    assert message.startswith(said) and "\n" not in message and "--" not in message, message


def test_tune_names_its_arguments_for_a_model_the_build_function_does_not_compile() -> None:
    import slsml

    arguments = {"max_trials": 1, "parallel": 1, "epochs": 1, "batch_size": 4, "validation_split": 0.25}
    with pytest.raises(BadInputError) as refused:
        slsml.tune(lambda hp: _uncompiled(), *XY, **arguments)
    assert str(refused.value).startswith('the model is not compiled: give loss= (e.g. loss="sparse_categorical')
    with pytest.raises(BadInputError) as refused:
        slsml.tune(lambda hp: _uncompiled(), *XY, optimizer="adamx", **arguments)
    assert str(refused.value).startswith("optimizer='adamx' is not an optimizer slsml applies (did you mean 'adamax'")


@pytest.mark.parametrize(
    ("said", "read"),
    [
        (
            "--pipeline-stages 4: into 2 stages at most; give --pipeline-stages 2 or fewer",
            "pipeline_stages=4: into 2 stages at most; give pipeline_stages=2 or fewer",
        ),
        ("--batch 8 and --batch-size 8 (--workers 3)", "batch_size=8 and batch_size=8 (workers=3)"),
        (
            "leave --micro-batch out, or give --memory worker=2048",
            "leave micro_batch out, or give --memory worker=2048",
        ),
        ("--compress topk:0.01 with --staleness unbounded", "compress topk:0.01 with staleness unbounded"),
        ("--iterations 3 or --epochs 2.5; --learning-rate 0.1", "--iterations 3 or epochs=2.5; --learning-rate 0.1"),
    ],
)
def test_a_refusal_names_the_training_options_as_a_python_caller_gives_them(said: str, read: str) -> None:
    assert as_keywords(said, KEYWORDS) == read


def test_kerass_own_fit_keywords_are_taken_as_keras_takes_them() -> None:
    from slsml.client.fit import _keras_options

    assert _keras_options(True, 0, None, 1) == {}  # Keras's defaults: the run's own order, every epoch validated
    assert _keras_options("blocks", 0, None, 1) == {"shuffle": "blocks"}


def test_fit_refuses_x_and_y_of_different_lengths_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import slsml
    from slsml.local import runtime

    def started(*_: object) -> None:
        pytest.fail("a local runtime was started for data that cannot train")

    monkeypatch.setattr(runtime.LocalRuntime, "__enter__", started)
    with pytest.raises(BadInputError) as refused:
        slsml.fit(_uncompiled(), XY[0], XY[1][:3], loss="binary_crossentropy", optimizer="adam", verbose=0)
    assert str(refused.value) == "training data: x has 8 samples but y has 3"
