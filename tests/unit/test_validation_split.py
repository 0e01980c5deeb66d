"""``validation_split`` as Keras's ``fit`` holds it out: the last fraction of the samples, before any shuffling; a
fraction drawn by the seed where the run asks for it (``validation_samples seeded``, ``--validation-samples``). One
function (``held_out``) chooses them for every reader: the workers, the evaluations, the run's length."""

from __future__ import annotations

import numpy as np
import pytest
from keras.src.trainers.data_adapters.array_slicing import train_validation_split  # what fit(validation_split) does
from pydantic import ValidationError

from slsml.cli import main as cli
from slsml.cli import options
from slsml.data import datasets as data
from slsml.pipeline import launch
from slsml.spec.config import TrainingSpec
from slsml.spec.errors import BadInputError


@pytest.mark.parametrize(("count", "split"), [(455, 0.2), (569, 0.2), (10, 0.25), (1000, 0.1), (7, 0.5), (3, 0.34)])
def test_the_held_out_samples_are_those_keras_fit_holds_out(count: int, split: float) -> None:
    indices = np.arange(count)
    keras_train, keras_val = train_validation_split((indices,), validation_split=split)
    trained, held = data.held_out(TrainingSpec(validation_split=split), count)
    np.testing.assert_array_equal(trained, np.asarray(keras_train[0]))
    np.testing.assert_array_equal(held, np.asarray(keras_val[0]))


def test_a_seeded_draw_holds_out_as_many_samples_by_the_seed() -> None:
    last = data.held_out(TrainingSpec(validation_split=0.2), 455)[1]
    spec = TrainingSpec(validation_split=0.2, validation_samples="seeded")
    trained, held = data.held_out(spec, 455)
    assert len(held) == len(last) and not set(trained) & set(held) and len(trained) + len(held) == 455
    assert held.tolist() != last.tolist() and held.tolist() == sorted(held.tolist())
    other = data.held_out(spec.model_copy(update={"seed": 1}), 455)[1]
    assert other.tolist() != held.tolist()
    assert launch.with_epochs(spec.model_copy(update={"epochs": 1, "global_batch": 64}), 455).iterations == 6


def test_a_split_that_leaves_no_sample_on_a_side_is_refused() -> None:
    with pytest.raises(BadInputError, match="leaves samples on both sides"):
        data.held_out(TrainingSpec(validation_split=0.1), 1)


def test_the_seeded_draw_is_a_flag_and_needs_a_split() -> None:
    start = ["run", "start", "--model", "m.keras", "--data", "d.npz", "--iterations", "3"]
    args = cli.build_parser().parse_args([*start, "--validation-split", "0.2", "--validation-samples", "seeded"])
    assert options.training_spec(args).validation_samples == "seeded"
    assert options.training_spec(cli.build_parser().parse_args(start)).validation_samples == "last"
    with pytest.raises(BadInputError, match=r"^--validation-samples applies to a --validation-split"):
        options.training_spec(cli.build_parser().parse_args([*start, "--validation-samples", "seeded"]))
    with pytest.raises(ValidationError, match="needs shuffle global"):
        TrainingSpec(validation_split=0.2, validation_samples="seeded", shuffle="blocks")
    assert TrainingSpec(validation_split=0.2, shuffle="blocks").validation_samples == "last"
