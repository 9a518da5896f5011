"""The e2e tests' in-flight count along an events stream (tests/e2e/events.py), which
the fair-share and quota tests judge concurrency by."""

from __future__ import annotations

from schemas.events import Event, TrialCompleted, TrialStarted
from tests.e2e.events import in_flight_counts
from tests.support.event_builders import trial_failed
from tests.support.sample_events import RESULT


def start(trial_id: str, attempt: int = 1, experiment_id: str = "e") -> TrialStarted:
    return TrialStarted(
        experiment_id=experiment_id, trial_id=trial_id, runner_id="r", host="h", attempt=attempt
    )


def done(trial_id: str) -> TrialCompleted:
    return TrialCompleted(experiment_id="e", trial_id=trial_id, result=RESULT, trial_name=trial_id)


def test_counts_after_each_start_and_ending_of_the_experiments_named() -> None:
    events: list[Event] = [start("a"), start("b"), start("x", experiment_id="other"), done("a")]
    assert in_flight_counts(events, {"e"}) == [1, 2, 1]
    assert in_flight_counts(events, {"e", "other"}) == [1, 2, 3, 2]
    assert in_flight_counts(events, {"none"}) == []


def test_a_retried_trial_is_in_flight_once_until_its_final_ending() -> None:
    events: list[Event] = [
        start("a"),
        trial_failed("a", final=False),  # not an ending: the trial will run again
        start("a", attempt=2),
        trial_failed("a", attempt=2, final=True),
    ]
    # Control: a count of starts would say 2 while the retry runs.
    assert in_flight_counts(events, {"e"}) == [1, 1, 0]


def test_an_ending_whose_start_came_before_takes_nothing_away() -> None:
    assert in_flight_counts([done("early"), start("a")], {"e"}) == [0, 1]
