"""The submitter's decisions, written against the ports (no nats, no pymongo here).

- ``SubmitterPorts``: what the writes work with (the CLI's commands.py, the HTTP API's
  routes.py and retry.py hand them the same).
- ``submit``: lift an earlier cancellation, then publish the experiment (resume-aware).
- ``submit_and_wait``: the same, then follow it until every trial is recorded
  (services/submitter/waiting.py), and decide the exit code (README's table).
- ``cancel``: flag an experiment cancelled.
- ``pause`` / ``resume``: hold an experiment's queued trials back, and let them go
  (retrying one finished trial is services/submitter/retry.py).
- ``import_job``: ledger a Harbor job folder, announcing it when a bus is given.

Reads (status, leaderboard, report, compare) are services.reports.queries: the HTTP
API (app.py) and the CLI (commands.py) call these functions and those queries, with
connections opened for them by connections.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.ids import agent_key
from services.common import errors as E
from services.common.errors import ManifestError
from services.common.fair_share import DEFAULT_SHARE, TeamShare
from services.common.fit import combination_refusal
from services.common.pools import (
    agent_name_refusal,
    policy_refusal,
    pool_refusal,
    secret_refusal,
    task_requires_refusal,
)
from services.common.ports import Coordinator, EventBus, Ledger, ObjectStore, RunnerRegistry
from services.common.priority import PriorityClasses
from services.common.quotas import Quotas
from services.reports.queries import experiment_leaderboard
from services.submitter.quota_gate import QuotaGate
from services.submitter.stored_tasks import read_stored_tasks
from services.submitter.submit import (
    PreparedExperiment,
    SubmitResult,
    publish_experiment,
)
from services.submitter.waiting import EventFeed, Printer, follow, say


@dataclass(frozen=True, slots=True)
class SubmitterPorts:
    """The ports a submission (or a retry) works with, and the team quotas it is held to.

    The CLI opens them per command (commands.py), the HTTP API once (app.py's lifespan,
    as routes.Ports).
    """

    bus: EventBus
    ledger: Ledger
    coordinator: Coordinator
    tasks: ObjectStore
    """The tasks bucket: the archives trials run from."""
    runners: RunnerRegistry | None = None
    """The live runners; None: a manifest is not checked against them."""
    quotas: Quotas | None = None
    """The team quotas; None: none apply."""


@dataclass(slots=True)
class SubmitOutcome:
    """A submission's summary (``submit --json``), exit code, and when waited for,
    the final counts and leaderboard rows."""

    summary: dict[str, Any]
    exit_code: int
    rows: list[dict[str, Any]] | None = None
    counts: dict[str, int] = field(default_factory=dict)


def check_priority_class(prepared: PreparedExperiment, classes: PriorityClasses) -> str:
    """The class the experiment runs in; ManifestError naming ``compute.priority_class``
    and the installation's classes when it names one this installation lacks."""
    requested = prepared.manifest.compute.priority_class
    refusal = classes.refusal(requested)
    if refusal is not None:
        raise ManifestError(refusal)
    return classes.resolve(requested)


async def check_runners(prepared: PreparedExperiment, runners: RunnerRegistry) -> None:
    """Raise ManifestError when no live runner of the manifest's pool can run it: none
    offers what it needs (or what a task requires: a network allowlist's
    ``local.allowlist``), their Harbor ships no agent of a name it gives, their
    policies refuse it (the runners would refuse each trial anyway), none has an API
    key variable an agent or a task names set, or no single one holds all that one of
    its trials needs (``fit.combination_refusal``)."""
    live = await runners.live_runners()
    refusal = pool_refusal(prepared.manifest.compute, live)
    if refusal is not None:
        raise ManifestError(f"compute: {refusal}")
    refusal = task_requires_refusal(prepared.trials, live)
    if refusal is not None:
        raise ManifestError(refusal)
    refusal = agent_name_refusal(prepared.manifest, live)
    if refusal is not None:
        raise ManifestError(refusal)
    folders = [(t.ref.name, t.folder) for t in prepared.tasks if t.folder is not None]
    # Reads each task's task.toml: off the event loop (the HTTP API awaits this).
    refusal = await asyncio.to_thread(policy_refusal, prepared.manifest, live, folders)
    if refusal is not None:
        raise ManifestError(refusal)
    refusal = await asyncio.to_thread(secret_refusal, prepared.manifest, live, folders)
    if refusal is not None:
        raise ManifestError(refusal)
    refusal = combination_refusal(prepared.trials, live)
    if refusal is not None:
        raise ManifestError(refusal)


