"""Which running trials a runner hands back, and why: preemption and stop notices.

A trial handed back is stopped through the executor's cancel path, recorded with a
non-final TrialFailed (failure class ``cancelled``, error type ``Preempted`` or
``StopNotice``), its attempt taken back (not counted against ``max_attempts``), and
its work message nak'ed with no delay, so another slot runs it again from the start.

Two reasons (docs/scheduling.md):

- **preempted**: the runner has no free slot, a class of a higher weight has work
  waiting on this runner's durables, and a trial of a lower class whose experiment
  opted in (``compute.preemptible``) holds a slot. The lowest class goes first, then
  the trial started last (the least work lost); never more trials than the higher
  classes have waiting.
- **stop_notice**: the runner got SIGTERM with a deadline (a spot instance's notice):
  every trial that cannot finish before the deadline goes at once (one whose time
  limit is unknown is assumed not to), the others may finish; at the deadline,
  whatever still runs goes too.

The decisions are pure functions over :class:`RunningTrial` snapshots
(tests/unit/test_runner_preemption.py); :class:`Running` is the registry the handler
fills and the consumer reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from schemas.events import TrialRequested

Reason = Literal["preempted", "stop_notice"]
ERROR_TYPE: dict[Reason, str] = {"preempted": "Preempted", "stop_notice": "StopNotice"}
"""The TrialFailed ``error_type`` of each reason (failure class ``cancelled``)."""


@dataclass(eq=False)
class RunningTrial:
    """One trial whose executor runs on this runner, and how to hand it back."""

    run_id: str
    priority_class: str
    """The trial's class, resolved (the default class when its manifest names none)."""
    preemptible: bool
    started: float
    """When its executor started (monotonic seconds)."""
    time_limit_s: float | None
    """The most the attempt may take, when the executor knows (None: unknown)."""
    reason: Reason | None = None
    """Set once the trial is asked to go; it is then stopped and handed back."""
    limit_of: Callable[[], float | None] | None = field(default=None, repr=False)
    """Asks the executor for the time limit again: it may learn it only once the
    attempt started (the Harbor executor reads the task's timeouts then)."""
    _stop: Callable[[], None] | None = field(default=None, repr=False)

    def refresh_limit(self) -> None:
        """Take the executor's time limit if it knows one by now."""
        if self.time_limit_s is None and self.limit_of is not None:
            self.time_limit_s = self.limit_of()

    def bind(self, stop: Callable[[], None]) -> None:
        """What stops the attempt (its run task's cancel); a request already made
        stops it at once."""
        self._stop = stop
        if self.reason is not None:
            stop()

    def hand_back(self, reason: Reason) -> bool:
        """Ask the trial to go; False when it was asked already."""
        if self.reason is not None:
            return False
        self.reason = reason
        if self._stop is not None:
            self._stop()
        return True


class Running:
    """The trials running on this runner (the handler adds and removes them)."""

    def __init__(self) -> None:
        self._trials: set[RunningTrial] = set()
        self.changed = asyncio.Event()
        """Set whenever a trial leaves: a stop notice waits on it."""

    def add(self, trial: RunningTrial) -> None:
        """A trial's executor started."""
        self._trials.add(trial)

    def remove(self, trial: RunningTrial) -> None:
        """A trial's executor ended (or it was handed back)."""
        self._trials.discard(trial)
        self.changed.set()

    def snapshot(self) -> list[RunningTrial]:
        """The trials running now."""
        return list(self._trials)

    def __len__(self) -> int:
        return len(self._trials)


def victims(
    running: Sequence[RunningTrial],
    waiting: Mapping[str, int],
    weights: Mapping[str, int],
    free_slots: int,
) -> list[tuple[RunningTrial, str]]:
    """The trials to preempt for the ``waiting`` work (class -> messages waiting), each
    with the class it makes room for.

    None while the runner has a free slot (the fetch loop takes the waiting work
    within a second). Otherwise, one victim per waiting message of a higher class,
    each of a class of lower weight than the class it makes room for, lowest class
    first, then the youngest; trials already asked to go count as room being made.
    """
    if free_slots > 0:
        return []
    going = sum(1 for t in running if t.reason is not None)
    candidates = sorted(
        (t for t in running if t.preemptible and t.reason is None),
        key=lambda t: (weights.get(t.priority_class, 0), -t.started),
    )
    chosen: list[tuple[RunningTrial, str]] = []
    for cls in sorted(waiting, key=lambda c: (-weights.get(c, 0), c)):
        need = waiting[cls]
        weight = weights.get(cls, 0)
        while need > 0:
            if going > 0:  # a slot is already being freed for waiting work
                going -= 1
                need -= 1
                continue
            if not candidates or weights.get(candidates[0].priority_class, 0) >= weight:
                break
            chosen.append((candidates.pop(0), cls))
            need -= 1
    return chosen


def cannot_finish(
    running: Iterable[RunningTrial], now: float, deadline: float
) -> list[RunningTrial]:
    """The trials that cannot end before ``deadline`` (monotonic seconds): their
    executor's time limit runs past it, or is unknown."""
    return [
        t
        for t in running
        if t.reason is None and (t.time_limit_s is None or t.started + t.time_limit_s > deadline)
    ]


def higher_classes(running: Iterable[RunningTrial], weights: Mapping[str, int]) -> list[str]:
    """The classes whose waiting work could preempt one of the ``running`` trials:
    those of a greater weight than the lightest preemptible trial running (empty when
    none is preemptible: then nothing needs to be looked at)."""
    lightest = min(
        (weights.get(t.priority_class, 0) for t in running if t.preemptible and t.reason is None),
        default=None,
    )
    if lightest is None:
        return []
    return [c for c, w in weights.items() if w > lightest]


def time_limit(executor: object, request: TrialRequested) -> float | None:
    """The most the attempt of ``request`` may take on ``executor``, when it says so
    through an optional ``time_limit_s(request)`` method (None: unknown, and a stop
    notice then assumes the trial cannot finish in time)."""
    limit = getattr(executor, "time_limit_s", None)
    if limit is None:
        return None
    value = limit(request)
    return float(value) if value is not None else None
