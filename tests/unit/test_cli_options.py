"""The CLI's training flags: one per TrainingSpec field, its type, default and help from the field."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import Field, create_model
from pydantic.fields import FieldInfo

from slsml.cli import display, options
from slsml.cli import main as cli
from slsml.spec import flags
from slsml.spec.config import RegularExpression, TrainingSpec
from slsml.spec.errors import BadInputError

RUN_START = ("run", "start", "--local", "--model", "m.keras", "--data", "d.npz", "--iterations", "3")


def _actions(parser: argparse.ArgumentParser, *command: str) -> dict[str, argparse.Action]:
    """The actions of a (sub)command's parser, by option string."""
    for name in command:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return {option: action for action in parser._actions for option in action.option_strings}


def _flag(field: str) -> str:
    return "--" + flags.FLAG_NAMES.get(field, field).replace("_", "-")


def _other(field: FieldInfo) -> tuple[list[str], Any]:
    """Arguments that give a field's flag a value other than the field's default, and that value."""
    default, kind = field.default, field.annotation
    if get_origin(kind) in {Union, types.UnionType}:  # X | None, or a number | Literal words: the number
        kind = next(k for k in get_args(kind) if k is not type(None))
    if get_origin(kind) is Annotated:
        kind = get_args(kind)[0]
    if get_origin(kind) is Literal:
        value = next(v for v in get_args(kind) if v != default)
        return [str(value)], value
    if kind is bool:
        return [], not default
    if kind is str:  # whatever the default
        return ["other"], "other"
    value = {int: (default or 0) + 1, float: (default or 1.0) / 2}[kind]
    return [str(value)], value


@pytest.mark.parametrize("command", [("demo",), RUN_START])
def test_flags_left_out_give_the_specs_defaults(command: tuple[str, ...]) -> None:
    args = cli.build_parser().parse_args(command)
    spec = options.training_spec(args)
    assert spec == TrainingSpec(iterations=spec.iterations)
    assert spec.iterations == (150 if command == ("demo",) else 3)


def test_every_spec_field_has_a_flag_with_its_default_and_description_that_sets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = cli.build_parser()
    actions = _actions(parser, "run", "start")
    defaults = options.training_spec(parser.parse_args(RUN_START))
    # one flag's value may need another's (model averaging's options need --algorithm average): unvalidated
    monkeypatch.setattr(options, "TrainingSpec", TrainingSpec.model_construct)
    fields = {name: field for name, field in TrainingSpec.model_fields.items() if name not in options.OWN_OPTIONS}
    assert len(fields) >= 14
    for name, field in fields.items():
        action = actions[_flag(name)]
        if name != "iterations":  # run start asks for it
            assert getattr(defaults, name) == field.default, name
            shown = "" if field.default is None else f" (default {display.number(field.default)})"
            assert action.help == field.description + shown, name
        arguments, value = _other(field)
        flag = _flag(name) if value is not False else "--no-" + _flag(name)[2:]
        length = RUN_START[:-2] if name == "epochs" else RUN_START  # the run's length is given once
        spec = options.training_spec(parser.parse_args([*length, flag, *arguments]))
        assert getattr(spec, name) == value and value != field.default, name
    assert actions["--workers"].help.startswith("data-parallel workers; auto: ")
    assert actions["--workers"].help.endswith(" (default 4)")
    assert options.training_spec(parser.parse_args([*RUN_START, "--workers", "auto"])).workers == "auto"
    assert actions["--time-budget"].help == "seconds: the run fails if it takes longer (default 604800)"
    assert actions["--iterations"].help == fields["iterations"].description
    with pytest.raises(BadInputError, match=r"^give the run's length: --iterations N or --epochs N$"):
        options.training_spec(parser.parse_args(RUN_START[:-2]))
    assert options.training_spec(parser.parse_args([*RUN_START[:-2], "--epochs", "3"])).epochs == 3
    with pytest.raises(BadInputError, match=r"^--iterations 3 and --epochs 2 both give the run's length: give one$"):
        options.training_spec(parser.parse_args([*RUN_START, "--epochs", "2"]))
    demo = options.training_spec(parser.parse_args(["demo", "--epochs", "2"]))  # its default budget gives way
    assert (demo.epochs, "iterations" in demo.model_fields_set) == (2, False)