async def admit(prepared: PreparedExperiment, ports: SubmitterPorts) -> QuotaGate | None:
    """What ``submit`` checks against the stack before it changes anything: with
    ``ports.runners``, that a live runner can run it (``check_runners``); with
    ``ports.quotas``, that its team's spend cap is not reached. Returns the team's quota
    gate (None: no quota applies), which counts the trials as they are published."""
    if ports.runners is not None:
        await check_runners(prepared, ports.runners)
    quotas = ports.quotas
    quota = quotas.for_team(prepared.team) if quotas is not None else None
    if not prepared.team or quota is None:
        return None
    gate = QuotaGate(ports.coordinator, prepared.team, quota)
    await gate.check_spend()
    return gate


NOT_CHECKED_ONLINE = (
    "the team's trials-per-day quota (counted as trials are published: a resubmission "
    "publishes only what is not queued or scored yet)"
)
"""What a dry run against the stack leaves to the submission itself."""


async def dry_run(prepared: PreparedExperiment, ports: SubmitterPorts) -> dict[str, Any]:
    """A submission's dry run against the stack: every check ``submit`` makes before it
    changes anything (``admit``; the tasks given by checksum in the bucket), then what
    it would run (``PreparedExperiment.plan``); nothing is uploaded or published."""
    prepared = await read_stored_tasks(prepared, ports.tasks)
    await admit(prepared, ports)
    unchecked = NOT_CHECKED_ONLINE
    if ports.runners is None:
        unchecked += "; the live runners (TRIALBUS_CHECK_RUNNERS is off)"
    return {**prepared.plan(), "not_checked": unchecked}


async def submit(prepared: PreparedExperiment, ports: SubmitterPorts) -> SubmitResult:
    """Upload its tasks and publish a prepared experiment; resubmitting lifts an
    earlier cancellation and agent stops, and stores the manifest's budget. With
    ``ports.runners``, a manifest no live runner can run is refused before anything is
    published; with ``ports.quotas``, one that would pass its team's daily quotas
    (QuotaExceeded, before anything is published or any flag changed)."""
    coordinator, quotas = ports.coordinator, ports.quotas
    prepared = await read_stored_tasks(prepared, ports.tasks)
    gate = await admit(prepared, ports)  # refused before any flag changes
    await coordinator.uncancel(prepared.experiment_id)
    # Resubmitting is how a user says "fixed": lift the agents' stops (a refused key,
    # an empty account; services/runner/guards.py) and store the budget as it is now.
    manifest = prepared.manifest
    keys = [agent_key(a.agent_ref, a.model, a.kwargs) for a in manifest.agents]
    await coordinator.clear_agent_stops(prepared.experiment_id, keys)
    budget = manifest.budget.model_dump_json().encode() if manifest.budget else None
    await coordinator.set_budget(prepared.experiment_id, budget)
    # Fair share: runners (and the queue) learn who waits, per team, from this key and
    # the work stream's counts; stored before any trial is published.
    team = prepared.team
    share = quotas.share_of(team) if quotas is not None and team else DEFAULT_SHARE
    await coordinator.set_share(prepared.experiment_id, TeamShare(team, share) if team else None)
    return await publish_experiment(prepared, ports.bus, ports.ledger, ports.tasks, gate)


def exit_code_for(counts: dict[str, int]) -> int:
    """README's exit codes for ``submit --wait``: 4 timed out, 1 unscored trials, 0 ok."""
    if counts["pending"] > 0:
        return E.EXIT_TIMEOUT
    return E.EXIT_OK if counts["scored"] == counts["total"] else E.EXIT_TRIALS_UNSCORED


async def submit_and_wait(
    prepared: PreparedExperiment,
    ports: SubmitterPorts,
    feed: EventFeed | None,
    *,
    timeout_s: float,
    progress: Printer | None,
) -> SubmitOutcome:
    """Submit; with a ``feed`` (opened before this call, so no completion slips past),
    follow the experiment until every trial is recorded or ``timeout_s`` passes."""
    exp = prepared.experiment_id
    try:
        result = await submit(prepared, ports)
    except asyncio.CancelledError:  # Ctrl-C: say what became of it
        say(
            progress,
            f"interrupted before every trial of {exp} was published: submit the manifest "
            "again to publish the rest (a trial already queued is not queued twice)",
        )
        raise
    summary = result.as_dict()
    if feed is None:
        return SubmitOutcome(summary, E.EXIT_OK)
    try:
        counts = await follow(feed, ports.ledger, result, timeout_s, progress)
    except asyncio.CancelledError:
        say(
            progress,
            f"interrupted: experiment {exp} goes on running; `trialbus attach {exp}` follows "
            f"it again, `trialbus cancel {exp}` stops it",
        )
        raise
    summary["status"] = counts
    # Not required: after a timeout the ledger may hold nothing of it yet (exit 4).
    _, rows = await experiment_leaderboard(ports.ledger, result.experiment_id, required=False)
    summary["leaderboard"] = rows
    return SubmitOutcome(summary, exit_code_for(counts), rows, counts)


