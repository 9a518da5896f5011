"""Leaderboard and status arithmetic. Pure: records in, rows out.

Rules (docs/scoring.md): only records with a valid reward are scored; an unscored
trial (infrastructure, verifier failure, cancelled) is shown with its cause and never
enters a mean as a zero. A trial passes when its main reward is at least 1.0.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from schemas.record import TrialRecord
from services.common.ledger import ExperimentInfo

PASS_THRESHOLD = 1.0


@dataclass(frozen=True, slots=True)
class LeaderboardRow:
    """One agent x model."""

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(rec: TrialRecord) -> tuple[str, str | None]:
    p = rec.provenance
    return (p.agent_label or p.agent_name, p.model)


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
        # Agents that share a label and model share a row (see _key): add, not replace.
        key = (label, a.get("model"))
        out[key] = out.get(key, 0) + per_agent
    return out


def leaderboard(
    records: Iterable[TrialRecord], info: ExperimentInfo | None = None
) -> list[LeaderboardRow]:
    """Rows sorted by mean reward (best first), unscored rows last."""
    groups: dict[tuple[str, str | None], list[TrialRecord]] = defaultdict(list)
    for rec in records:
        groups[_key(rec)].append(rec)
    expected = expected_per_agent(info)
    rows = []
    for key in sorted(set(groups) | set(expected), key=lambda k: (k[0], k[1] or "")):
        recs = groups.get(key, [])
        scored = [
            r for r in recs if r.evaluation.reward_valid and r.evaluation.main_reward is not None
        ]
        causes = Counter(r.evaluation.failure_class for r in recs if not r.evaluation.reward_valid)
        n_trials = max(expected.get(key, 0), len(recs))
        rewards = [
            float(r.evaluation.main_reward) for r in scored if r.evaluation.main_reward is not None
        ]
        passed = sum(1 for v in rewards if v >= PASS_THRESHOLD)
        rows.append(
            LeaderboardRow(
                agent=key[0],
                model=key[1],
                n_trials=n_trials,
                n_recorded=len(recs),
                n_scored=len(scored),
                n_pending=n_trials - len(recs),
                unscored_by_cause=dict(sorted(causes.items())),
                mean_reward=sum(rewards) / len(rewards) if rewards else None,
                pass_rate=passed / len(rewards) if rewards else None,
                n_passed=passed,
            )
        )
    rows.sort(key=lambda r: (r.mean_reward is None, -(r.mean_reward or 0.0), r.agent))
    return rows


def status_counts(records: Iterable[TrialRecord], info: ExperimentInfo | None) -> dict[str, int]:
    """Counts by state: scored, unscored (by cause), partial, pending, total."""
    recs = list(records)
    total = max(info.n_trials if info else 0, len(recs))
    scored = sum(1 for r in recs if r.evaluation.reward_valid)
    counts = {
        "total": total,
        "recorded": len(recs),
        "pending": total - len(recs),
        "scored": scored,
        "unscored": len(recs) - scored,
        "complete": sum(1 for r in recs if r.status == "complete"),
        "partial": sum(1 for r in recs if r.status == "partial"),
    }
    for cause, n in sorted(
        Counter(r.evaluation.failure_class for r in recs if not r.evaluation.reward_valid).items()
    ):
        counts[f"unscored_{cause}"] = n
    return counts
