"""The CLI's optimizer flags: one per OptimizerConfig field, checked before anything runs, and the line
that says which optimizer a run applies."""

from __future__ import annotations

import keras
import pytest

from slsml.cli import demo as cli_demo
from slsml.cli import display_runs, options
from slsml.cli import main as cli
from slsml.spec.config import KERAS_OPTIMIZERS, OptimizerConfig
from slsml.spec.errors import BadInputError

RUN_START = ("run", "start", "--local", "--model", "m.keras", "--data", "d.npz", "--iterations", "3")


def optimizer(*flags: str, command: tuple[str, ...] = ("demo",)) -> OptimizerConfig | None:
    args = cli.build_parser().parse_args([*command, *flags])
    rate = 3e-3 if command[0] == "demo" else None  # as cmd_demo
    return options.training_spec(args, default_learning_rate=rate).optimizer


@pytest.mark.parametrize("command", [("demo",), RUN_START])
@pytest.mark.parametrize("field", [f for f in OptimizerConfig.model_fields if f not in {"name", "learning_rate"}])
def test_every_optimizer_field_has_a_flag(command: tuple[str, ...], field: str) -> None:
    flag = "--" + field.replace("_", "-")
    args, unknown = cli.build_parser().parse_known_args([*command, flag, "1"])  # a switch leaves "1" over
    assert flag not in unknown and getattr(args, field, None) is not None, f"no {flag} for OptimizerConfig.{field}"


def test_flags_set_the_optimizer_config() -> None:
    config = optimizer(
        "--optimizer",
        "adamw",
        "--weight-decay",
        "0.01",
        "--global-clipnorm",
        "1.0",
        "--exclude-from-weight-decay",
        "bias,gamma",
        "--beta-1",
        "0.8",
        "--amsgrad",
        command=RUN_START,
    )
    assert config == OptimizerConfig(
        name="adamw",
        weight_decay=0.01,
        global_clipnorm=1.0,
        exclude_from_weight_decay=("bias", "gamma"),
        beta_1=0.8,
        amsgrad=True,
    )
    repeated = optimizer(
        "--optimizer", "adamw", "--exclude-from-weight-decay", "bias", "--exclude-from-weight-decay", "gamma"
    )
    assert repeated.exclude_from_weight_decay == ("bias", "gamma")
    sgd = optimizer("--optimizer", "sgd", "--momentum", "0.9", "--nesterov", "--clipvalue", "0.5")
    assert (sgd.learning_rate, sgd.momentum, sgd.nesterov, sgd.clipvalue) == (3e-3, 0.9, True, 0.5)


def compiled(keras_optimizer: keras.optimizers.Optimizer) -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras_optimizer, loss="mse")
    return model


def in_effect(model: keras.Model, *flags: str, command: tuple[str, ...] = RUN_START) -> OptimizerConfig | None:
    """The optimizer a run of ``model`` applies with these flags (as cmd_run_start and cmd_demo resolve it)."""
    args = cli.build_parser().parse_args([*command, *flags])
    rate = cli_demo.DEMO_LEARNING_RATE if command == ("demo",) else None
    return options.with_flags(args, options.training_spec(args, default_learning_rate=rate), model).optimizer


def test_without_an_optimizer_flag_the_models_optimizer_applies() -> None:
    assert optimizer() is None and optimizer(command=RUN_START) is None
    assert optimizer("--optimizer", "rmsprop", command=RUN_START) == OptimizerConfig(name="rmsprop")
    assert in_effect(compiled(keras.optimizers.SGD(0.05, momentum=0.9))) is None  # prepare_run reads it as it is


def test_an_optimizer_named_without_a_rate_takes_keras_default_rate_and_the_line_before_the_run_says_it() -> None:
    for name, rate in (("adam", 0.001), ("sgd", 0.01), ("rmsprop", 0.001)):
        config = in_effect(compiled(keras.optimizers.Adam(0.001)), "--optimizer", name)
        assert config.learning_rate == rate == round(float(keras.optimizers.get(name).learning_rate), 6)
        assert display_runs.describe_optimizer(config).startswith(
            f"optimizer: {KERAS_OPTIMIZERS[name]}, learning rate {rate:g},"
        )


def test_learning_rate_alone_keeps_the_compiled_optimizer() -> None:
    assert optimizer("--learning-rate", "0.01") is None  # not Adam: it waits for the model
    sgd = compiled(keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True))
    assert in_effect(sgd, "--learning-rate", "0.01") == OptimizerConfig(
        name="sgd", learning_rate=0.01, momentum=0.9, nesterov=True
    )
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert in_effect(compiled(keras.optimizers.RMSprop(schedule, rho=0.8)), "--learning-rate", "0.2") == (
        OptimizerConfig(name="rmsprop", learning_rate=0.2, rho=0.8)
    )


