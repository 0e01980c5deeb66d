"""The worker-count tuner: one ladder step per round at most, toward what measurements (or, for counts not
tried, the cost model's ratios) say is best for the objective, within the run's bounds."""

from __future__ import annotations

from slsml.pipeline import tuner
from slsml.pipeline.tuner import TunerState


def _measured(state: TunerState, workers: int, *seconds: float) -> TunerState:
    for value in (99.0, *seconds):  # the first round at a count starts containers: left out
        state = tuner.measure(state, workers, value)
    return state


def compute_bound(workers: int) -> tuple[float, float]:
    """A model whose rounds are mostly compute: seconds fall with the workers, dollars rise."""
    return 0.2 + 4.0 / workers, 1e-5 * workers


def test_steps_follow_the_ladder_within_the_bounds():
    assert tuner.steps(4, (2, 8)) == [3, 6]
    assert tuner.steps(8, (2, 8)) == [6]
    assert tuner.steps(2, (2, 8)) == [3]
    assert tuner.steps(5, (1, 1000)) == [4, 6]
    assert tuner.steps(7, (7, 7)) == []


def test_the_first_round_at_a_count_is_left_out():
    state = tuner.measure(TunerState(), 2, 5.0)
    assert state.measured[2].seconds == []
    assert tuner.measure(state, 2, 1.0).measured[2].seconds == [1.0]


def test_no_move_before_enough_rounds_are_measured():
    state = _measured(TunerState(), 2, 1.0)
    decision = tuner.decide(state, 3, 2, "time", (2, 8), compute_bound)
    assert decision.workers == 2 and decision.reason is None and decision.state.tuned == 3


def test_time_moves_one_step_toward_what_the_model_predicts_faster():
    state = _measured(TunerState(), 2, 2.2, 2.2)
    decision = tuner.decide(state, 4, 2, "time", (2, 8), compute_bound)
    assert decision.workers == 3  # one step, though 8 is predicted fastest
    assert "predicted" in decision.reason and "at 3" in decision.reason


def test_a_measured_count_outweighs_the_prediction():
    """At 3 the rounds measure slower than at 2, whatever the model says: back to 2, and 2 stays."""
    state = _measured(_measured(TunerState(), 2, 1.0, 1.0), 3, 1.5, 1.5)
    decision = tuner.decide(state, 8, 3, "time", (2, 8), compute_bound)
    assert decision.workers == 2 and "measured" in decision.reason
    state = _measured(decision.state, 2, 1.0)
    assert tuner.decide(state, 9, 2, "time", (2, 8), lambda w: (1.0, 0.0)).workers == 2


def test_no_move_for_less_than_the_margin():
    state = _measured(_measured(_measured(TunerState(), 4, 1.0, 1.0), 3, 0.98, 0.98), 6, 0.97)
    nearly_flat = lambda w: (1.0 - 0.01 * w, 0.0)  # noqa: E731
    assert tuner.decide(state, 9, 4, "time", (2, 8), nearly_flat).workers == 4


def test_time_tries_a_neighbour_the_model_does_not_predict_clearly_slower():
    """The model predicts no gain: the neighbour predicted best is tried once; measured slower, the run goes
    back and stays, without trying it again."""
    flat = lambda w: (1.0, 0.0)  # noqa: E731
    state = _measured(TunerState(), 2, 1.0, 1.0)
    trial = tuner.decide(state, 3, 2, "time", (2, 8), flat)
    assert trial.workers == 3 and "not tried" in trial.reason
    state = _measured(trial.state, 3, 1.3, 1.3)
    back = tuner.decide(state, 7, 3, "time", (2, 8), flat)
    assert back.workers == 2 and "measured" in back.reason
    state = _measured(back.state, 2, 1.0, 1.0)
    assert tuner.decide(state, 11, 2, "time", (2, 8), flat).workers == 2
    slower = lambda w: (1.0 + 0.2 * w, 0.0)  # noqa: E731
    assert tuner.decide(_measured(TunerState(), 2, 1.0, 1.0), 3, 2, "time", (2, 8), slower).workers == 2


def test_cost_scales_in_to_the_lower_bound_one_step_a_round():
    state, workers, path = TunerState(), 8, []
    for round_ in range(20):
        state = tuner.measure(state, workers, 1.0)
        decision = tuner.decide(state, round_, workers, "cost", (2, 8), compute_bound)
        state, workers = decision.state, decision.workers
        path.append(workers)
    assert path[-1] == 2
    assert all(b in (a, *tuner.steps(a, (2, 8))) for a, b in zip([8, *path], path, strict=False))
    assert min(path) == 2