def test_flags_set_the_spec() -> None:
    args = cli.build_parser().parse_args(
        [
            *RUN_START,
            "--workers",
            "8",
            "--batch",
            "256",
            "--quorum",
            "0.75",
            "--deadline",
            "30",
            "--deadline-retries",
            "0",
            "--time-budget",
            "60",
            "--heartbeat",
            "45",
        ]
    )
    spec = options.training_spec(args)
    assert (
        spec.workers,
        spec.global_batch,
        spec.quorum,
        spec.deadline_s,
        spec.deadline_retries,
        spec.time_budget_s,
        spec.heartbeat_s,
    ) == (8, 256, 0.75, 30.0, 0, 60, 45)
    keras_named = options.training_spec(cli.build_parser().parse_args([*RUN_START, "--batch-size", "64"]))
    assert keras_named.global_batch == 64  # fit's name for it


def test_a_heartbeat_not_shorter_than_the_time_budget_is_refused_naming_both() -> None:
    args = cli.build_parser().parse_args([*RUN_START, "--time-budget", "600"])  # the heartbeat's default: 900 s
    with pytest.raises(BadInputError, match=r"heartbeat \(900 s\) must be shorter than the time budget \(600 s\)"):
        options.training_spec(args)


class Extended(TrainingSpec):
    """TrainingSpec with fields of every kind a flag reads."""

    mode: Literal["one", "two"] = Field(default="one", description="a choice")
    cap: int | None = Field(default=None, ge=1, description="a number or nothing")
    pinned: bool = Field(default=False, description="a switch")
    fleet: int | Literal["auto"] = Field(default="auto", description="a number or a word")
    pattern: RegularExpression = Field(default="x", description="an annotated string")
    rate: Annotated[float, Field(gt=0)] | None = Field(default=None, description="an annotated number or nothing")


def test_a_new_field_of_any_scalar_kind_gets_its_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(options, "TrainingSpec", Extended)
    monkeypatch.setattr(options, "SPEC_READINGS", options.readings(Extended))
    parser = cli.build_parser()
    assert options.training_spec(parser.parse_args(RUN_START)) == Extended(iterations=3)
    spec = options.training_spec(
        parser.parse_args(
            [*RUN_START, "--mode", "two", "--cap", "5", "--pinned", "--fleet", "7", "--pattern", "^a", "--rate", "0.5"]
        )
    )
    assert isinstance(spec, Extended)
    assert (spec.mode, spec.cap, spec.pinned, spec.fleet, spec.pattern, spec.rate) == ("two", 5, True, 7, "^a", 0.5)
    assert options.training_spec(parser.parse_args([*RUN_START, "--fleet", "auto", "--no-pinned"])).fleet == "auto"
    help_of = _actions(parser, "run", "start")
    assert help_of["--pinned"].help == "a switch (default False)" and help_of["--cap"].help == "a number or nothing"
    assert help_of["--fleet"].metavar == "INT|auto" and help_of["--mode"].choices == ["one", "two"]
    for wrong in (["--fleet", "many"], ["--mode", "three"]):
        with pytest.raises(SystemExit):
            parser.parse_args([*RUN_START, *wrong])
    assert "'many': give a number (int) or one of auto" in capsys.readouterr().err


