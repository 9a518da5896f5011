"""The scheduling benchmark's arithmetic, pure: shares over a window, rates, ratios.

Everything here works on event timestamps (seconds since the epoch, taken from the
events' ``occurred_at``) and never does I/O, so ``tests/unit/test_bench_scheduling_math.py``
can check each figure the benchmark publishes against hand-computed values.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Window:
    """A half-open interval ``[start, end)`` of wall-clock seconds."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError(f"empty window: end {self.end} is not after start {self.start}")

    @property
    def seconds(self) -> float:
        """The window's length."""
        return self.end - self.start

    def holds(self, t: float) -> bool:
        """Whether ``t`` falls in the window (its end excluded)."""
        return self.start <= t < self.end


def count_in(times: Iterable[float], window: Window) -> int:
    """How many of ``times`` fall in ``window``."""
    return sum(1 for t in times if window.holds(t))


def rate(times: Iterable[float], window: Window) -> float:
    """Events per second in ``window``."""
    return count_in(times, window) / window.seconds


def whole_trials(seconds: float, trial_s: float) -> float:
    """``seconds`` rounded up to whole trial lengths: a rate counted over such a window
    does not depend on where it falls among trials that start in waves."""
    if trial_s <= 0:
        raise ValueError(f"the trial length must be positive, got {trial_s}")
    return trial_s * math.ceil(seconds / trial_s)


def shares_in(starts: Iterable[tuple[str, float]], window: Window) -> dict[str, float]:
    """Each team's fraction of the ``(team, time)`` starts that fall in ``window``.

    Raises ValueError when no start falls in it: a share of nothing is no measurement
    (the benchmark's window must be chosen inside the busy period).
    """
    counts = Counter(team for team, t in starts if window.holds(t))
    total = sum(counts.values())
    if total == 0:
        raise ValueError(f"no start in the window [{window.start}, {window.end})")
    return {team: n / total for team, n in counts.items()}


def normalise(weights: Mapping[str, float]) -> dict[str, float]:
    """Configured shares (any positive weights, e.g. ``{a: 1, b: 3}``) as fractions."""
    if any(w <= 0 for w in weights.values()) or not weights:
        raise ValueError(f"shares must be positive weights, got {dict(weights)}")
    total = sum(weights.values())
    return {team: w / total for team, w in weights.items()}


def share_deviation(measured: Mapping[str, float], configured: Mapping[str, float]) -> float:
    """The largest gap, in fraction of the pool, between a team's measured and configured
    share (a team absent from ``measured`` got 0); the issue's target is 0.05."""
    target = normalise(configured)
    return max(abs(measured.get(team, 0.0) - share) for team, share in target.items())


def latency_ratio(contended_s: float, alone_s: float) -> float:
    """How many times longer something took beside other work than alone (1.0: the
    same); the issue's target for the urgent team is at most 1.10."""
    if alone_s <= 0:
        raise ValueError(f"the time alone must be positive, got {alone_s}")
    return contended_s / alone_s


def loss(before: float, during: float) -> float:
    """The fraction of a rate lost (0: none, 1: all; negative: it rose)."""
    if before <= 0:
        raise ValueError(f"the rate before must be positive, got {before}")
    return 1.0 - during / before


def class_share(weights: Mapping[str, int], waiting: Sequence[str], cls: str) -> float:
    """The fraction of starts the runners' weighted round robin gives ``cls`` while the
    ``waiting`` classes all wait (services/runner/selection.py): its weight over theirs."""
    if cls not in waiting:
        raise ValueError(f"class {cls!r} is not among the waiting {list(waiting)}")
    return weights[cls] / sum(weights[c] for c in waiting)


def waves_s(n: int, slots: int, trial_s: float) -> float:
    """How long ``n`` trials of ``trial_s`` take on ``slots`` free slots: they start in
    waves of ``slots``, ceil(n / slots) trials' lengths (imports and dispatch left out)."""
    return -(-n // slots) * trial_s


def trickle_s(n: int, slots: int, trial_s: float, share: float, wait_s: float) -> float:
    """How long ``n`` trials of ``trial_s`` take behind a full fleet of ``slots`` busy with
    trials as long: their first waits ``wait_s``, then they get ``share`` of the
    ``slots / trial_s`` starts a second as slots free, and the last one runs a whole
    trial (imports and dispatch left out). An estimate: slots that free together (a
    fleet whose trials started in waves) serve the first of them faster."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    return wait_s + n / (share * slots / trial_s) + trial_s


def in_flight(spans: Iterable[tuple[float, float]], window: Window) -> float:
    """How many of the ``(start, end)`` spans ran at once on average over ``window``
    (their overlap with it over its length): a team's slots in use."""
    busy = sum(max(0.0, min(end, window.end) - max(start, window.start)) for start, end in spans)
    return busy / window.seconds
