"""Where an experiment is: progress, the experiments list's rows, rate and ETA, the
runner fleet's rows. Pure: records (and what the bus says) in, plain values out.

The dashboard (services/submitter/dashboard_views.py) and the CLI (``trialbus
experiments``, ``status --follow``, ``runners``) both build their rows here, so a
page and a terminal cannot disagree. What the ledger cannot know, which trials are
running now, the caller reads from the TrialStarted events
(services/submitter/live_feeds.LiveFeeds.started_trials): a trial counts as running
from its start until its record arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from schemas.record import TrialRecord
from schemas.runners import RunnerInfo
from services.common.ports import ExperimentInfo
from services.reports.leaderboard import status_counts
from services.submitter.api_tokens import owner_from_record

STALE_AFTER_HEARTBEATS = 2
"""A runner whose record is older than this many heartbeat intervals is marked stale:
it missed at least one beat (its record is dropped after a full TTL, 3 beats)."""


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
    paused: bool = False
    """The experiment is paused (its queued trials wait; docs/scheduling.md)."""

    @property
    def state(self) -> str:
        """running, paused (trials wait, running ones finish), cancelling, complete, or
        cancelled (every trial recorded, some cancelled). A cancellation wins over a
        pause, as on the runners; a finished experiment is not shown paused."""
        if self.done < self.total:
            if self.cancelled:
                return "cancelling"
            return "paused" if self.paused else "running"
        return "cancelled" if self.cancelled else "complete"

    @property
    def finished(self) -> bool:
        """Whether every trial has a record (complete or cancelled)."""
        return self.state in ("complete", "cancelled")

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the live updates carry it): the counts, then ``state``, which
        stands for ``cancelled`` and ``paused``."""
        counts = asdict(self)
        del counts["cancelled"], counts["paused"]
        return {**counts, "state": self.state}


@dataclass(frozen=True, slots=True)
class Recorded:
    """What an experiment's records say about where it is (``recorded_of``): enough
    for ``progress`` and ``span`` without the records, so it can be kept per content
    version (services/reports/report_cache.py) instead of the records."""

    counts: dict[str, int]
    """``status_counts`` of the records."""
    trial_ids: frozenset[str]
    first_start: datetime | None
    last_end: datetime | None


def recorded_of(records: Sequence[TrialRecord], info: ExperimentInfo | None) -> Recorded:
    """The ``Recorded`` of an experiment's records and metadata."""
    starts = [t for r in records if (t := r.timing.started_at) is not None]
    ends = [t for r in records if (t := r.timing.finished_at) is not None]
    return Recorded(
        counts=status_counts(records, info),
        trial_ids=frozenset(r.trial_id for r in records),
        first_start=min(starts) if starts else None,
        last_end=max(ends) if ends else None,
    )


def progress(
    records: Sequence[TrialRecord],
    info: ExperimentInfo | None,
    started: Iterable[str],
    paused: bool = False,
) -> Progress:
    """The progress of one experiment; ``started``: ids of trials that started;
    ``paused``: the coordinator's pause flag of the experiment."""
    return progress_of(recorded_of(records, info), started, paused)