@pytest.mark.parametrize("annotation", [dict[str, int], list[int], int | str, int | float])
def test_a_field_no_flag_can_set_is_refused(annotation: Any) -> None:
    odd = create_model("Odd", odd=(annotation | None, Field(default=None, description="odd")))
    with pytest.raises(TypeError, match=r"Odd\.odd: no command-line option"):
        options.readings(odd)
    with pytest.raises(TypeError, match=r"Bare\.count: .* without a description"):
        options.readings(create_model("Bare", count=(int, 1)))


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--algorithm", "average", "--local-steps", "0"], "--local-steps: Input should be greater than or equal to 1"),
        (
            ["--local-steps", "4", "--server", "optimizer"],
            "--local-steps is an option of --algorithm average or admm"
            " only; --server is an option of --algorithm average only",
        ),
        (["--admm-rho", "0.5"], "--admm-rho is an option of --algorithm admm only"),
        (["--algorithm", "admm", "--server", "optimizer"], "--server is an option of --algorithm average only"),
        (
            ["--algorithm", "admm", "--workers", "auto", "--min-workers", "2", "--max-workers", "4"],
            "--algorithm admm trains a fixed fleet",
        ),
        (["--algorithm", "admm", "--staleness", "2"], "--algorithm admm folds no late updates"),
        (["--algorithm", "admm", "--admm-rho", "0"], "--admm-rho: Input should be greater than 0"),
        (
            ["--algorithm", "average", "--local-optimizer", "adam", "--local-momentum", "0.9"],
            "--local-optimizer adam: momentum does not apply to Adam",
        ),
        (
            ["--workers", "auto"],
            "--workers auto needs --min-workers and --max-workers, the bounds the tuner moves within (e.g."
            " --min-workers 1 and --max-workers 16)",
        ),
        (["--objective", "cost"], "--objective applies to --workers auto only"),
        (
            ["--workers", "auto", "--min-workers", "6", "--max-workers", "3"],
            "--min-workers (6) must be at most --max-workers (3)",
        ),
        (["--batch", "2"], "--batch (2) must be at least the number of --workers (4)"),
        (["--batch-size", "2", "--workers", "3"], "--batch (2) must be at least the number of --workers (3)"),
    ],
)
def test_spec_flags_that_make_no_spec_fail_on_one_line_naming_the_flags(arguments: list[str], named: str) -> None:
    with pytest.raises(BadInputError) as refused:
        options.training_spec(cli.build_parser().parse_args([*RUN_START, *arguments]))
    assert str(refused.value).startswith(named), str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_local_optimizer_the_reducers_do_not_implement_is_no_choice(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*RUN_START, "--algorithm", "average", "--local-optimizer", "adafactor"])
    assert "--local-optimizer: 'adafactor' is not one of sgd, adam," in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["run", "start", "--wrokers", "2"], "unknown option --wrokers (did you mean --workers?)"),
        ([*RUN_START, "--wrokers=2"], "unknown option --wrokers (did you mean --workers?)"),
        ([*RUN_START, "--optimizer", "adamx"], "'adamx' is not one of sgd, adam, "),
        ([*RUN_START, "--optimizer", "adamx"], "(did you mean adamax or adam?)"),
        (["run", "strat"], "'strat' is not one of start, status, "),
        ([*RUN_START, "stray"], "unrecognized arguments: stray"),
    ],
)
def test_a_usage_error_is_one_line_with_the_closest_option_or_choice(
    arguments: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(arguments)
    out, err = capsys.readouterr()
    command = " ".join(["slsml", *arguments[:2]] if arguments[1] != "strat" else ["slsml", "run"])
    assert exited.value.code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"{command}: error: ") and said in err, err
    assert err.endswith(f"`{command} --help` lists its options\n")


def test_sigterm_unwinds_like_ctrl_c_so_a_local_runtime_stops_what_it_started() -> None:
    # in a process of its own: the handler also arms the command's exit deadline
    unwinding = (
        "import os, signal, time\n"
        "from slsml.cli import main as cli\n"
        "cli._end_on_interrupt()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(5)\n"  # the handler runs between bytecodes: well before this ends
        "except KeyboardInterrupt:\n"
        "    print('unwound', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", unwinding], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "unwound", done.stderr


def test_an_error_a_library_makes_of_ctrl_c_ends_the_command_as_interrupted() -> None:
    # as pybind11 turns a KeyboardInterrupt in a module's import into an ImportError, which Keras takes for a
    # missing package and replaces with its own: the command still ends as interrupted (130), not on a traceback
    command = (
        "import os, signal, sys, time\n"
        "from slsml.cli import main as cli\n"
        "from slsml.cli import plan\n"
        "def handler(args):\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(5)\n"
        "    except KeyboardInterrupt:\n"
        "        pass\n"
        "    raise ImportError('To use Keras, you need to have optree installed')\n"
        "plan.cmd_plan = handler\n"
        "sys.exit(cli.main(['plan', '--params', '1000', '--samples', '1000', '--iterations', '2']))\n"
    )
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip().splitlines()[-1]) == (130, "interrupted"), done.stderr


