"""The importer's decisions: a batch of events in, ledger upserts and one verdict per message out.

Written against the ports (``EventBus``, ``Ledger``) only; ``services.importer.app``
turns nats messages into ``Incoming`` and applies the verdicts. Each message is
settled on its own:

- poison (undecodable, unknown type, newer schema version) is terminated (logged);
- every other message is acknowledged only after its record is durably in the
  ledger and its ResultImported is published;
- the ledger unreachable or a publish unconfirmed (TransientError): the batch is
  nak'ed with the retry delay (nothing lost; its poison is still terminated);
- a bug while building ONE record (an InternalError or any exception the importer did
  not expect) naks only that message, with the bug delay; the rest of the batch is
  written and acknowledged. Once the message has been delivered BUG_MAX_DELIVERIES
  times, the importer gives up on it: it writes an acknowledged partial record with
  error_type "ImporterError" naming the exception, so the experiment still completes
  and the cause is visible: an honest unscored record, never a lost trial, never a
  stuck batch (``event_records.record_failure_verdict``);
- a bug while writing or announcing the batch naks the batch with the bug delay;
- a TrialCompleted's trial folder comes from the results bucket (``StoredTrials``):
  an archive that is damaged or unsafe gives at once a partial record saying so (a
  redelivery would fetch the same bytes); one that is missing is waited for like a
  bug (nak, then after BUG_MAX_DELIVERIES a partial record): it may be expired;
- an ExperimentCompleted completes the experiment's job folder with Harbor's
  job-level result.json (``StoredTrials.finish_job``), so ``harbor view`` shows it done;
- a record whose trial_id the ledger holds under another experiment (a forged or
  misrouted event) is a conflict: not written, logged with both experiment ids, not
  announced, and its message acknowledged (redelivery could not change the answer).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from schemas.events import (
    Event,
    EventDecodeError,
    ExperimentCompleted,
    ExperimentSubmitted,
    ResultImported,
    TrialCompleted,
    TrialFailed,
    parse_event,
)
from schemas.record import TrialRecord
from schemas.subjects import Topology
from services.common.errors import (
    ACK,
    LedgerUnavailable,
    Settle,
    settle_error,
)
from services.common.logging import bound_event, get_logger
from services.common.ports import EventBus, ExperimentInfo, Ledger, UpsertOutcome, record_order
from services.importer.event_records import (
    importer_error_record,
    record_failure_verdict,
    try_record_for,
)
from services.importer.folders import StoredTrials
from services.importer.records import build_failed_record

log = get_logger(__name__)

IMPORTED_EVENTS: Final = (ExperimentSubmitted, ExperimentCompleted, TrialCompleted, TrialFailed)
"""The events ``plan_batch`` acts on; every other one it acknowledges unread. The
importer's durable takes only these (``importer_filters``): TrialStarted and the
importer's own ResultImported, two thirds of the events stream, never reach it."""


def importer_filters(topology: Topology) -> list[str]:
    """The importer durable's ``filter_subjects``: one per event type it acts on."""
    return [topology.event_filter(cls.model_fields["type"].default) for cls in IMPORTED_EVENTS]


class Delivery(Protocol):
    """One consumed message as a batch reads it (``Incoming``, or the app's view of a
    nats message, which reads the delivery count only when asked)."""

    @property
    def data(self) -> bytes:
        """The message's bytes."""

    @property
    def delivered(self) -> int:
        """How many times it was delivered (1 on first delivery)."""


@dataclass(frozen=True, slots=True)
class Incoming:
    """One consumed message: its bytes and its delivery count (1 on first delivery)."""

    data: bytes
    delivered: int = 1


@dataclass(slots=True)
class BatchPlan:
    """What a batch writes, and how each of its messages is settled once it is written."""

    settles: list[Settle] = field(default_factory=list)  # one per message, in order
    records: dict[str, TrialRecord] = field(default_factory=dict)
    correlation: dict[str, str] = field(default_factory=dict)
    experiments: list[ExperimentInfo] = field(default_factory=list)
    completed: dict[str, int] = field(default_factory=dict)  # experiment id -> n_trials


# Trial folders fetched and unpacked at once per batch: enough to hide the round trips
# to the object store, few enough not to hold many archives in memory.
FETCH_CONCURRENCY: Final = 16


def _prefer(new: TrialRecord, old: TrialRecord | None) -> TrialRecord:
    """Within one batch, the ledger's rule (``record_order``): the later unless it ranks lower."""
    if old is not None and record_order(new) < record_order(old):
        return old
    return new


