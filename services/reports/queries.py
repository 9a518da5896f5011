"""The one read path: every report the CLI, the HTTP API and ``submit --wait`` show.

Each function loads an experiment's records and submission metadata through the
Ledger port, then hands them to the pure builders (``leaderboard``, ``report``,
``compare``). Nothing else in trialbus reads records for display, so the numbers of
``trialbus leaderboard``, ``GET /experiments/{id}/leaderboard`` and the table printed
after ``submit --wait`` cannot differ.

What is computed from an experiment's records goes through ``derived``: with a
``ReportCache`` (the submitter process keeps one) the value is kept under the
experiment's content version and computed again only when a record or the metadata
changed; without one (a one-shot CLI read) it is computed by the same code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from schemas.record import TrialRecord
from services.common.errors import ExperimentNotFound, UserInputError
from services.common.ports import ExperimentInfo, Ledger
from services.reports import stored
from services.reports.budget import spent_line_of_tally
from services.reports.compare import compare, pick_side, records_of
from services.reports.leaderboard import counts_of_tally, leaderboard
from services.reports.progress import (
    ExperimentRow,
    Recorded,
    experiment_row,
    priority_class_of,
    recorded_of,
)
from services.reports.report import build_report
from services.reports.report_cache import ReportCache
from services.reports.stored import Codec
from services.reports.tally import count
from services.submitter.api_tokens import owner_from_record


async def load_experiment(
    ledger: Ledger, experiment_id: str | None, *, required: bool = True
) -> tuple[str, ExperimentInfo | None, list[TrialRecord]]:
    """(id, submission metadata, records); None picks the latest experiment.

    Raises ExperimentNotFound when the ledger knows nothing of the experiment, unless
    ``required`` is False (a just-submitted experiment may not be recorded yet).
    """
    if experiment_id is None:
        experiment_id = await latest_experiment(ledger)
    info = await ledger.get_experiment(experiment_id)
    records = await ledger.records_for(experiment_id)
    if required and info is None and not records:
        raise ExperimentNotFound(f"no experiment {experiment_id!r} in the ledger")
    return experiment_id, info, records


async def latest_experiment(ledger: Ledger) -> str:
    """The newest experiment's id (ExperimentNotFound on an empty ledger)."""
    ids = await ledger.experiment_ids()
    if not ids:
        raise ExperimentNotFound("the ledger holds no experiment yet")
    return ids[0]


type Derive[T] = Callable[[str, ExperimentInfo | None, list[TrialRecord]], T]
"""Computes a value from (experiment id, metadata, records): pure, run in a thread."""


async def derived[T](
    ledger: Ledger,
    experiment_id: str | None,
    kind: str,
    build: Derive[T],
    *,
    cache: ReportCache | None = None,
    required: bool = True,
    codec: Codec[T] | None = None,
) -> tuple[str, T]:
    """(experiment id, ``build`` of its metadata and records); None picks the latest.

    The value is looked up under (``kind``, id, ``Ledger.experiment_version``): first
    in ``cache``, then (with ``codec``) in the ledger (services/reports/stored.py); the
    records are read only when neither holds it, and what is computed then is kept in
    both. The version is read before the records, so a kept value is never older than
    its key. Values may be shared between callers: never mutate one. Raises as
    ``load_experiment``.
    """
    exp_id = experiment_id if experiment_id is not None else await latest_experiment(ledger)
    version = await ledger.experiment_version(exp_id)
    sized = cache is not None

    keeps = version is not None and codec is not None

    async def compute() -> tuple[T, int]:
        if version is not None and codec is not None:
            found = await stored.load(ledger, exp_id, kind, version, codec)
            if found is not None:
                return found
        _, info, records = await load_experiment(ledger, exp_id, required=required)
        # Building (and sizing, and packing) costs CPU time: off the event loop (the
        # HTTP API shares it).
        value, size, blob = await asyncio.to_thread(
            stored.built, build, exp_id, info, records, sized, codec if keeps else None, kind
        )
        if version is not None and blob is not None:
            await stored.keep(ledger, exp_id, kind, version, blob)
        return value, size

    if cache is None:
        return exp_id, (await compute())[0]
    key = None if version is None else (kind, exp_id, version)
    value: T = await cache.get_or_build(key, compute)
    return exp_id, value


