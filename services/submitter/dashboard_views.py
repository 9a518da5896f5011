"""What the dashboard's pages show, as plain values. Pure: records in, rows out.

The numbers come from services.reports (``status_counts``, the leaderboard rows of
``queries.experiment_leaderboard``), so a page shows what ``trialbus status`` and
``leaderboard --json`` print. What the ledger cannot know, which trials are running
now, comes from the TrialStarted events (live_feeds.started_trials): a trial counts
as running from its start until its record arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from schemas.events import TrialStarted
from schemas.record import TrialRecord
from services.common.ports import ExperimentInfo
from services.reports import formatting
from services.reports.leaderboard import status_counts
from services.submitter.api_tokens import owner_from_record

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True, slots=True)
class Progress:
    """Where an experiment's trials are: done (recorded), running, queued, unscored."""

    total: int
    done: int
    running: int
    queued: int
    scored: int
    unscored: int
    cancelled: int

    @property
    def state(self) -> str:
        """running, complete, or cancelled (every trial recorded, some cancelled)."""
        if self.done < self.total:
            return "cancelling" if self.cancelled else "running"
        return "cancelled" if self.cancelled else "complete"

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the live updates carry it)."""
        return {
            "total": self.total,
            "done": self.done,
            "running": self.running,
            "queued": self.queued,
            "scored": self.scored,
            "unscored": self.unscored,
            "state": self.state,
        }


def progress(
    records: Sequence[TrialRecord], info: ExperimentInfo | None, started: Iterable[str]
) -> Progress:
    """The progress of one experiment; ``started``: ids of trials that started."""
    counts = status_counts(records, info)
    recorded = {r.trial_id for r in records}
    running = min(len(set(started) - recorded), counts["pending"])
    return Progress(
        total=counts["total"],
        done=counts["recorded"],
        running=running,
        queued=counts["pending"] - running,
        scored=counts["scored"],
        unscored=counts["unscored"],
        cancelled=counts.get("unscored_cancelled", 0),
    )


@dataclass(frozen=True, slots=True)
class ExperimentRow:
    """One line of the experiments list."""

    experiment_id: str
    name: str
    submitted_by: str
    progress: Progress
    started: datetime | None
    duration_s: float | None

    def matches(self, query: str) -> bool:
        """Whether the filter box's text is in the id, the name, the submitter or the state."""
        q = query.strip().lower()
        fields = (self.experiment_id, self.name, self.submitted_by, self.progress.state)
        return not q or any(q in f.lower() for f in fields)


def submitter_label(info: ExperimentInfo | None) -> str:
    """``alice (red)``, ``team blue``, or "-" when the manifest names nobody."""
    owner = owner_from_record(info.manifest.get("submitted_by")) if info else None
    if owner is None:
        return "-"
    if owner.user and owner.team:
        return f"{owner.user} ({owner.team})"
    return owner.user or f"team {owner.team}"


def span(
    records: Sequence[TrialRecord], running: bool, now: datetime
) -> tuple[datetime | None, float | None]:
    """(first trial start, seconds until the last end, or until now while running)."""
    starts = [t for r in records if (t := r.timing.started_at) is not None]
    ends = [t for r in records if (t := r.timing.finished_at) is not None]
    if not starts:
        return None, None
    first = min(starts)
    last = now if running or not ends else max(ends)
    return first, max(0.0, (last - first).total_seconds())


def experiment_row(
    experiment_id: str,
    info: ExperimentInfo | None,
    records: Sequence[TrialRecord],
    started: Iterable[str],
    now: datetime | None = None,
) -> ExperimentRow:
    """The list's line for one experiment."""
    p = progress(records, info, started)
    first, duration = span(records, p.state in ("running", "cancelling"), now or datetime.now(UTC))
    return ExperimentRow(
        experiment_id=experiment_id,
        name=info.name if info else experiment_id,
        submitted_by=submitter_label(info),
        progress=p,
        started=first,
        duration_s=duration,
    )


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


def trial_rows(
    records: Sequence[TrialRecord], started: Mapping[str, TrialStarted]
) -> list[TrialRow]:
    """Running trials first (they have no record yet), then the records by task and agent."""
    recorded = {r.trial_id for r in records}
    rows = [
        TrialRow(
            trial_id=trial_id,
            task="-",
            agent="-",
            status="running",
            reward="-",
            failure_class="-",
            attempts=str(ev.attempt),
            runner_host=ev.host,
        )
        for trial_id, ev in sorted(started.items())
        if trial_id not in recorded
    ]
    for rec in sorted(
        records,
        key=lambda r: (r.provenance.task_name, agent_label(r), r.repetition or 0, r.trial_id),
    ):
        ev = rec.evaluation
        rows.append(
            TrialRow(
                trial_id=rec.trial_id,
                task=rec.provenance.task_name,
                agent=agent_label(rec),
                status=rec.status,
                reward=formatting.num(ev.main_reward) if ev.reward_valid else "unscored",
                failure_class=ev.failure_class,
                attempts=str(rec.attempts),
                runner_host=rec.provenance.runner_host or "-",
            )
        )
    return rows


def agent_label(rec: TrialRecord) -> str:
    """``label`` or ``name``, with ``@model`` when the record names one."""
    p = rec.provenance
    name = p.agent_label or p.agent_name
    return f"{name}@{p.model}" if p.model else name


def leaderboard_cells(row: dict[str, Any]) -> dict[str, str]:
    """A leaderboard row's cells as text, worded as the CLI and the HTML report word them."""
    agent = f"{row['agent']}@{row['model']}" if row.get("model") else str(row["agent"])
    few = formatting.too_few(row) if row["too_few"] else ""
    return {
        "agent": agent,
        "mean": formatting.with_ci(row["mean_reward"], row["mean_reward_ci"]),
        "pass_rate": formatting.with_ci(row["pass_rate"], row["pass_rate_ci"], pct=True),
        "scored": f"{row['n_scored']} / {row['n_trials']}",
        "unscored": formatting.unscored(row),
        "note": few,
    }


def when(value: datetime | None) -> str:
    """A UTC time as ``2026-11-26 07:02:03Z``; "-" for None."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def duration(seconds: float | None) -> str:
    """``1h 02m 03s``, ``4m 05s``, ``7s``; "-" for None."""
    if seconds is None:
        return "-"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h {m:02d}m {s:02d}s"
    return f"{m}m {s:02d}s" if m else f"{s}s"


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