async def plan_batch(
    messages: Sequence[Delivery], trials: StoredTrials, *, transient_delay_s: float
) -> BatchPlan:
    """Decode a batch, build its records, and decide each message's verdict.

    File reads run off the event loop. Never raises for one message's sake.
    """
    plan = BatchPlan()
    to_build: list[tuple[int, TrialCompleted | TrialFailed]] = []
    for i, message in enumerate(messages):
        try:
            event: Event = parse_event(message.data)
        except EventDecodeError as exc:
            log.error("poison event terminated", error=str(exc))
            plan.settles.append(settle_error(exc, transient_delay_s=transient_delay_s))
            continue
        plan.settles.append(ACK)
        if isinstance(event, ExperimentSubmitted):
            plan.experiments.append(
                ExperimentInfo(event.experiment_id, event.name, event.n_trials, event.manifest)
            )
        elif isinstance(event, ExperimentCompleted):
            plan.completed[event.experiment_id] = event.n_trials
        elif isinstance(event, TrialCompleted) or (isinstance(event, TrialFailed) and event.final):
            to_build.append((i, event))
    if not to_build:
        return plan
    limit = asyncio.Semaphore(FETCH_CONCURRENCY)
    built = await asyncio.gather(*(try_record_for(ev, trials, limit) for _, ev in to_build))
    for (i, ev), rec in zip(to_build, built, strict=True):
        if isinstance(rec, Exception):
            delivered = messages[i].delivered
            verdict = record_failure_verdict(rec, delivered, transient_delay_s=transient_delay_s)
            with bound_event(ev, delivered=delivered):
                if verdict.action != "ack":
                    log.error(
                        "record building failed; message will be redelivered",
                        delay_s=verdict.delay_s,
                        exc_info=rec,
                    )
                    plan.settles[i] = verdict
                    continue
                log.error(
                    "record building failed; giving up with an ImporterError record", exc_info=rec
                )
            rec = importer_error_record(ev, rec)
        plan.records[rec.trial_id] = _prefer(rec, plan.records.get(rec.trial_id))
        plan.correlation[rec.trial_id] = ev.correlation_id
    return plan


def failed_batch_settles(plan: BatchPlan | None, n: int, verdict: Settle) -> list[Settle]:
    """The verdicts of a batch whose write failed with ``verdict``: poison stays terminated."""
    if plan is None:
        return [verdict] * n
    return [s if s.action == "term" else verdict for s in plan.settles]


async def handle_batch(
    messages: Sequence[Delivery],
    ledger: Ledger,
    bus: EventBus,
    trials: StoredTrials,
    *,
    transient_delay_s: float,
) -> list[Settle]:
    """Import one batch; returns the verdict of each message, in order (never raises)."""
    started = time.perf_counter()
    plan: BatchPlan | None = None
    try:
        plan = await plan_batch(messages, trials, transient_delay_s=transient_delay_s)
        await apply_plan(plan, ledger, bus)
        for experiment_id, n_trials in plan.completed.items():
            await trials.finish_job(experiment_id, n_trials)
    except Exception as exc:  # noqa: BLE001 - settle_error decides; nothing is acked
        verdict = settle_error(exc, transient_delay_s=transient_delay_s)
        if verdict.reason == "transient":
            log.warning(
                "ledger unavailable; batch will be redelivered", error=str(exc), n=len(messages)
            )
        else:
            log.error("import batch failed; will be redelivered", n=len(messages), exc_info=exc)
        return failed_batch_settles(plan, len(messages), verdict)
    log.info(
        "batch imported",
        n=len(messages),
        records=len(plan.records),
        ms=round((time.perf_counter() - started) * 1000, 1),
    )
    return plan.settles


def result_imported(
    record: TrialRecord, outcome: UpsertOutcome, correlation_id: str = ""
) -> ResultImported:
    """The announcement of a record just written (also used by ``trialbus import``)."""
    return ResultImported(
        experiment_id=record.experiment_id,
        trial_id=record.trial_id,
        correlation_id=correlation_id,
        status=record.status,
        scored=record.evaluation.reward_valid,
        main_reward=record.evaluation.main_reward,
        changed=outcome.changed(record.trial_id),
    )


async def apply_plan(plan: BatchPlan, ledger: Ledger, bus: EventBus) -> None:
    """Write the batch to the ledger, then announce each record it did not refuse.

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
    for trial_id, stored_experiment in outcome.conflicts.items():
        log.error(
            "record refused: its trial belongs to another experiment (not moved)",
            trial_id=trial_id,
            experiment_id=plan.records[trial_id].experiment_id,
            stored_experiment_id=stored_experiment,
        )
    # A conflict is not announced: a ResultImported for the event's experiment would
    # tell its watchers the trial is recorded there, and it is not.
    events = [
        result_imported(rec, outcome, plan.correlation.get(rec.trial_id, ""))
        for rec in plan.records.values()
        if rec.trial_id not in outcome.conflicts
    ]
    # All at once: awaited one after the other, each acknowledged publish is a round
    # trip, and they made up most of a batch's time (benchmarks, docs/performance.md).
    # Pipelined (publish_many): each still acknowledged, without a request (an inbox,
    # a timer, a future) per event.
    await bus.publish_many(events)


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
                    result=rec.artifacts.archive,
                )
            )
            plan.records[trial_id] = stub
            one = await ledger.upsert_records([stub])
        total.merge(one)
    return total