StartedOf = Callable[[str], Awaitable[Iterable[str]]]
"""Ids of an experiment's trials that started (from the bus: LiveFeeds.started_trials)."""
PausedOf = Callable[[str], Awaitable[bool]]
"""Whether an experiment is paused (the coordinator's flag: Coordinator.is_paused)."""
PausedTrialsOf = Callable[[str], Awaitable[Iterable[str]]]
"""An experiment's trials paused one by one (Coordinator.paused_trials)."""
TeamCappedOf = Callable[[str], Awaitable[bool]]
"""Whether a team has reached its ``max_spend_usd_per_day`` (follow.spend_capped_of)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Lookups:
    """What only the bus knows, asked by the reports as they need it: which trials
    started, and the coordinator's pause flags and spend caps. A member None is not
    known (NATS out of reach, or no quotas file): ``experiment_status`` leaves out
    its key, ``experiment_progress`` counts nothing started and nothing paused.
    ``follow.lookups_of`` builds one from a Coordinator. By keyword only: two members
    have the same type."""

    started_of: StartedOf | None = None
    paused_of: PausedOf | None = None
    paused_trials_of: PausedTrialsOf | None = None
    team_capped_of: TeamCappedOf | None = None


NOTHING_KNOWN = Lookups()
"""``Lookups`` with every member unknown (the ledger's numbers alone)."""


async def experiment_status(
    ledger: Ledger, experiment_id: str, lookups: Lookups = NOTHING_KNOWN
) -> dict[str, int | str | bool]:
    """Counts of an experiment's trials by state (``status_counts``); with
    ``lookups.started_of`` (the TrialStarted events) and while trials have no record,
    ``running`` and ``queued``; with a budget in
    the manifest, ``budget``: what the recorded trials spent of it; when the manifest
    names a priority class, ``priority_class``; with ``lookups.paused_of``
    (the coordinator's flag), ``paused``: whether its queued trials wait for a resume.

    Read from the experiment's tally (``Ledger.experiment_tally``), not its records:
    one document however many trials, and the same numbers as the report's
    (``counts_of_tally`` is ``status_counts``'s arithmetic).
    ``paused`` is False once every trial is recorded (nothing waits any more), as the
    dashboard's and ``status --follow``'s state say; without ``paused_of`` (NATS out of
    reach) the key is absent: unknown, not False. With ``paused_trials_of``, and when
    some of them have no record, ``paused_trials``: how many trials are paused one by one.
    With ``team_capped_of``, while trials wait and its team (``submitted_by.team``) has
    reached its spend cap, ``team_spend_capped``: True (runners hold its trials back).
    """
    info = await ledger.get_experiment(experiment_id)
    tally = await ledger.experiment_tally(experiment_id)
    if info is None and not count(tally, "recorded"):
        raise ExperimentNotFound(f"no experiment {experiment_id!r} in the ledger")
    counts = counts_of_tally(tally, info)
    status: dict[str, int | str | bool] = {}
    for key, n in counts.items():
        status[key] = n
        if key == "pending" and n and lookups.started_of is not None:
            # Started and not recorded: running now (the experiments list's rule);
            # what else waits is queued.
            started = set(await lookups.started_of(experiment_id))
            running = len(await unrecorded(ledger, experiment_id, started))
            status["running"], status["queued"] = running, max(0, n - running)
    spent = spent_line_of_tally(tally, info)
    if spent is not None:
        status["budget"] = spent
    named = priority_class_of(info)
    if named is not None:  # absent: the installation's default class
        status["priority_class"] = named
    if lookups.paused_of is not None:
        status["paused"] = bool(counts["pending"] and await lookups.paused_of(experiment_id))
    if lookups.paused_trials_of is not None and counts["pending"]:
        paused = set(await lookups.paused_trials_of(experiment_id))
        held = await unrecorded(ledger, experiment_id, paused)
        if held:
            status["paused_trials"] = len(held)
    if lookups.team_capped_of is not None and counts["pending"]:
        owner = owner_from_record(info.manifest.get("submitted_by")) if info else None
        team = owner.team if owner is not None else None
        if team is not None and await lookups.team_capped_of(team):
            status["team_spend_capped"] = True
    return status


async def unrecorded(ledger: Ledger, experiment_id: str, trial_ids: set[str]) -> set[str]:
    """The trials of ``trial_ids`` the ledger holds no record of (in this experiment):
    the paused trials still waiting, for ``status`` and ``trialbus queue``, and the
    started ones still running, for ``status``."""
    if not trial_ids:
        return set()
    return trial_ids - await ledger.recorded_among(experiment_id, trial_ids)


async def experiment_progress(
    ledger: Ledger,
    experiment_id: str,
    lookups: Lookups = NOTHING_KNOWN,
    *,
    required: bool = True,
    now: datetime | None = None,
    cache: ReportCache | None = None,
) -> ExperimentRow:
    """One experiment's row of the experiments list (progress, started, duration).

    ``lookups.started_of`` and ``paused_of`` are asked only while some trial has no
    record: a finished experiment costs no read of the bus. With ``cache``, what the
    records say is kept per content version (``progress_basis``).
    """
    exp_id, (info, recorded) = await derived(
        ledger,
        experiment_id,
        "progress",
        progress_basis,
        cache=cache,
        required=required,
        codec=stored.PROGRESS_CODEC,
    )
    incomplete = len(recorded.trial_ids) < (info.n_trials if info else 0)
    started_of, paused_of = lookups.started_of, lookups.paused_of
    started = await started_of(exp_id) if incomplete and started_of is not None else ()
    paused = bool(incomplete and paused_of is not None and await paused_of(exp_id))
    return experiment_row(exp_id, info, recorded, started, now, paused)


def progress_basis(
    _experiment_id: str, info: ExperimentInfo | None, records: list[TrialRecord]
) -> tuple[ExperimentInfo | None, Recorded]:
    """The metadata and what the records say about progress (``experiment_progress``)."""
    return info, recorded_of(records, info)


async def experiment_rows(
    ledger: Ledger,
    lookups: Lookups = NOTHING_KNOWN,
    *,
    now: datetime | None = None,
    cache: ReportCache | None = None,
) -> list[ExperimentRow]:
    """Every experiment's row, newest first (``trialbus experiments``, the dashboard)."""
    return [
        await experiment_progress(ledger, exp_id, lookups, required=False, now=now, cache=cache)
        for exp_id in await ledger.experiment_ids()
    ]


async def experiment_leaderboard(
    ledger: Ledger,
    experiment_id: str | None,
    *,
    required: bool = True,
    cache: ReportCache | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """(experiment id, leaderboard rows as JSON); None picks the latest experiment."""
    return await derived(
        ledger,
        experiment_id,
        "leaderboard",
        leaderboard_rows,
        cache=cache,
        required=required,
        codec=stored.ROWS_CODEC,
    )


def leaderboard_rows(
    _experiment_id: str, info: ExperimentInfo | None, records: list[TrialRecord]
) -> list[dict[str, Any]]:
    """The leaderboard as JSON rows (``experiment_leaderboard``'s value)."""
    return [r.as_dict() for r in leaderboard(records, info)]


async def experiment_report(
    ledger: Ledger,
    experiment_id: str | None,
    *,
    required: bool = True,
    cache: ReportCache | None = None,
) -> dict[str, Any]:
    """The full report of one experiment (``services.reports.report.build_report``)."""
    _, report = await derived(
        ledger,
        experiment_id,
        "report",
        report_value,
        cache=cache,
        required=required,
        codec=stored.REPORT_CODEC,
    )
    return report


def report_value(
    experiment_id: str, info: ExperimentInfo | None, records: list[TrialRecord]
) -> dict[str, Any]:
    """``build_report`` (``experiment_report``'s value)."""
    return build_report(experiment_id, records, info)


async def comparison(
    ledger: Ledger,
    experiment_a: str,
    experiment_b: str | None,
    agent_a: str | None,
    agent_b: str | None,
) -> dict[str, Any]:
    """Paired comparison of two sides: two experiments, or two agents of one.

    With ``experiment_b`` None both sides come from ``experiment_a`` and both agents
    must be named (``AGENT`` or ``AGENT@MODEL``).
    """
    exp_a, _, records_a = await load_experiment(ledger, experiment_a)
    if experiment_b is None:
        if agent_a is None or agent_b is None:
            raise UserInputError(
                "comparing within one experiment needs both agents: --a AGENT --b AGENT"
            )
        exp_b, records_b = exp_a, records_a
    else:
        exp_b, _, records_b = await load_experiment(ledger, experiment_b)
    side_a = pick_side(exp_a, records_a, agent_a)
    side_b = pick_side(exp_b, records_b, agent_b)
    if side_a == side_b:
        raise UserInputError(f"both sides are {side_a.label}: choose two different ones")
    result = await asyncio.to_thread(
        compare,
        side_a,
        records_of(records_a, side_a.agent, side_a.model),
        side_b,
        records_of(records_b, side_b.agent, side_b.model),
    )
    return result.as_dict()


async def trial_record(ledger: Ledger, trial_id: str) -> TrialRecord | None:
    """One trial's record (the dashboard's trial page); None while it has none yet."""
    return await ledger.get_record(trial_id)