@pytest.mark.parametrize("run_id", ["abc\n", "Upper", "-lead", "x" * 64])
def test_a_run_id_of_the_wrong_form_is_refused_in_one_line(run_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([*RUN_START, f"--run-id={run_id}"])
    assert exited.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith(
            f"argument --run-id: {run_id!r}: a run id is 1-63 lowercase letters, digits or '-'; `slsml run start"
            " --help` lists its options"
        )
    )
    assert options.run_name("ok-7") == "ok-7"


def test_data_a_command_cannot_take_is_refused_with_the_commands_that_would_take_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # no local service is up here
    (tmp_path / "m.keras").write_bytes(b"")
    (tmp_path / "imgs").mkdir()
    assert cli.main(["run", "start", "--local", "--model", "m.keras", "--data", "imgs", "--iterations", "2"]) == 2
    assert "`slsml local up`, `slsml data put NAME imgs`" in capsys.readouterr().err
    # the model given as the data: named, with where each goes
    assert cli.main(["run", "start", "--local", "--model", "m.keras", "--data", "m.keras", "--iterations", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --data m.keras is a Keras model, not data: give it as --model, and the samples as --data (a .npz file"
        " of arrays x, y, or a dataset stored with `slsml data put`)"
    ]
    assert cli.main(["plan", "--params", "1000", "--epochs", "1", "--data", "m.keras"]) == 2  # the plan's too
    assert "error: --data m.keras is a Keras model, not data: give it as --model" in capsys.readouterr().err
    assert cli.main(["plan", "--params", "1000", "--epochs", "1", "--data", "my_data.npz"]) == 2
    assert "give a stored dataset's name (`slsml data put NAME my_data.npz` stores a file)" in capsys.readouterr().err
    assert cli.main(["plan", "--params", "1000", "--epochs", "1", "--data", "digits"]) == 2
    told = capsys.readouterr().err
    assert "--data digits names a dataset of a local service or stack: none is up" in told
    assert "`slsml local up`, then `slsml data put NAME FILE`" in told
    assert not (tmp_path / ".slsml").exists()


def test_a_run_given_no_target_with_no_service_up_is_refused_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # a user with no local service up
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.keras").write_bytes(b"")
    for where in ([], ["--local", "--stack", "prod"]):
        assert cli.main(["run", "start", *where, "--model", "m.keras", "--data", "d.npz", "--iterations", "2"]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            "error: say where to run: --local (the embedded cloud) or --stack NAME (a deployed stack)"
            + (
                "; or start the local service (`slsml local up`), where a run with neither goes"
                if not where
                else ", not both"
            )
        ]
    assert not (tmp_path / "state").exists()  # nothing started, nothing stored


def test_plan_refuses_both_lengths_and_reckons_its_iterations_from_the_epochs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["plan", "--params", "1000", "--samples", "640", "--iterations", "3", "--epochs", "1"]) == 2
    assert "--iterations 3 and --epochs 1 both give the run's length: give one" in capsys.readouterr().err
    assert cli.main(["plan", "--params", "1000", "--samples", "640", "--batch", "64", "--epochs", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["training"]["iterations"] == 20  # 2 × 640 // 64


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--memory", "worker=4096", "--memory", "reducer=512"], "--memory worker=4096 reducer=512"),
        (["--function-timeout", "worker=600"], "--function-timeout worker=600"),
        (["--pool", "3"], "--pool 3"),
    ],
)
def test_a_one_shot_local_runs_settings_for_a_deployed_stack_are_refused_before_the_model_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.keras").write_bytes(b"not a model")  # never read: the flags are refused first
    command = ["run", "start", "--stack", "prod", "--model", "m.keras", "--data", "d", "--iterations", "3"]
    assert cli.main([*command, *flags]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {named}: it sets a one-shot local run's own cloud, not --stack prod: leave {named.split()[0]} out, or"
        " run it with --local and no local service up"
    ]


def test_faults_for_a_deployed_stack_are_refused_before_the_model_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.keras").write_bytes(b"not a model")  # never read: the flags are refused first
    command = ["run", "start", "--stack", "prod", "--model", "m.keras", "--data", "d", "--iterations", "3"]
    assert cli.main([*command, "--faults", "seed=3,worker_crash=0.25"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --faults seed=3,worker_crash=0.25: faults are injected into a one-shot local run only, not into"
        " --stack prod: leave --faults out, or run it with --local and no local service up"
    ]
