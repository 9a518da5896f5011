"""What the dashboard's pages show, as plain values. Pure: records in, rows out.

The numbers come from services.reports (progress and the experiments list's rows
from ``services.reports.progress``, shared with ``trialbus experiments`` and
``status --follow``; the leaderboard rows of ``queries.experiment_leaderboard``), so
a page shows what the CLI prints. What the ledger cannot know, which trials are
running now, comes from the TrialStarted events (live_feeds.started_trials): a trial
counts as running from its start until its record arrives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from schemas.events import TrialStarted
from schemas.record import TrialRecord
from services.reports import formatting
from services.reports.progress import (  # the dashboard's names for the shared logic
    STALE_AFTER_HEARTBEATS,
    ExperimentRow,
    Progress,
    RunnerRow,
    duration,
    experiment_row,
    progress,
    span,
    submitter_label,
    when,
)
from services.reports.trials import running_lines, trial_lines

__all__ = [
    "PAGES",
    "PAGE_ROWS",
    "ExperimentRow",
    "Progress",
    "TrialPage",
    "TrialRow",
    "duration",
    "experiment_row",
    "experiment_url",
    "fleet_view",
    "leaderboard_cells",
    "progress",
    "record_rows",
    "running_rows",
    "span",
    "submitter_label",
    "trial_page",
    "trial_url",
    "when",
]

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True, slots=True)
class TrialRow:
    """One line of an experiment's trial table (a record, or a trial still running)."""

    trial_id: str
    task: str
    agent: str
    status: str
    reward: str
    failure_class: str
    attempts: str
    runner_host: str


def running_rows(started: Mapping[str, TrialStarted], recorded: Set[str]) -> list[TrialRow]:
    """The trials that started and have no record yet (in ``recorded``), by id."""
    return [
        TrialRow(
            trial_id=line["trial_id"],
            task=line["task"],
            agent=line["agent"],
            status="running",
            reward="-",
            failure_class="-",
            attempts=str(line["attempts"]),
            runner_host=line["runner_host"],
        )
        for line in running_lines(started, recorded, datetime.now(UTC))
    ]


def record_rows(records: Sequence[TrialRecord], limit: int | None = None) -> list[TrialRow]:
    """The records' rows, in ``trialbus trials``'s order (the first ``limit``)."""
    return [
        TrialRow(
            trial_id=line.trial_id,
            task=line.task,
            agent=line.agent,
            status=line.status,
            reward=formatting.num(line.reward) if line.scored else "unscored",
            failure_class=line.failure_class,
            attempts=str(line.attempts),
            runner_host=line.runner_host or "-",
        )
        for line in trial_lines(records)[:limit]
    ]


PAGE_ROWS = 100
"""Rows of the experiment page's trial table per page (``trial_page``)."""


@dataclass(frozen=True, slots=True)
class TrialPage:
    """One page of an experiment's trial table, and where it sits among the others."""

    rows: list[TrialRow]
    number: int
    """1-based, within 1..pages."""
    pages: int
    total: int
    """Rows of the whole table (running trials and records)."""
    first: int
    """1-based position of the page's first row (0 when the table is empty)."""

    def pager(self, experiment_id: str) -> dict[str, Any]:
        """The pager's template context: positions, and links to the pages beside."""
        base = experiment_url(experiment_id)

        def link(n: int) -> str | None:
            return f"{base}?page={n}#trials" if 1 <= n <= self.pages and n != self.number else None

        return {
            "number": self.number,
            "pages": self.pages,
            "total": self.total,
            "first": self.first,
            "last": self.first + len(self.rows) - 1 if self.rows else 0,
            "prev_url": link(self.number - 1),
            "next_url": link(self.number + 1),
            "first_url": link(1),
            "last_url": link(self.pages),
        }


def trial_page(
    running: Sequence[TrialRow], recorded: Sequence[TrialRow], number: int, size: int = 0
) -> TrialPage:
    """Page ``number`` (clamped to the pages there are) of the table ``running`` rows
    first, then ``recorded`` ones: what the page and its live updates show; ``size``
    rows a page (0: ``PAGE_ROWS``)."""
    size = size or PAGE_ROWS
    total = len(running) + len(recorded)
    pages = max(1, -(-total // size))
    number = min(max(1, number), pages)
    start = (number - 1) * size
    end = start + size
    rows = list(running[start:end])
    if len(rows) < size:
        skip = max(0, start - len(running))
        rows += recorded[skip : skip + size - len(rows)]
    return TrialPage(rows, number, pages, total, start + 1 if rows else 0)


def leaderboard_cells(row: dict[str, Any]) -> dict[str, str]:
    """A leaderboard row's cells as text, worded as the CLI and the HTML report word them."""
    agent = formatting.row_agent(row)
    few = formatting.too_few(row) if row["too_few"] else ""
    return {
        "agent": agent,
        "mean": formatting.with_ci(row["mean_reward"], row["mean_reward_ci"]),
        "pass_rate": formatting.with_ci(row["pass_rate"], row["pass_rate_ci"], pct=True),
        "scored": f"{row['n_scored']} / {row['n_trials']}",
        "unscored": formatting.unscored(row),
        "note": few,
    }


def fleet_view(rows: Sequence[RunnerRow], heartbeat_s: float) -> dict[str, Any]:
    """The fleet page's context: each runner's row as text (the numbers of
    ``RunnerRow.as_dict``, "-" for a count an older runner does not report), the
    totals, and after how long a runner is stale (``heartbeat_s``: the registry's)."""

    def count(n: int | None) -> str:
        return "-" if n is None else str(n)

    shown = [
        {
            "runner_id": r.runner_id,
            "host": r.host,
            "pool": r.pool,
            "offers": r.offers,
            "api_keys": r.keys_shown,
            "concurrency": str(r.concurrency),
            "in_flight": count(r.in_flight),
            "done": count(r.done),
            "failed": count(r.failed),
            "last_seen": when(r.last_seen),
            "last_seen_iso": r.last_seen.isoformat(),
            "age": duration(r.age_s),
            "stale": r.stale,
            "state": "stale" if r.stale else "live",
        }
        for r in rows
    ]
    totals = {
        "live": sum(not r.stale for r in rows),
        "stale": sum(r.stale for r in rows),
        "concurrency": sum(r.concurrency for r in rows),
        "in_flight": sum(r.in_flight or 0 for r in rows),
    }
    return {
        "rows": shown,
        "totals": totals,
        "read_at": when(datetime.now(UTC)),
        "stale_after": duration(STALE_AFTER_HEARTBEATS * heartbeat_s),
    }


def experiment_url(experiment_id: str) -> str:
    """The experiment page's path."""
    return f"/ui/experiments/{quote(experiment_id, safe='')}"


def trial_url(trial_id: str) -> str:
    """The trial page's path."""
    return f"/ui/trials/{quote(trial_id, safe='')}"


PAGES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,  # every value, whatever the file name: a task named <script> is text
    undefined=jinja2.StrictUndefined,
)
"""The dashboard's templates (services/submitter/templates)."""
PAGES.filters["when"] = when
PAGES.filters["duration"] = duration
