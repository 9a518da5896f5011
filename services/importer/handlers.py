"""The importer's message handling: a batch of events in, ledger upserts out.

Each raw message is settled on its own: poison is terminated, a ledger outage naks
the whole batch with a delay (nothing lost, nothing terminated), and everything else
is acknowledged only after its record is durably in the ledger and its
ResultImported is published.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from schemas.events import (
    Event,
    EventDecodeError,
    ExperimentSubmitted,
    ResultImported,
    TrialCompleted,
    TrialFailed,
    parse_event,
)
from schemas.record import TrialRecord
from services.common.errors import LedgerUnavailable
from services.common.logging import get_logger
from services.common.ports import EventBus, ExperimentInfo, Ledger, UpsertOutcome
from services.importer.records import RecordContext, build_failed_record, build_record

log = get_logger(__name__)


@dataclass(slots=True)
class BatchPlan:
    """How each message of a batch is to be settled."""

    ack: list[int] = field(default_factory=list)
    term: list[int] = field(default_factory=list)
    records: dict[str, TrialRecord] = field(default_factory=dict)
    correlation: dict[str, str] = field(default_factory=dict)
    experiments: list[ExperimentInfo] = field(default_factory=list)


def _context_for_completed(ev: TrialCompleted) -> RecordContext:
    return RecordContext(
        experiment_id=ev.experiment_id,
        trial_id=ev.trial_id,
        repetition=None,
        agent_label=ev.agent_label,
        environment=ev.environment,
        harbor_version=ev.harbor_version,
        runner_host=ev.runner_host,
        source=ev.source,
        job_dir=Path(ev.job_dir),
        task_path=None,
        attempts=ev.attempt,
    )


def record_for(event: TrialCompleted | TrialFailed) -> TrialRecord:
    """Build the ledger record of a finished trial (reads its files; never raises on them)."""
    if isinstance(event, TrialCompleted):
        return build_record(Path(event.trial_dir), _context_for_completed(event))
    return build_failed_record(event)


def _safe_record_for(event: TrialCompleted | TrialFailed) -> TrialRecord:
    """record_for, with an importer bug turned into a partial record, not a stuck batch."""
    try:
        return record_for(event)
    except Exception as exc:
        log.exception("record building failed", trial_id=event.trial_id)
        failed = TrialFailed(
            experiment_id=event.experiment_id,
            trial_id=event.trial_id,
            correlation_id=event.correlation_id,
            failure_class="infrastructure",
            error_type="ImporterError",
            message=f"importer could not build the record: {type(exc).__name__}: {exc}",
            attempt=event.attempt,
            final=True,
            trial_dir=getattr(event, "trial_dir", None),
        )
        return build_failed_record(failed)


def _prefer(new: TrialRecord, old: TrialRecord | None) -> TrialRecord:
    """Within one batch, a complete record wins over a partial one for the same trial."""
    if old is None:
        return new
    if old.status == "complete" and new.status == "partial":
        return old
    return new


async def plan_batch(payloads: Sequence[bytes]) -> BatchPlan:
    """Decode a batch and build its records (file reads run off the event loop)."""
    plan = BatchPlan()
    to_build: list[tuple[int, TrialCompleted | TrialFailed]] = []
    for i, data in enumerate(payloads):
        try:
            event: Event = parse_event(data)
        except EventDecodeError as exc:
            log.error("poison event terminated", error=str(exc))
            plan.term.append(i)
            continue
        plan.ack.append(i)
        if isinstance(event, ExperimentSubmitted):
            plan.experiments.append(
                ExperimentInfo(event.experiment_id, event.name, event.n_trials, event.manifest)
            )
        elif isinstance(event, TrialCompleted) or (isinstance(event, TrialFailed) and event.final):
            to_build.append((i, event))
    if to_build:
        built = await asyncio.to_thread(lambda: [_safe_record_for(ev) for _, ev in to_build])
        for (_, ev), rec in zip(to_build, built, strict=True):
            plan.records[rec.trial_id] = _prefer(rec, plan.records.get(rec.trial_id))
            plan.correlation[rec.trial_id] = ev.correlation_id
    return plan


async def apply_plan(plan: BatchPlan, ledger: Ledger, bus: EventBus) -> None:
    """Write the batch to the ledger, then announce each record.

    Raises LedgerUnavailable (transient) before anything is acknowledged.
    """
    for info in plan.experiments:
        await ledger.upsert_experiment(info)
    if not plan.records:
        return
    try:
        outcome = await ledger.upsert_records(list(plan.records.values()))
    except LedgerUnavailable:
        raise
    except Exception:
        log.exception("batch write refused; writing records one by one")
        outcome = await _upsert_one_by_one(plan, ledger)
    events = [
        ResultImported(
            experiment_id=rec.experiment_id,
            trial_id=rec.trial_id,
            correlation_id=plan.correlation.get(rec.trial_id, ""),
            status=rec.status,
            scored=rec.evaluation.reward_valid,
            main_reward=rec.evaluation.main_reward,
            changed=outcome.changed(rec.trial_id),
        )
        for rec in plan.records.values()
    ]
    # All at once: awaited one after the other, each acknowledged publish is a round
    # trip, and they made up most of a batch's time (benchmarks, docs/performance.md).
    await asyncio.gather(*(bus.publish(event) for event in events))


async def _upsert_one_by_one(plan: BatchPlan, ledger: Ledger) -> UpsertOutcome:
    """Write each record alone; one the ledger refuses is replaced by a small partial
    record saying why, so a single bad trial can never hold its batch forever."""
    total = UpsertOutcome()
    for trial_id, rec in list(plan.records.items()):
        try:
            one = await ledger.upsert_records([rec])
        except LedgerUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - replaced by a diagnostic record below
            stub = build_failed_record(
                TrialFailed(
                    experiment_id=rec.experiment_id,
                    trial_id=trial_id,
                    failure_class="infrastructure",
                    error_type="LedgerRefusedRecord",
                    message=f"the ledger refused this trial's record: {type(exc).__name__}: "
                    f"{str(exc)[:500]}",
                    attempt=rec.attempts,
                    final=True,
                    trial_dir=rec.artifacts.trial_dir,
                )
            )
            plan.records[trial_id] = stub
            one = await ledger.upsert_records([stub])
        total.inserted += one.inserted
        total.updated += one.updated
        total.unchanged += one.unchanged
    return total
