"""An experiment's trials, one line each: what ``trialbus trials``,
``GET /experiments/{id}/trials`` and the dashboard's trial table list.

A trial with a record (finished, or ended by a final failure or a cancellation) is
listed from it, through the one read path (``queries.derived``), ordered by task,
agent, repetition and trial id as every table of trialbus orders them. A trial that
started and has no record yet is listed first as ``running`` (``running_lines``, from
the latest TrialStarted of each trial: ``LiveFeeds.started_trials``, as the dashboard
shows it); ``trialbus status`` counts the trials still queued.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence, Set
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Final

from schemas.events import TrialStarted
from schemas.record import TrialRecord
from services.common.ports import ExperimentInfo, Ledger
from services.reports import formatting, queries, scoring, stored
from services.reports.report_cache import ReportCache


@dataclass(frozen=True, slots=True)
class TrialLine:
    """One trial as its record says."""

    trial_id: str
    """The trial's id (``trialbus logs``, ``retry`` and the dashboard's trial page take it)."""
    task: str
    """The task's name."""
    agent: str
    """The agent as every report names it: its label or name, ``@model`` when it has one."""
    repetition: int | None
    """0-based repetition (None: not recorded, as for an imported job folder)."""
    status: str
    """``complete`` or ``partial`` (the record's ``status``)."""
    scored: bool
    """Whether the trial counts in the scores (its reward is valid)."""
    reward: float | None
    """The main reward when scored."""
    passed: bool | None
    """Whether the reward is a pass (at least 1.0: docs/scoring.md); None when unscored."""
    unscored_cause: str | None
    """Why it does not count, when unscored: its failure class, or ``no_reward`` /
    ``invalid_reward`` (as the leaderboard counts causes)."""
    failure_class: str
    """``none``, ``agent``, ``verifier``, ``infrastructure`` or ``cancelled``."""
    exception_type: str | None
    """The exception that decided ``failure_class``, when there was one."""
    attempts: int
    """Attempts of the run that produced the record (1 first)."""
    runner_host: str | None
    """The host whose runner ran it (None: not run by trialbus)."""
    started_at: str | None
    """When it started (ISO 8601, UTC)."""
    seconds: float | None
    """How long it ran."""

    def as_dict(self) -> dict[str, Any]:
        """The line as JSON (``--json``, the HTTP API)."""
        return asdict(self)


def line_of(record: TrialRecord) -> TrialLine:
    """A record's line."""
    p, ev, timing = record.provenance, record.evaluation, record.timing
    reward = scoring.scored_reward(record)
    return TrialLine(
        trial_id=record.trial_id,
        task=p.task_name,
        agent=formatting.agent_at(p.agent_label or p.agent_name, p.model),
        repetition=record.repetition,
        status=record.status,
        scored=reward is not None,
        reward=reward,
        passed=None if reward is None else scoring.passes(reward),
        unscored_cause=None if reward is not None else scoring.unscored_cause(record),
        failure_class=ev.failure_class,
        exception_type=ev.exception_type,
        attempts=record.attempts,
        runner_host=p.runner_host,
        started_at=timing.started_at.isoformat() if timing.started_at else None,
        seconds=timing.total_s,
    )


_NOT_RECORDED: Final[dict[str, Any]] = {
    "repetition": None,
    "status": "running",
    "scored": False,
    "reward": None,
    "passed": None,
    "unscored_cause": None,
    "failure_class": "none",
    "exception_type": None,
}
"""A running trial's line, where only its record will tell (a TrialStarted carries no
repetition)."""


def running_lines(
    started: Mapping[str, TrialStarted], recorded: Set[str], now: datetime
) -> list[dict[str, Any]]:
    """The trials that started and have no record (in ``recorded``) yet, as lines (as
    JSON, ``TrialLine``'s keys) of status ``running``, by trial id: their attempt,
    runner host and seconds so far, at ``now``."""
    return [
        {
            "trial_id": trial_id,
            "task": ev.task_name or "-",
            "agent": formatting.agent_at(ev.agent_label, ev.model) if ev.agent_label else "-",
            **_NOT_RECORDED,
            "attempts": ev.attempt,
            "runner_host": ev.host,
            "started_at": ev.occurred_at.isoformat(),
            "seconds": max(0.0, (now - ev.occurred_at).total_seconds()),
        }
        for trial_id, ev in sorted(started.items())
        if trial_id not in recorded
    ]


def trial_lines(records: Iterable[TrialRecord]) -> list[TrialLine]:
    """Every record's line, by task, agent, repetition and trial id."""
    lines = [line_of(r) for r in records]
    return sorted(lines, key=lambda t: (t.task, t.agent, t.repetition or 0, t.trial_id))


@dataclass(frozen=True, slots=True)
class TrialFilter:
    """Which lines to keep (``trialbus trials`` options, the HTTP API's query)."""

    unscored: bool = False
    """Only finished trials that do not count in the scores."""
    task: str | None = None
    """Only this task's trials."""
    agent: str | None = None
    """Only this agent's trials: as listed (``agent@model``), or the agent alone."""

    def keeps(self, line: dict[str, Any]) -> bool:
        """Whether ``line`` (as JSON) passes."""
        agent = line["agent"]
        return (
            not (self.unscored and line["unscored_cause"] is None)
            and (self.task is None or line["task"] == self.task)
            and (self.agent is None or self.agent in (agent, agent.split("@", 1)[0]))
        )


EVERY_TRIAL = TrialFilter()
"""The filter that keeps every line."""


def select(lines: Sequence[dict[str, Any]], where: TrialFilter) -> list[dict[str, Any]]:
    """The lines (as JSON) ``where`` keeps."""
    return [line for line in lines if where.keeps(line)]


def lines_value(
    _experiment_id: str, _info: ExperimentInfo | None, records: list[TrialRecord]
) -> list[dict[str, Any]]:
    """Every line as JSON (``experiment_trials``'s value)."""
    return [line.as_dict() for line in trial_lines(records)]


StartsOf = Callable[[str], Awaitable[Mapping[str, TrialStarted]]]
"""The latest TrialStarted of each trial of an experiment (``LiveFeeds.started_trials``)."""


async def experiment_trials(
    ledger: Ledger,
    experiment_id: str | None,
    *,
    cache: ReportCache | None = None,
    starts_of: StartsOf | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """(experiment id, its trials' lines as JSON: with ``starts_of``, the running ones
    first); None picks the latest experiment. Raises ExperimentNotFound as
    ``queries.load_experiment``, before the starts are asked for."""
    exp_id, recorded = await queries.derived(
        ledger, experiment_id, "trials", lines_value, cache=cache, codec=stored.ROWS_CODEC
    )
    if starts_of is None:
        return exp_id, recorded
    ids = {line["trial_id"] for line in recorded}
    return exp_id, running_lines(await starts_of(exp_id), ids, datetime.now(UTC)) + recorded
