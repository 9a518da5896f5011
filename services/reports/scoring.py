"""The scoring rules every report applies (docs/scoring.md). Pure, no I/O.

- A record is *scored* when its reward counts (``Evaluation.reward_valid``, set by the
  importer from Harbor's own error policy) and it has a main reward. Unscored records
  are counted by cause and never enter a mean, as zeros or otherwise.
- A trial *passes* when its main reward is at least ``PASS_THRESHOLD``.
- An estimate from fewer than ``MIN_SCORED`` scored trials is still given, number and
  interval, flagged ``too_few``: renderings grey it out rather than hide it. Only an
  estimate from no trial at all is None (and a bootstrap interval from one value,
  which would claim a point: a single value says nothing of its spread).
- An unscored record's cause is its failure class, except for failure class ``none``
  (nothing failed, yet the reward does not count): ``invalid_reward`` when the verifier
  gave a reward that is not a finite number (NaN, a string, a list), ``no_reward``
  when it gave none (``unscored_cause``).
- Means of rewards that are all 0 or 1 are proportions: their interval is Wilson's
  (a bootstrap collapses to a point at 0/n and n/n). Other means get a seeded
  percentile bootstrap interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from schemas.record import TrialRecord
from services.reports import stats

PASS_THRESHOLD: Final = 1.0
"""A trial passes when its main reward is at least this."""

MIN_SCORED: Final = 5
"""Fewest scored trials (or paired tasks) for which an estimate is shown."""


def group_key(rec: TrialRecord) -> tuple[str, str | None]:
    """The leaderboard row of a record: (agent label or name, model)."""
    p = rec.provenance
    return (p.agent_label or p.agent_name, p.model)


def scored_reward(rec: TrialRecord) -> float | None:
    """The record's main reward if it counts in a score, else None."""
    ev = rec.evaluation
    return float(ev.main_reward) if ev.reward_valid and ev.main_reward is not None else None


def unscored_cause(rec: TrialRecord) -> str:
    """Why an unscored record does not count: its failure class, or for class ``none``
    ``invalid_reward`` (the verifier named a main reward the importer could not use)
    or ``no_reward`` (it named none).

    Derived, not stored: the importer keeps the main reward's key even when it drops
    the value (services/importer/scoring.py), so the record says which case it is.
    """
    ev = rec.evaluation
    if ev.failure_class != "none":
        return ev.failure_class
    return "invalid_reward" if ev.main_reward_key is not None else "no_reward"


def passes(reward: float) -> bool:
    """Whether a main reward is a pass."""
    return reward >= PASS_THRESHOLD


def is_binary(values: Sequence[float]) -> bool:
    """Whether every value is exactly 0 or 1 (and there is at least one)."""
    return bool(values) and all(v in (0.0, 1.0) for v in values)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with its 95% interval; ``too_few`` flags one from fewer than the
    minimum count (still given: readers see it greyed out)."""

    n: int
    value: float | None
    interval: stats.Interval | None
    too_few: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON form: n, value, ci ([low, high] or None), ci_method, too_few."""
        return {
            "n": self.n,
            "value": self.value,
            "ci": self.interval.as_list() if self.interval else None,
            "ci_method": self.interval.method if self.interval else None,
            "too_few": self.too_few,
        }


def estimate_mean(values: Sequence[float], min_n: int = MIN_SCORED) -> Estimate:
    """Mean with a Wilson (binary values) or bootstrap interval, ``too_few`` below
    ``min_n``; None for no value, and no bootstrap interval from a single value."""
    n = len(values)
    if n == 0:
        return Estimate(0, None, None, too_few=min_n > 0)
    interval: stats.Interval | None
    if is_binary(values):
        interval = stats.wilson_interval(sum(1 for v in values if v == 1.0), n)
    else:
        interval = stats.bootstrap_mean_interval(values) if n > 1 else None
    return Estimate(n, stats.mean(values), interval, too_few=n < min_n)


def estimate_rate(successes: int, n: int, min_n: int = MIN_SCORED) -> Estimate:
    """Proportion with its Wilson interval (defined at any n > 0), ``too_few`` below
    ``min_n``; None for n = 0."""
    if n == 0:
        return Estimate(0, None, None, too_few=min_n > 0)
    return Estimate(n, successes / n, stats.wilson_interval(successes, n), too_few=n < min_n)
