"""The scheduling benchmark's preemption check finds a lost or counted preempted trial.

``benchmarks.scheduling_preemption.judge`` reads a preemptible experiment's starts and
failures (as its event tap saw them) and the ledger's records of its preempted trials:
a preempted trial must be recorded, scored, at attempt 1, with no failure but its
non-final ``cancelled`` / ``Preempted`` hand-backs. Each way of breaking that is a
negative control that must show in the counts.
"""

from __future__ import annotations

from benchmarks.scheduling_preemption import (
    PREEMPTED,
    Attempt,
    Recorded,
    judge,
    preempted_trials,
)

START0 = Attempt("trial_started", 1, 0)
HANDED = Attempt("trial_failed", 1, 0, PREEMPTED)
START1 = Attempt("trial_started", 1, 1)
GOOD = Recorded(attempts=1, scored=True)


def test_a_preempted_trial_run_again_and_recorded_once_is_neither_lost_nor_counted() -> None:
    history = {"t1": [START0, HANDED, START1], "t2": [START0]}
    check = judge(history, {"t1": GOOD})
    assert preempted_trials(history) == {"t1"}
    assert (check.preempted, check.handbacks, check.restarted_max) == (1, 1, 1)
    assert check.lost == [] and check.counted == [] and check.other_failures == 0


def test_a_preempted_trial_without_a_scored_record_is_lost() -> None:
    history = {"t1": [START0, HANDED, START1]}
    assert judge(history, {"t1": None}).lost == ["t1"]
    assert judge(history, {}).lost == ["t1"]
    assert judge(history, {"t1": Recorded(attempts=1, scored=False)}).lost == ["t1"]


def test_a_hand_back_counted_as_an_attempt_shows() -> None:
    # The restart came as attempt 2, or the record says 2 attempts, or the hand-back
    # was a final failure: each is counted.
    assert judge(
        {"t1": [START0, HANDED, Attempt("trial_started", 2, 1)]}, {"t1": GOOD}
    ).counted == ["t1"]
    assert judge({"t1": [START0, HANDED, START1]}, {"t1": Recorded(2, True)}).counted == ["t1"]
    final = Attempt("trial_failed", 1, 0, PREEMPTED + "/final")
    check = judge({"t1": [START0, HANDED, final]}, {"t1": GOOD})
    assert check.counted == ["t1"] and check.other_failures == 1


def test_other_failures_of_the_experiment_are_counted_and_not_preemptions() -> None:
    failed = Attempt("trial_failed", 1, 0, "infrastructure/OSError")
    check = judge({"t9": [START0, failed]}, {})
    assert check.preempted == 0 and check.other_failures == 1 and check.lost == []
