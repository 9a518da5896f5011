"""Leaderboard and status arithmetic. Pure: records in, rows out.

Rules (docs/scoring.md, ``services.reports.scoring``): only records with a valid
reward are scored; an unscored trial (infrastructure, verifier failure, cancelled) is
shown with its cause and never enters a mean as a zero. A trial passes when its main
reward is at least 1.0. Every row carries its denominators, 95% intervals and pass@k;
a row with fewer than ``MIN_SCORED`` scored trials still carries its estimates and
intervals, flagged ``too_few`` (renderings grey them out), but no pass@k. Rows are
ranked by the lower bound of the mean reward's interval, not the point.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from schemas.record import TrialRecord
from services.common.ports import ExperimentInfo
from services.reports import stats
from services.reports.scoring import (
    MIN_SCORED,
    PASS_THRESHOLD,
    Estimate,
    estimate_mean,
    estimate_rate,
    group_key,
    is_binary,
    passes,
    scored_reward,
    unscored_cause,
)
from services.reports.tally import UNSCORED_PREFIX, count, tally_of

__all__ = [
    "MIN_SCORED",
    "PASS_THRESHOLD",
    "LeaderboardRow",
    "counts_of_tally",
    "leaderboard",
    "status_counts",
    "usage_totals",
]

USAGE_FIELDS: Final = ("n_input_tokens", "n_cache_tokens", "n_output_tokens", "cost_usd")


@dataclass(frozen=True, slots=True)
class LeaderboardRow:
    """One agent x model. Estimates are None only without a scored trial; ``too_few``
    flags those from fewer than ``min_scored``."""

    agent: str
    model: str | None
    n_trials: int
    n_recorded: int
    n_scored: int
    n_pending: int
    unscored_by_cause: dict[str, int] = field(default_factory=dict)
    mean_reward: float | None = None
    pass_rate: float | None = None
    n_passed: int = 0
    n_unscored: int = 0
    too_few: bool = True
    min_scored: int = MIN_SCORED
    binary_rewards: bool = False
    mean_reward_ci: list[float] | None = None
    mean_reward_ci_method: str | None = None
    pass_rate_ci: list[float] | None = None
    pass_at_k: dict[int, float] = field(default_factory=dict)
    pass_at_k_tasks: int = 0
    main_reward_keys: list[str] = field(default_factory=list)
    reward_keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (pass@k keys become strings, as JSON object keys must)."""
        data = asdict(self)
        data["pass_at_k"] = {str(k): v for k, v in self.pass_at_k.items()}
        return data


def expected_per_agent(info: ExperimentInfo | None) -> dict[tuple[str, str | None], int]:
    """Trials each agent x model should have, from the submitted manifest."""
    if info is None:
        return {}
    agents = info.manifest.get("agents") or []
    if not agents:
        return {}
    per_agent = info.n_trials // len(agents)
    out: dict[tuple[str, str | None], int] = {}
    for a in agents:
        label = a.get("label") or a.get("name") or a.get("import_path") or "?"
        # Agents that share a label and model share a row (see group_key): add, not replace.
        key = (label, a.get("model"))
        out[key] = out.get(key, 0) + per_agent
    return out


