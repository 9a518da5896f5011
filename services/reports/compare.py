"""Paired comparison of two agents (or one agent across two experiments). Pure.

Tasks are the unit. Per side and task, only scored attempts count: the task's mean
reward and pass rate are over its scored attempts. The comparison uses the tasks
both sides scored (at least one scored attempt each); tasks only one side scored are
listed, not compared. On those tasks:

- the mean over tasks of the per-task difference (A - B) in mean reward and in pass
  rate, each with a 95% paired bootstrap interval (tasks resampled, pairs kept);
- for binary rewards, McNemar's exact test on the discordant tasks, where a side
  *solved* a task when a strict majority of its scored attempts passed (with one
  attempt per task: it passed);
- the tasks each side alone solved;
- a plain verdict: "no detectable difference" when the mean reward interval spans 0.

With fewer than ``MIN_SCORED`` paired tasks the differences and intervals are None
(``too_few``); the counts, the solved lists and the exact test are still given.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from schemas.record import TrialRecord
from services.common.errors import UserInputError
from services.reports import formatting, stats
from services.reports.scoring import (
    MIN_SCORED,
    group_key,
    is_binary,
    passes,
    scored_reward,
)


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a comparison: an agent x model within an experiment."""

    experiment_id: str
    agent: str
    model: str | None

    @property
    def label(self) -> str:
        """Short human name: ``agent`` or ``agent (model)``, plus the experiment."""
        name = self.agent if self.model is None else f"{self.agent} ({self.model})"
        return f"{name} @ {self.experiment_id}"


@dataclass(frozen=True, slots=True)
class TaskScore:
    """One side's scored attempts at one task."""

    n_scored: int
    n_passed: int
    mean_reward: float
    pass_rate: float
    binary: bool

    @property
    def solved(self) -> bool:
        """A strict majority of the scored attempts passed."""
        return 2 * self.n_passed > self.n_scored


@dataclass(frozen=True, slots=True)
class Difference:
    """Mean of per-task differences A - B with its interval (None when too few)."""

    a: float
    b: float
    difference: float | None
    ci: list[float] | None


@dataclass(frozen=True, slots=True)
class Comparison:
    """The paired comparison of side A with side B."""

    a: Side
    b: Side
    n_paired_tasks: int
    min_paired: int
    too_few: bool
    binary_rewards: bool
    mean_reward: Difference | None
    pass_rate: Difference | None
    mcnemar: dict[str, Any] | None
    solved_only_by_a: list[str]
    solved_only_by_b: list[str]
    tasks_only_a_scored: list[str]
    tasks_only_b_scored: list[str]
    verdict: str
    per_task: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        data = asdict(self)
        data["a"]["label"], data["b"]["label"] = self.a.label, self.b.label
        return data


def records_of(records: Iterable[TrialRecord], agent: str, model: str | None) -> list[TrialRecord]:
    """The records of one leaderboard row (agent label or name, and model)."""
    return [r for r in records if group_key(r) == (agent, model)]


def task_scores(records: Iterable[TrialRecord]) -> dict[str, TaskScore]:
    """Per task: the side's scored attempts summarised (tasks without any are absent)."""
    rewards: dict[str, list[float]] = defaultdict(list)
    for rec in records:
        reward = scored_reward(rec)
        if reward is not None:
            rewards[rec.provenance.task_name].append(reward)
    out: dict[str, TaskScore] = {}
    for task, values in sorted(rewards.items()):
        n_passed = sum(1 for v in values if passes(v))
        out[task] = TaskScore(
            len(values), n_passed, stats.mean(values), n_passed / len(values), is_binary(values)
        )
    return out


def _difference(
    a: Sequence[float], b: Sequence[float], too_few: bool
) -> tuple[Difference | None, stats.PairedDifference | None]:
    if not a:
        return None, None
    a_mean, b_mean = stats.mean(a), stats.mean(b)
    if too_few:
        return Difference(a_mean, b_mean, None, None), None
    paired = stats.paired_bootstrap_difference(a, b)
    assert paired is not None  # a is not empty
    return Difference(a_mean, b_mean, paired.difference, paired.interval.as_list()), paired