def progress_of(recorded: Recorded, started: Iterable[str], paused: bool = False) -> Progress:
    """``progress`` from what the records said (``recorded_of``)."""
    counts = recorded.counts
    running = min(len(set(started) - recorded.trial_ids), counts["pending"])
    return Progress(
        total=counts["total"],
        done=counts["recorded"],
        running=running,
        queued=counts["pending"] - running,
        scored=counts["scored"],
        unscored=counts["unscored"],
        cancelled=counts.get("unscored_cancelled", 0),
        paused=paused,
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
    priority_class: str | None = None
    """The class the manifest names (compute.priority_class); None: the default class."""
    team: str | None = None
    """The submitter's team (the manifest's ``submitted_by``); None: no team recorded."""

    def class_shown(self, default_class: str) -> str:
        """The priority class as the lists show it: the installation's default when unset."""
        return self.priority_class or default_class

    def matches(self, query: str) -> bool:
        """Whether the filter box's text is in the id, the name, the submitter, the team,
        the priority class (when the manifest names one) or the state."""
        q = query.strip().lower()
        fields = (
            self.experiment_id,
            self.name,
            self.submitted_by,
            self.team or "",
            self.priority_class or "",
            self.progress.state,
        )
        return not q or any(q in f.lower() for f in fields)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``trialbus experiments --json``): progress flattened in, times ISO."""
        return {
            "experiment_id": self.experiment_id,
            "name": self.name,
            "submitted_by": self.submitted_by,
            **self.progress.as_dict(),
            "started": self.started.isoformat() if self.started else None,
            "duration_s": self.duration_s,
            "priority_class": self.priority_class,
            "team": self.team,
        }


def team_of(info: ExperimentInfo | None) -> str | None:
    """The team of the identity that submitted the experiment (None: none recorded)."""
    owner = owner_from_record(info.manifest.get("submitted_by")) if info else None
    return owner.team if owner else None


def priority_class_of(info: ExperimentInfo | None) -> str | None:
    """The priority class the stored manifest names, None when it names none (the
    installation's default class) or is unknown."""
    compute = info.manifest.get("compute") if info else None
    named = compute.get("priority_class") if isinstance(compute, dict) else None
    return named if isinstance(named, str) else None


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
    return span_of(recorded_of(records, None), running, now)


def span_of(
    recorded: Recorded, running: bool, now: datetime
) -> tuple[datetime | None, float | None]:
    """``span`` from what the records said (``recorded_of``)."""
    first = recorded.first_start
    if first is None:
        return None, None
    last = now if running or recorded.last_end is None else recorded.last_end
    return first, max(0.0, (last - first).total_seconds())


def experiment_row(
    experiment_id: str,
    info: ExperimentInfo | None,
    recorded: Recorded,
    started: Iterable[str],
    now: datetime | None = None,
    paused: bool = False,
) -> ExperimentRow:
    """The list's line for one experiment, from what its records said (``recorded_of``;
    ``paused``: its pause flag)."""
    p = progress_of(recorded, started, paused)
    first, duration = span_of(recorded, not p.finished, now or datetime.now(UTC))
    return ExperimentRow(
        experiment_id=experiment_id,
        name=info.name if info else experiment_id,
        submitted_by=submitter_label(info),
        progress=p,
        started=first,
        duration_s=duration,
        priority_class=priority_class_of(info),
        team=team_of(info),
    )


def rate_and_eta(row: ExperimentRow) -> tuple[float | None, float | None]:
    """(trials recorded per minute since the first start, seconds left at that rate).

    None when nothing can be said yet (no trial started or none recorded); the ETA is
    0 once every trial is recorded.
    """
    p = row.progress
    if row.duration_s is None or not p.done or row.duration_s <= 0:
        return None, (0.0 if p.finished and p.total else None)
    per_s = p.done / row.duration_s
    return per_s * 60.0, (p.total - p.done) / per_s


@dataclass(frozen=True, slots=True)
class RunnerRow:
    """One runner of the fleet, as ``trialbus runners`` (and the fleet page) show it."""

    runner_id: str
    host: str
    pool: str
    capabilities: list[str]
    labels: list[str]
    concurrency: int
    in_flight: int | None
    done: int | None
    failed: int | None
    harbor_version: str | None
    started_at: datetime
    last_seen: datetime
    age_s: float
    stale: bool
    api_keys: list[str] | None = None
    """The API key variables its environment sets (names only; None: an older runner)."""

    @property
    def offers(self) -> str:
        """Its capabilities and labels as the fleet views list them ("" for none)."""
        return ", ".join([*self.capabilities, *(f"{x} (label)" for x in self.labels)])

    @property
    def keys_shown(self) -> str:
        """``api_keys`` as the fleet views list them: "-" for none, "?" when not said."""
        if self.api_keys is None:
            return "?"
        return ", ".join(self.api_keys) or "-"

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``trialbus runners --json``)."""
        # The fields in their order; the times as ISO text, the age to the millisecond.
        return {
            **asdict(self),
            "started_at": self.started_at.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "age_s": round(self.age_s, 3),
        }


def runner_rows(
    runners: Iterable[RunnerInfo], heartbeat_s: float, now: datetime | None = None
) -> list[RunnerRow]:
    """The registry's live records by pool and id; ``stale`` when a record is older
    than ``STALE_AFTER_HEARTBEATS`` heartbeats (``heartbeat_s``: the registry's)."""
    at = now or datetime.now(UTC)
    rows = []
    for r in sorted(runners, key=lambda r: (r.pool, r.runner_id)):
        age = max(0.0, (at - r.last_seen).total_seconds())
        rows.append(
            RunnerRow(
                runner_id=r.runner_id,
                host=r.host,
                pool=r.pool,
                capabilities=list(r.capabilities),
                labels=list(r.labels),
                concurrency=r.concurrency,
                in_flight=r.in_flight,
                done=r.done,
                failed=r.failed,
                harbor_version=r.harbor_version,
                started_at=r.started_at,
                last_seen=r.last_seen,
                age_s=age,
                stale=age > STALE_AFTER_HEARTBEATS * heartbeat_s,
                api_keys=None if r.secrets_set is None else list(r.secrets_set),
            )
        )
    return rows


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