async def cancel(ledger: Ledger, coordinator: Coordinator, experiment_id: str) -> dict[str, Any]:
    """Flag the experiment cancelled: runners drop its queued trials and stop running ones.

    Each trial still gets a record (failure class ``cancelled``), so the experiment
    completes with honest counts; resubmitting the manifest lifts the cancellation
    and re-runs the cancelled trials.
    """
    # The ledger may not know a just-submitted experiment yet: cancel anyway.
    info = await ledger.get_experiment(experiment_id)
    await coordinator.cancel(experiment_id)
    recorded = await ledger.count_records(experiment_id)
    return {
        "experiment_id": experiment_id,
        "cancelled": True,
        "known": info is not None,
        "n_trials": info.n_trials if info else None,
        "already_recorded": recorded,
    }


async def pause(ledger: Ledger, coordinator: Coordinator, experiment_id: str) -> dict[str, Any]:
    """Flag the experiment paused: runners hand its queued trials back unstarted (no
    attempt counted, nothing lost) until ``resume``; trials already running finish.

    A pause outlives resubmissions (only ``resume`` lifts it); a cancellation wins
    over it (a cancelled, paused experiment's trials still get ``cancelled`` records).
    """
    info = await ledger.get_experiment(experiment_id)
    await coordinator.pause(experiment_id)
    unfinished = None
    if info is not None:  # how many trials have no record: what the pause holds now
        unfinished = max(0, info.n_trials - await ledger.count_records(experiment_id))
    return {
        "experiment_id": experiment_id,
        "paused": True,
        "known": info is not None,
        "unfinished": unfinished,
    }


async def resume(ledger: Ledger, coordinator: Coordinator, experiment_id: str) -> dict[str, Any]:
    """Lift a pause: the queued trials start within seconds (each waits out the hand-back
    delay it was given, at most services.runner.admission.PAUSE_WAIT_S)."""
    info = await ledger.get_experiment(experiment_id)
    was_paused = await coordinator.is_paused(experiment_id, fresh=True)
    await coordinator.resume(experiment_id)
    return {
        "experiment_id": experiment_id,
        "paused": False,
        "was_paused": was_paused,
        "known": info is not None,
    }


def check_job_dir(job_dir: Path) -> None:
    """Refuse what is not a folder, naming it as given (before anything connects)."""
    if not job_dir.is_dir():
        raise E.UserInputError(f"{job_dir}: not a folder (expected a Harbor job folder)")


async def import_job(
    ledger: Ledger, bus: EventBus | None, job_dir: Path, *, as_new: bool = False
) -> dict[str, Any]:
    """Ledger every trial folder of a Harbor job folder (idempotent); the summary.

    Trials the ledger holds under another experiment (a copied or renamed folder) are
    not moved: ImportConflict (a UserInputError) names both experiments; ``as_new``
    imports the folder with trial ids of its own (``jobdir.scoped_trial_id``).

    With a ``bus``, every record written is announced with a ResultImported, as the
    importer service announces its own (``announced`` in the summary); without one
    (NATS unreachable) the records are only ledgered.
    """
    # Imported here: it loads Harbor's models, which only `trialbus import` needs.
    from services.importer.jobdir import import_job_dir

    check_job_dir(job_dir)
    await ledger.ensure_indexes()
    s = await import_job_dir(job_dir.resolve(), ledger, bus=bus, as_new=as_new)
    return {
        "job_dir": str(s.job_dir),
        "experiment_id": s.experiment_id,
        "total": s.total,
        "imported": s.imported,
        "inserted": s.inserted,
        "updated": s.updated,
        "unchanged": s.unchanged,
        "partial": s.partial,
        "announced": bus is not None,
        "errors": [str(e) for e in s.errors],
    }