def pass_counts_by_task(records: Iterable[TrialRecord]) -> dict[str, tuple[int, int]]:
    """task name -> (scored attempts, passed attempts), over scored records only."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for rec in records:
        reward = scored_reward(rec)
        if reward is not None:
            entry = counts[rec.provenance.task_name]
            entry[0] += 1
            entry[1] += passes(reward)
    return {task: (n, c) for task, (n, c) in sorted(counts.items())}


def reward_key_means(
    scored: Sequence[TrialRecord], min_n: int, main: tuple[str, Estimate] | None = None
) -> dict[str, dict[str, Any]]:
    """Per reward key: mean over the scored trials that report that key, with its interval.

    ``main``: (key, estimate) when every scored trial's main reward is that key, whose
    estimate is then reused rather than computed twice.
    """
    by_key: dict[str, list[float]] = defaultdict(list)
    for rec in scored:
        for key, value in rec.evaluation.rewards.items():
            by_key[key].append(float(value))
    return {
        key: (main[1] if main and key == main[0] else estimate_mean(values, min_n)).as_dict()
        for key, values in sorted(by_key.items())
    }


def usage_totals(
    records: Sequence[TrialRecord], scored: Sequence[TrialRecord]
) -> dict[str, dict[str, Any]]:
    """Tokens and cost, and how many trials each figure covers.

    Per field (``USAGE_FIELDS``), whenever there are records: ``sum`` over the trials
    that report it (``n_reported`` of ``n_recorded``; unscored trials cost money too),
    None when none does: unknown, never 0. ``n_unknown`` trials report nothing (no
    price for the model, or the agent did not report usage): a sum over a mix covers
    only the others, and every rendering says so. ``mean_per_scored`` is the mean over
    the ``n_scored_reported`` of ``n_scored`` scored trials that report it.
    """
    if not records:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name in USAGE_FIELDS:
        values = [v for r in records if (v := getattr(r.usage, name)) is not None]
        per_scored = [v for r in scored if (v := getattr(r.usage, name)) is not None]
        total: float | int | None = None
        if values:
            total = math.fsum(values) if name == "cost_usd" else sum(values)
        out[name] = {
            "n_recorded": len(records),
            "n_reported": len(values),
            "n_unknown": len(records) - len(values),
            "sum": total,
            "n_scored": len(scored),
            "n_scored_reported": len(per_scored),
            "mean_per_scored": stats.mean(per_scored) if per_scored else None,
        }
    return out


def build_row(
    key: tuple[str, str | None], recs: Sequence[TrialRecord], n_trials: int, min_scored: int
) -> LeaderboardRow:
    """One leaderboard row from the records of one agent x model."""
    scored = [r for r in recs if scored_reward(r) is not None]
    rewards = [r for rec in scored if (r := scored_reward(rec)) is not None]
    causes = Counter(unscored_cause(r) for r in recs if scored_reward(r) is None)
    n_passed = sum(1 for v in rewards if passes(v))
    mean = estimate_mean(rewards, min_scored)
    rate = estimate_rate(n_passed, len(rewards), min_scored)
    by_task = pass_counts_by_task(scored)
    main_keys = sorted({k for r in scored if (k := r.evaluation.main_reward_key)})
    return LeaderboardRow(
        agent=key[0],
        model=key[1],
        n_trials=n_trials,
        n_recorded=len(recs),
        n_scored=len(scored),
        n_pending=n_trials - len(recs),
        unscored_by_cause=dict(sorted(causes.items())),
        mean_reward=mean.value,
        pass_rate=rate.value,
        n_passed=n_passed,
        n_unscored=len(recs) - len(scored),
        too_few=mean.too_few,
        min_scored=min_scored,
        binary_rewards=is_binary(rewards),
        mean_reward_ci=mean.interval.as_list() if mean.interval else None,
        mean_reward_ci_method=mean.interval.method if mean.interval else None,
        pass_rate_ci=rate.interval.as_list() if rate.interval else None,
        pass_at_k={} if mean.too_few else stats.pass_at_k(by_task),
        pass_at_k_tasks=0 if mean.too_few else len(by_task),
        main_reward_keys=main_keys,
        reward_keys=reward_key_means(
            scored, min_scored, (main_keys[0], mean) if len(main_keys) == 1 else None
        ),
        usage=usage_totals(recs, scored),
    )


def rank_key(row: LeaderboardRow) -> tuple[int, float, float, str, str]:
    """Rows with enough scored trials first, then rows with too few, then rows with
    none; within each, by the lower bound of the mean reward's interval (then the
    mean, then the name)."""
    tier = 2 if not row.n_scored else 1 if row.too_few else 0
    low = row.mean_reward_ci[0] if row.mean_reward_ci else (row.mean_reward or 0.0)
    return (tier, -low, -(row.mean_reward or 0.0), row.agent, row.model or "")


def leaderboard(
    records: Iterable[TrialRecord],
    info: ExperimentInfo | None = None,
    *,
    min_scored: int = MIN_SCORED,
) -> list[LeaderboardRow]:
    """Rows ranked by ``rank_key``: best lower bound first, unscored rows last."""
    groups: dict[tuple[str, str | None], list[TrialRecord]] = defaultdict(list)
    for rec in records:
        groups[group_key(rec)].append(rec)
    expected = expected_per_agent(info)
    rows = [
        build_row(
            key,
            groups.get(key, []),
            max(expected.get(key, 0), len(groups.get(key, []))),
            min_scored,
        )
        for key in set(groups) | set(expected)
    ]
    return sorted(rows, key=rank_key)


def status_counts(records: Iterable[TrialRecord], info: ExperimentInfo | None) -> dict[str, int]:
    """Counts by state: scored, unscored (by cause), partial, pending, total."""
    return counts_of_tally(tally_of(records), info)


def counts_of_tally(tally: Mapping[str, float], info: ExperimentInfo | None) -> dict[str, int]:
    """``status_counts`` from an experiment's tally (``services.reports.tally``): the
    same numbers whether the tally was summed from records or kept by the ledger."""
    recorded = count(tally, "recorded")
    total = max(info.n_trials if info else 0, recorded)
    causes = sorted(k for k in tally if k.startswith(UNSCORED_PREFIX) and count(tally, k))
    counts = {
        "total": total,
        "recorded": recorded,
        "pending": total - recorded,
        "scored": count(tally, "scored"),
        "unscored": sum(count(tally, k) for k in causes),
        "complete": count(tally, "complete"),
        "partial": count(tally, "partial"),
    }
    for key in causes:
        counts[key] = count(tally, key)
    return counts
