"""Client-side operations behind the CLI and the HTTP API: submit (and wait),
status, leaderboard, import. Each opens its connections, does one thing, closes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nats.aio.client import Client as NatsClient
from nats.errors import NoServersError
from nats.js.api import DeliverPolicy

from schemas.events import (
    ResultImported,
    TrialFailed,
    parse_event,
)
from services.common import errors as E
from services.common.adapters.jetstream import JetStreamBus, connect, ensure_streams
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.errors import ManifestError, TransientError, UserInputError
from services.common.ports import Ledger
from services.common.settings import CommonSettings, SubmitterSettings
from services.reports.leaderboard import leaderboard, status_counts
from services.submitter.manifest_io import load_manifest
from services.submitter.submit import SubmitResult, prepare, publish_experiment


class Printer(Protocol):
    def print(self, *objects: Any, **kwargs: Any) -> None: ...


@contextlib.asynccontextmanager
async def open_ledger(settings: CommonSettings) -> AsyncIterator[Ledger]:
    ledger = MongoLedger(settings.ledger_url, settings.ledger_db)
    try:
        yield ledger
    finally:
        await ledger.close()


@contextlib.asynccontextmanager
async def open_nats(settings: CommonSettings, name: str) -> AsyncIterator[NatsClient]:
    try:
        nc = await asyncio.wait_for(connect(settings.nats_servers, name), timeout=10)
    except (NoServersError, OSError, TimeoutError) as exc:
        raise TransientError(
            f"cannot reach NATS at {settings.nats_url}: start the embedded stack with "
            "`trialbus up` (or `make up`), or set NATS_URL"
        ) from exc
    try:
        yield nc
    finally:
        # Every publish here was acknowledged by JetStream already, so closing loses
        # nothing; drain() would wait on an ordered consumer's teardown instead.
        await nc.close()


@dataclass(slots=True)
class SubmitOutcome:
    summary: dict[str, Any]
    exit_code: int
    rows: list[dict[str, Any]] | None = None
    counts: dict[str, int] = field(default_factory=dict)


async def submit_and_wait(
    settings: SubmitterSettings,
    manifest_path: Path,
    *,
    wait: bool,
    timeout_s: float,
    progress: Printer | None,
) -> SubmitOutcome:
    """Submit a manifest file; with ``wait``, follow it until every trial is recorded."""
    manifest = load_manifest(manifest_path)
    try:
        prepared = prepare(manifest, manifest_path.resolve().parent, settings.tasks_root)
    except ManifestError as exc:  # name the file, as load_manifest's errors do
        raise ManifestError(f"{manifest_path}: {exc}") from None
    async with open_nats(settings, "trialbus-submit") as nc, open_ledger(settings) as ledger:
        js = nc.jetstream()
        topo = settings.topology
        await ensure_streams(js, topo, settings.stream_replicas)
        # Subscribe before publishing so no completion can slip past a waiting client.
        sub = (
            await js.subscribe(
                topo.event_filter("*", prepared.experiment_id),
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
            )
            if wait
            else None
        )
        coordinator = await NatsCoordinator.open(
            js, topo, lease_ttl_s=60, replicas=settings.stream_replicas
        )
        await coordinator.uncancel(prepared.experiment_id)
        result: SubmitResult = await publish_experiment(prepared, JetStreamBus(js, topo), ledger)
        summary = result.as_dict()
        if sub is None:
            return SubmitOutcome(summary, E.EXIT_OK)
        try:
            counts = await _follow(sub, ledger, result, timeout_s, progress)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        summary["status"] = counts
        records = await ledger.records_for(result.experiment_id)
        info = await ledger.get_experiment(result.experiment_id)
        rows = [r.as_dict() for r in leaderboard(records, info)]
        summary["leaderboard"] = rows
        if counts["pending"] > 0:
            return SubmitOutcome(summary, E.EXIT_TIMEOUT, rows, counts)
        code = E.EXIT_OK if counts["scored"] == counts["total"] else E.EXIT_TRIALS_UNSCORED
        return SubmitOutcome(summary, code, rows, counts)


async def _follow(
    sub: Any, ledger: Ledger, result: SubmitResult, timeout_s: float, progress: Printer | None
) -> dict[str, int]:
    """Wait until every trial of this submission is recorded (or the timeout).

    Trials this submission published count once their ResultImported carrying this
    submission's correlation id arrives (a re-run replaces an older record, so the
    ledger alone cannot tell). The others (already scored, or queued by a concurrent
    submission) count once the ledger holds a record for them.
    """
    deadline = time.monotonic() + timeout_s
    waiting = set(result.published_ids)
    others = set(result.trial_ids) - waiting
    info = await ledger.get_experiment(result.experiment_id)
    last_line, next_check = "", 0.0
    counts: dict[str, int] = {}
    while True:
        now = time.monotonic()
        if now >= next_check or not waiting:
            records = await ledger.records_for(result.experiment_id)
            others -= {r.trial_id for r in records}
            counts = status_counts(records, info)
            counts["total"] = max(counts["total"], result.n_trials)
            counts["pending"] = len(waiting) + len(others)
            done = result.n_trials - counts["pending"]
            line = f"{done}/{result.n_trials} done, {counts['scored']} scored"
            if progress is not None and line != last_line:
                progress.print(f"[dim]{result.experiment_id}[/dim] {line}", highlight=False)
                last_line = line
            next_check = now + 2.0
            if counts["pending"] <= 0 or now >= deadline:
                return counts
            if info is None:
                info = await ledger.get_experiment(result.experiment_id)
        try:
            msg = await sub.next_msg(timeout=max(0.05, min(1.0, deadline - now)))
        except TimeoutError:
            continue
        try:
            ev = parse_event(msg.data)
        except ValueError:
            continue
        if isinstance(ev, ResultImported) and ev.correlation_id == result.correlation_id:
            if ev.trial_id in waiting:
                waiting.discard(ev.trial_id)
                next_check = 0.0 if not waiting else next_check
        elif isinstance(ev, TrialFailed) and not ev.final and progress is not None:
            progress.print(f"  retrying {ev.trial_id}: {ev.error_type}", highlight=False)


async def cancel_experiment(settings: CommonSettings, experiment_id: str) -> dict[str, Any]:
    """Flag the experiment cancelled: runners drop its queued trials and stop running ones.

    Each trial still gets a record (failure class ``cancelled``), so the experiment
    completes with honest counts; resubmitting the manifest lifts the cancellation
    and re-runs the cancelled trials.
    """
    async with open_nats(settings, "trialbus-cancel") as nc, open_ledger(settings) as ledger:
        # The ledger may not know a just-submitted experiment yet: cancel anyway.
        info = await ledger.get_experiment(experiment_id)
        js = nc.jetstream()
        coordinator = await NatsCoordinator.open(
            js, settings.topology, lease_ttl_s=60, replicas=settings.stream_replicas
        )
        await coordinator.cancel(experiment_id)
        recorded = await ledger.count_records(experiment_id)
        return {
            "experiment_id": experiment_id,
            "cancelled": True,
            "known": info is not None,
            "n_trials": info.n_trials if info else None,
            "already_recorded": recorded,
        }


async def experiment_status(settings: CommonSettings, experiment_id: str) -> dict[str, int]:
    async with open_ledger(settings) as ledger:
        info = await ledger.get_experiment(experiment_id)
        records = await ledger.records_for(experiment_id)
        if info is None and not records:
            raise UserInputError(f"no experiment {experiment_id!r} in the ledger")
        return status_counts(records, info)


async def leaderboard_rows(
    settings: CommonSettings, experiment_id: str | None
) -> tuple[str, list[dict[str, Any]]]:
    async with open_ledger(settings) as ledger:
        if experiment_id is None:
            ids = await ledger.experiment_ids()
            if not ids:
                raise UserInputError("the ledger holds no experiment yet")
            experiment_id = ids[0]
        info = await ledger.get_experiment(experiment_id)
        records = await ledger.records_for(experiment_id)
        if info is None and not records:
            raise UserInputError(f"no experiment {experiment_id!r} in the ledger")
        return experiment_id, [r.as_dict() for r in leaderboard(records, info)]


async def experiment_report(settings: CommonSettings, experiment_id: str | None) -> dict[str, Any]:
    """The full report of an experiment (services.reports.report.build_report)."""
    from services.reports.queries import experiment_report as build

    async with open_ledger(settings) as ledger:
        return await build(ledger, experiment_id)


async def compare_sides(
    settings: CommonSettings,
    experiment_a: str,
    experiment_b: str | None,
    agent_a: str | None,
    agent_b: str | None,
) -> dict[str, Any]:
    """Paired comparison of two agents (services.reports.compare)."""
    from services.reports.queries import comparison

    async with open_ledger(settings) as ledger:
        return await comparison(ledger, experiment_a, experiment_b, agent_a, agent_b)


async def import_job(settings: CommonSettings, job_dir: Path) -> dict[str, Any]:
    from services.importer.jobdir import import_job_dir

    if not job_dir.is_dir():
        raise UserInputError(f"{job_dir}: not a folder (expected a Harbor job folder)")
    async with open_ledger(settings) as ledger:
        await ledger.ensure_indexes()
        s = await import_job_dir(job_dir.resolve(), ledger)
        return {
            "job_dir": str(s.job_dir),
            "experiment_id": s.experiment_id,
            "total": s.total,
            "imported": s.imported,
            "inserted": s.inserted,
            "updated": s.updated,
            "unchanged": s.unchanged,
            "partial": s.partial,
            "errors": [str(e) for e in s.errors],
        }
