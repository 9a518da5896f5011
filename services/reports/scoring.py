"""The scoring rules every report applies (docs/scoring.md). Pure, no I/O.

- A record is *scored* when its reward counts (``Evaluation.reward_valid``, set by the
  importer from Harbor's own error policy) and it has a main reward. Unscored records
  are counted by cause and never enter a mean, as zeros or otherwise.
- A trial *passes* when its main reward is at least ``PASS_THRESHOLD``.
- An estimate from fewer than ``MIN_SCORED`` scored trials is not shown: the count is,
  with ``too_few`` set, and the number and its interval are None.
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


def passes(reward: float) -> bool:
    """Whether a main reward is a pass."""
    return reward >= PASS_THRESHOLD


def is_binary(values: Sequence[float]) -> bool:
    """Whether every value is exactly 0 or 1 (and there is at least one)."""
    return bool(values) and all(v in (0.0, 1.0) for v in values)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with its 95% interval, or neither when ``too_few``."""

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
    """Mean with a Wilson (binary values) or bootstrap interval; None below ``min_n``."""
    n = len(values)
    if n == 0 or n < min_n:
        return Estimate(n, None, None, too_few=n < min_n)
    if is_binary(values):
        interval = stats.wilson_interval(sum(1 for v in values if v == 1.0), n)
    else:
        interval = stats.bootstrap_mean_interval(values)
    return Estimate(n, stats.mean(values), interval, too_few=False)


def estimate_rate(successes: int, n: int, min_n: int = MIN_SCORED) -> Estimate:
    """Proportion with its Wilson interval; None below ``min_n``."""
    if n == 0 or n < min_n:
        return Estimate(n, None, None, too_few=n < min_n)
    return Estimate(n, successes / n, stats.wilson_interval(successes, n), too_few=False)
