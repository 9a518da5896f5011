"""The full report of an experiment: leaderboard, per-task matrix, failure causes. Pure.

``build_report`` returns plain JSON-ready data; the CLI tables, the HTML page and the
HTTP API all render this one structure, so they cannot disagree.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from schemas.record import TrialRecord
from services.common.ports import ExperimentInfo
from services.reports import formatting, stats
from services.reports.budget import budget_usage
from services.reports.leaderboard import LeaderboardRow, leaderboard, status_counts, usage_totals
from services.reports.scoring import (
    MIN_SCORED,
    PASS_THRESHOLD,
    estimate_rate,
    group_key,
    passes,
    scored_reward,
    unscored_cause,
)

REPORT_VERSION = 1


def scoring_rules(min_scored: int) -> dict[str, Any]:
    """The parameters every figure in a report was computed with."""
    return {
        "min_scored": min_scored,
        "pass_threshold": PASS_THRESHOLD,
        "confidence": stats.CONFIDENCE,
        "bootstrap_resamples": stats.BOOTSTRAP_RESAMPLES,
        "bootstrap_seed": stats.BOOTSTRAP_SEED,
        "rank_by": "lower bound of the mean reward's 95% interval",
        "documentation": "docs/scoring.md",
    }


def cell_outcome(n_recorded: int, n_scored: int, n_passed: int) -> str:
    """A task x agent cell in one word: ``passed`` (every scored attempt passed),
    ``failed`` (none did), ``mixed``, ``unscored`` (recorded, none scored: see the
    cell's causes) or ``pending`` (no record yet)."""
    if not n_recorded:
        return "pending"
    if not n_scored:
        return "unscored"
    if n_passed == n_scored:
        return "passed"
    return "failed" if n_passed == 0 else "mixed"


def task_cell(records: Sequence[TrialRecord], min_scored: int) -> dict[str, Any]:
    """One task x agent: outcome, counts, rate and mean (None without a scored attempt;
    ``too_few`` below ``min_scored``)."""
    rewards = [r for rec in records if (r := scored_reward(rec)) is not None]
    n_passed = sum(1 for v in rewards if passes(v))
    causes = Counter(unscored_cause(r) for r in records if scored_reward(r) is None)
    rate = estimate_rate(n_passed, len(rewards), min_scored)
    return {
        "outcome": cell_outcome(len(records), len(rewards), n_passed),
        "n_recorded": len(records),
        "n_scored": len(rewards),
        "n_passed": n_passed,
        "unscored_by_cause": dict(sorted(causes.items())),
        "too_few": rate.too_few,
        "pass_rate": rate.value,
        "pass_rate_ci": rate.interval.as_list() if rate.interval else None,
        "mean_reward": stats.mean(rewards) if rewards else None,
    }


def task_matrix(
    records: Iterable[TrialRecord], rows: Sequence[LeaderboardRow], min_scored: int
) -> list[dict[str, Any]]:
    """Per task (sorted by name): one cell per leaderboard row, in leaderboard order."""
    by_task: dict[str, dict[tuple[str, str | None], list[TrialRecord]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for rec in records:
        by_task[rec.provenance.task_name][group_key(rec)].append(rec)
    return [
        {
            "task": task,
            "cells": [
                {
                    "agent": row.agent,
                    "model": row.model,
                    **task_cell(cells.get((row.agent, row.model), []), min_scored),
                }
                for row in rows
            ],
        }
        for task, cells in sorted(by_task.items())
    ]


def failure_causes(records: Iterable[TrialRecord]) -> list[dict[str, Any]]:
    """Every exception seen, by class and type: how many, whether scored, which agents.

    Agent-class exceptions (an agent timeout) are listed too: they are the agent's
    failures and were scored; all other classes were not.
    """
    table: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for rec in records:
        ev = rec.evaluation
        unscored = scored_reward(rec) is None
        if ev.failure_class == "none" and ev.exception_type is None and not unscored:
            continue
        # An unscored trial without an exception is listed by its cause (invalid_reward,
        # no_reward): no exception, but not nothing.
        cls = unscored_cause(rec) if unscored else ev.failure_class
        etype = ev.exception_type or ("-" if ev.failure_class == "none" else "unknown")
        agent, model = group_key(rec)
        label = formatting.agent_at(agent, model)
        table[(cls, etype)][label] += 1
    return [
        {
            "failure_class": cls,
            "exception_type": etype,
            "scored": cls in ("none", "agent"),
            "count": sum(by_agent.values()),
            "by_agent": dict(sorted(by_agent.items())),
        }
        for (cls, etype), by_agent in sorted(
            table.items(), key=lambda item: (-sum(item[1].values()), item[0])
        )
    ]


def build_report(
    experiment_id: str,
    records: Iterable[TrialRecord],
    info: ExperimentInfo | None,
    *,
    min_scored: int = MIN_SCORED,
) -> dict[str, Any]:
    """The experiment's report as JSON-ready data (see the module docstring)."""
    recs = list(records)
    rows = leaderboard(recs, info, min_scored=min_scored)
    return {
        "report_version": REPORT_VERSION,
        "experiment_id": experiment_id,
        "name": info.name if info else None,
        "scoring": scoring_rules(min_scored),
        "status": status_counts(recs, info),
        "leaderboard": [r.as_dict() for r in rows],
        "tasks": task_matrix(recs, rows, min_scored),
        "failures": failure_causes(recs),
        # Over every recorded trial, with how many report each figure (cost: unknown
        # for a trial without a price or usage, never 0).
        "usage": usage_totals(recs, [r for r in recs if scored_reward(r) is not None]),
        # The manifest's budget against the recorded spend (None without a budget);
        # its ``line`` is ``trialbus status``'s ``budget``.
        "budget": budget_usage(recs, info),
    }
