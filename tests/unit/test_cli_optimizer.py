"""The CLI's optimizer flags: one per OptimizerConfig field, checked before anything runs, and the line
that says which optimizer a run applies."""

from __future__ import annotations

import keras
import pytest

from slsml import cli
from slsml.config import OptimizerConfig
from slsml.errors import BadInputError

RUN_START = ("run", "start", "--local", "--model", "m.keras", "--data", "d.npz", "--iterations", "3")


def optimizer(*flags: str, command: tuple[str, ...] = ("demo",)) -> OptimizerConfig | None:
    args = cli.build_parser().parse_args([*command, *flags])
    return cli._spec(args, default_learning_rate=3e-3 if command[0] == "demo" else None).optimizer  # as cmd_demo


@pytest.mark.parametrize("command", [("demo",), RUN_START])
@pytest.mark.parametrize("field", [f for f in OptimizerConfig.model_fields if f not in {"name", "learning_rate"}])
def test_every_optimizer_field_has_a_flag(command: tuple[str, ...], field: str) -> None:
    flag = "--" + field.replace("_", "-")
    args, unknown = cli.build_parser().parse_known_args([*command, flag, "1"])  # a switch leaves "1" over
    assert flag not in unknown and getattr(args, field, None) is not None, f"no {flag} for OptimizerConfig.{field}"


def test_flags_set_the_optimizer_config() -> None:
    config = optimizer("--optimizer", "adamw", "--weight-decay", "0.01", "--global-clipnorm", "1.0",
                       "--exclude-from-weight-decay", "bias,gamma", "--beta-1", "0.8", "--amsgrad",
                       command=RUN_START)
    assert config == OptimizerConfig(name="adamw", weight_decay=0.01, global_clipnorm=1.0,
                                     exclude_from_weight_decay=("bias", "gamma"), beta_1=0.8, amsgrad=True)
    repeated = optimizer("--optimizer", "adamw", "--exclude-from-weight-decay", "bias",
                         "--exclude-from-weight-decay", "gamma")
    assert repeated.exclude_from_weight_decay == ("bias", "gamma")
    sgd = optimizer("--optimizer", "sgd", "--momentum", "0.9", "--nesterov", "--clipvalue", "0.5")
    assert (sgd.learning_rate, sgd.momentum, sgd.nesterov, sgd.clipvalue) == (3e-3, 0.9, True, 0.5)


def test_without_an_optimizer_flag_the_models_optimizer_applies() -> None:
    assert optimizer() is None and optimizer(command=RUN_START) is None
    assert optimizer("--learning-rate", "0.01") == OptimizerConfig(name="adam", learning_rate=0.01)
    assert optimizer("--optimizer", "rmsprop", command=RUN_START) == OptimizerConfig(name="rmsprop")


def test_a_hyper_parameter_needs_the_optimizer() -> None:
    with pytest.raises(BadInputError, match=r"^--clipnorm needs --optimizer"):
        optimizer("--clipnorm", "1")
    with pytest.raises(BadInputError, match=r"^--centered, --weight-decay need --optimizer"):
        optimizer("--learning-rate", "0.1", "--weight-decay", "0.1", "--centered")


@pytest.mark.parametrize("where", [["--local"], ["--stack", "no-such-stack"]])
def test_contradictory_flags_fail_on_one_line_before_anything_is_read(
    where: list[str], tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--optimizer", "adam", "--clipnorm", "1", "--global-clipnorm", "2"]
    code = cli.main(["run", "start", *where, "--model", str(tmp_path / "missing.keras"), "--data", "d.npz",
                     "--iterations", "3", *flags])  # a missing model and no stack: the flags fail first
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --clipnorm and --global-clipnorm contradict each other: give one of them"
    ]


def test_field_errors_name_the_flag() -> None:
    with pytest.raises(BadInputError, match=r"^--beta-1: Input should be less than or equal to 1$"):
        optimizer("--optimizer", "adam", "--beta-1", "2")
    with pytest.raises(BadInputError, match=r"^--exclude-from-weight-decay needs a --weight-decay$"):
        optimizer("--optimizer", "adam", "--exclude-from-weight-decay", "bias")


def test_the_description_names_the_schedule_decay_and_clipping() -> None:
    schedule = keras.optimizers.schedules.CosineDecay(1e-3, 100, warmup_target=1e-2, warmup_steps=10)
    keras_optimizer = keras.optimizers.AdamW(learning_rate=schedule, global_clipnorm=1.0)
    config = OptimizerConfig.from_keras("AdamW", keras_optimizer.get_config())
    assert cli.describe_optimizer(config) == (
        "optimizer: AdamW, learning rate CosineDecay(initial_learning_rate=0.001, decay_steps=100,"
        " warmup_target=0.01, warmup_steps=10), weight decay 0.004, global_clipnorm 1"
    )
    sgd = OptimizerConfig(name="sgd", learning_rate=0.05, momentum=0.9, nesterov=True, weight_decay=0.01,
                          exclude_from_weight_decay=("bias", "gamma"), clipvalue=0.5)
    assert cli.describe_optimizer(sgd) == (
        "optimizer: SGD, learning rate 0.05, momentum 0.9, nesterov, weight decay 0.01 (not on bias, gamma),"
        " clipvalue 0.5"
    )
    plain = "optimizer: Adam, learning rate 0.003, no weight decay, no clipping"
    assert cli.describe_optimizer(OptimizerConfig()) == plain