def test_hyper_parameter_flags_apply_on_top_of_the_compiled_optimizer() -> None:
    adamw = compiled(keras.optimizers.AdamW(0.0625, weight_decay=0.05, beta_2=0.95))  # rates exact in float32
    assert in_effect(
        adamw, "--beta-1", "0.8", "--amsgrad", "--exclude-from-weight-decay", "bias", "--global-clipnorm", "1"
    ) == OptimizerConfig(
        name="adamw",
        learning_rate=0.0625,
        weight_decay=0.05,
        beta_1=0.8,
        beta_2=0.95,
        amsgrad=True,
        exclude_from_weight_decay=("bias",),
        global_clipnorm=1.0,
    )
    sgd = compiled(keras.optimizers.SGD(0.125))
    assert in_effect(sgd, "--momentum", "0.9", "--nesterov", "--clipvalue", "0.5") == OptimizerConfig(
        name="sgd", learning_rate=0.125, momentum=0.9, nesterov=True, clipvalue=0.5
    )
    assert display_runs.describe_optimizer(in_effect(sgd, "--momentum", "0.9", "--learning-rate", "0.1")) == (
        "optimizer: SGD, learning rate 0.1, momentum 0.9, no weight decay, no clipping"
    )


def test_the_demo_trains_adam_at_its_rate_unless_told_otherwise() -> None:
    from slsml.client import demo

    model = demo.digits_cnn(learning_rate=cli_demo.DEMO_LEARNING_RATE)
    assert in_effect(model, command=("demo",)) is None
    assert in_effect(model, "--learning-rate", "0.01", command=("demo",)) == OptimizerConfig(
        name="adam", learning_rate=0.01
    )
    assert in_effect(model, "--optimizer", "sgd", command=("demo",)) == OptimizerConfig(
        name="sgd", learning_rate=cli_demo.DEMO_LEARNING_RATE
    )


@pytest.mark.parametrize(
    ("keras_optimizer", "flags", "message"),
    [
        (
            keras.optimizers.Adam(),
            ["--momentum", "0.9"],
            r"^--momentum does not apply to Adam \(only to SGD, RMSprop\)",
        ),
        (keras.optimizers.Adam(), ["--nesterov"], r"^--nesterov does not apply to Adam \(only to SGD\)"),
        (
            keras.optimizers.SGD(),
            ["--amsgrad", "--learning-rate", "0.1"],
            r"^--amsgrad does not apply to SGD \(only to Adam, AdamW\) \(the optimizer the model is compiled with"
            r" is SGD; --optimizer NAME replaces it\)$",
        ),
    ],
)
def test_a_flag_of_another_optimizer_is_an_error_naming_both(keras_optimizer, flags, message) -> None:
    with pytest.raises(BadInputError, match=message):
        in_effect(compiled(keras_optimizer), *flags)
    name = type(keras_optimizer).__name__.lower()
    with pytest.raises(BadInputError, match=message.split(r" \(the optimizer")[0]):  # named, the same
        optimizer("--optimizer", name, *flags, command=RUN_START)


def test_flags_on_an_uncompiled_model_need_an_optimizer() -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(BadInputError, match=r"the model is not compiled: give an optimizer \(e\.g\. --optimizer"):
        in_effect(model, "--learning-rate", "0.1")


@pytest.mark.parametrize("where", [["--local"], ["--stack", "no-such-stack"]])
def test_contradictory_flags_fail_on_one_line_before_anything_is_read(
    where: list[str], tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--optimizer", "adam", "--clipnorm", "1", "--global-clipnorm", "2"]
    code = cli.main(
        [
            "run",
            "start",
            *where,
            "--model",
            str(tmp_path / "missing.keras"),
            "--data",
            "d.npz",
            "--iterations",
            "3",
            *flags,
        ]
    )  # a missing model and no stack: the flags fail first
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
    assert display_runs.describe_optimizer(config) == (
        "optimizer: AdamW, learning rate CosineDecay(initial_learning_rate=0.001, decay_steps=100,"
        " warmup_target=0.01, warmup_steps=10), weight decay 0.004, global_clipnorm 1"
    )
    sgd = OptimizerConfig(
        name="sgd",
        learning_rate=0.05,
        momentum=0.9,
        nesterov=True,
        weight_decay=0.01,
        exclude_from_weight_decay=("bias", "gamma"),
        clipvalue=0.5,
    )
    assert display_runs.describe_optimizer(sgd) == (
        "optimizer: SGD, learning rate 0.05, momentum 0.9, nesterov, weight decay 0.01 (not on bias, gamma),"
        " clipvalue 0.5"
    )
    plain = "optimizer: Adam, learning rate 0.001, no weight decay, no clipping"
    assert display_runs.describe_optimizer(OptimizerConfig()) == plain