def _verdict(
    a: Side,
    b: Side,
    n: int,
    min_paired: int,
    paired: stats.PairedDifference | None,
    p: float | None,
) -> str:
    test = f"; McNemar exact p = {p:.3g}" if p is not None else ""
    if paired is None:
        return (
            f"too few tasks scored by both sides ({n} < {min_paired}) to compare{test}"
            if n
            else "no task was scored by both sides: nothing to compare"
        )
    ci = paired.interval
    what = (
        f"mean reward difference {paired.difference:+.3f}, 95% CI "
        f"[{ci.low:+.3f}, {ci.high:+.3f}] over {n} tasks{test}"
    )
    if ci.spans_zero():
        return f"no detectable difference ({what})"
    better, worse = (a, b) if paired.difference > 0 else (b, a)
    return f"{better.label} scores higher than {worse.label} ({what})"


def compare(
    side_a: Side,
    records_a: Iterable[TrialRecord],
    side_b: Side,
    records_b: Iterable[TrialRecord],
    *,
    min_paired: int = MIN_SCORED,
) -> Comparison:
    """Compare side A with side B on the tasks both scored (see the module docstring)."""
    scores_a, scores_b = task_scores(records_a), task_scores(records_b)
    paired_tasks = sorted(set(scores_a) & set(scores_b))
    n = len(paired_tasks)
    too_few = n < min_paired
    ta = [scores_a[t] for t in paired_tasks]
    tb = [scores_b[t] for t in paired_tasks]
    mean_diff, paired = _difference(
        [s.mean_reward for s in ta], [s.mean_reward for s in tb], too_few
    )
    rate_diff, _ = _difference([s.pass_rate for s in ta], [s.pass_rate for s in tb], too_few)
    only_a = [t for t in paired_tasks if scores_a[t].solved and not scores_b[t].solved]
    only_b = [t for t in paired_tasks if scores_b[t].solved and not scores_a[t].solved]
    binary = n > 0 and all(s.binary for s in (*ta, *tb))
    mcnemar = (
        {
            "only_a": len(only_a),
            "only_b": len(only_b),
            "p_value": stats.mcnemar_exact(len(only_a), len(only_b)),
        }
        if binary
        else None
    )
    return Comparison(
        a=side_a,
        b=side_b,
        n_paired_tasks=n,
        min_paired=min_paired,
        too_few=too_few,
        binary_rewards=binary,
        mean_reward=mean_diff,
        pass_rate=rate_diff,
        mcnemar=mcnemar,
        solved_only_by_a=only_a,
        solved_only_by_b=only_b,
        tasks_only_a_scored=sorted(set(scores_a) - set(scores_b)),
        tasks_only_b_scored=sorted(set(scores_b) - set(scores_a)),
        verdict=_verdict(
            side_a, side_b, n, min_paired, paired, mcnemar["p_value"] if mcnemar else None
        ),
        per_task=[
            {"task": t, "a": asdict(scores_a[t]), "b": asdict(scores_b[t])} for t in paired_tasks
        ],
    )


def rows_of(records: Iterable[TrialRecord]) -> list[tuple[str, str | None]]:
    """The (agent, model) rows present in some records, sorted."""
    return sorted({group_key(r) for r in records}, key=lambda k: (k[0], k[1] or ""))


def pick_side(experiment_id: str, records: Sequence[TrialRecord], selector: str | None) -> Side:
    """The side ``selector`` names in an experiment's records.

    ``selector`` is ``AGENT`` or ``AGENT@MODEL`` (AGENT: the manifest label, else the
    agent name); None picks the experiment's only agent x model. Raises
    UserInputError naming the choices when the selection is missing or ambiguous.
    """
    rows = rows_of(records)
    choices = ", ".join(formatting.agent_at(a, m) for a, m in rows) or "none"
    if selector is None:
        candidates = rows
    else:
        agent, _, model = selector.partition("@")
        candidates = [(a, m) for a, m in rows if a == agent and (not model or m == model)]
    if len(candidates) == 1:
        return Side(experiment_id, *candidates[0])
    if not candidates:
        what = f"no agent {selector!r}" if selector else "no scored or recorded agent"
        raise UserInputError(f"experiment {experiment_id!r} has {what}; its agents: {choices}")
    raise UserInputError(
        f"experiment {experiment_id!r} has several agents ({choices}): choose one as "
        "AGENT or AGENT@MODEL"
    )
