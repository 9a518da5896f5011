"""Did preemption lose or count anything? The scheduling benchmark's check, pure.

Issue 14: "a preempted trial goes back to the queue and does not count as a failed
attempt". The benchmark taps every TrialStarted and TrialFailed of the preemptible
batch experiment (:class:`Attempt`) and reads the ledger's record of each trial that
was handed back; :func:`judge` says how many were preempted, and how many of them were
lost (no complete, scored record) or counted (an attempt above 1, a failure that is not
a non-final ``cancelled`` / ``Preempted``, or a record with more than one attempt).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PREEMPTED = "cancelled/Preempted"
"""A preemption's hand-back as :attr:`Attempt.failure` writes it (non-final TrialFailed,
failure class ``cancelled``, error type ``Preempted``; docs/scheduling.md)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One TrialStarted or TrialFailed of a trial, as the benchmark's tap saw it."""

    kind: str
    """``trial_started`` or ``trial_failed``."""
    attempt: int
    """The attempt number the event carries (a hand-back must not raise it)."""
    handed_back: int
    """A start's count of earlier hand-backs of the trial (0 on a TrialFailed)."""
    failure: str = ""
    """For a TrialFailed: ``<failure class>/<error type>``, and ``/final`` when final."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the ledger holds for a trial: its record's attempts and whether it is scored."""

    attempts: int
    """The record's ``attempts`` (1 unless an attempt failed and was retried)."""
    scored: bool
    """Whether the record counts in a score (``TrialRecord.scored``)."""


@dataclass(frozen=True, slots=True)
class PreemptionCheck:
    """The check's counts (``lost`` and ``counted`` must be 0)."""

    preempted: int
    """Trials handed back at least once by a preemption."""
    handbacks: int
    """Preemption hand-backs in all (a trial may be preempted more than once)."""
    restarted_max: int
    """The most hand-backs one trial took (its last start's ``handed_back``)."""
    lost: list[str]
    """Preempted trials without a scored record in the ledger."""
    counted: list[str]
    """Preempted trials whose hand-back counted as a failed attempt somewhere."""
    other_failures: int
    """TrialFailed events of the experiment that are not preemptions (should be 0)."""


def preempted_trials(history: Mapping[str, Sequence[Attempt]]) -> set[str]:
    """Trials with at least one preemption hand-back."""
    return {t for t, events in history.items() if any(e.failure == PREEMPTED for e in events)}


def judge(
    history: Mapping[str, Sequence[Attempt]], records: Mapping[str, Recorded | None]
) -> PreemptionCheck:
    """Judge the preempted trials of one experiment from its events and their records
    (``records``: the ledger's record of each preempted trial, None when it has none)."""
    preempted = sorted(preempted_trials(history))
    lost, counted = [], []
    for trial in preempted:
        events = history[trial]
        record = records.get(trial)
        if record is None or not record.scored:
            lost.append(trial)
        if (
            any(e.attempt != 1 for e in events)
            or any(e.kind == "trial_failed" and e.failure != PREEMPTED for e in events)
            or (record is not None and record.attempts != 1)
        ):
            counted.append(trial)
    handbacks = [e for events in history.values() for e in events if e.failure == PREEMPTED]
    others = [
        e
        for events in history.values()
        for e in events
        if e.kind == "trial_failed" and e.failure != PREEMPTED
    ]
    starts = [e.handed_back for t in preempted for e in history[t] if e.kind == "trial_started"]
    return PreemptionCheck(
        preempted=len(preempted),
        handbacks=len(handbacks),
        restarted_max=max(starts, default=0),
        lost=lost,
        counted=counted,
        other_failures=len(others),
    )
