"""A finished trial's ledger record, built from its event and its stored trial folder.

The importer's batch logic (services.importer.handlers) calls ``record_for`` for each
TrialCompleted or final TrialFailed, and asks ``record_failure_verdict`` how to settle
a message whose record could not be built: nak (a later delivery may succeed), or
give up with an ``importer_error_record`` once the message has been delivered
BUG_MAX_DELIVERIES times. A stored folder that is damaged or unsafe gives a partial
record at once (``unreadable_result_record``): a redelivery would fetch the same bytes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from schemas.events import TrialCompleted, TrialFailed
from schemas.record import Artifacts, TrialRecord
from services.common.errors import ACK, ObjectCorrupt, ObjectMissing, Settle, settle_error
from services.common.unpack import ArchiveError
from services.importer.folders import StoredTrials
from services.importer.records import RecordContext, build_failed_record, build_record
from services.importer.trial_files import TrialFiles

BUG_MAX_DELIVERIES: Final = 5
"""From this delivery on, a message whose record cannot be built gets an ImporterError
record instead of another nak (about 40 s of bug delays: long enough for a transient
oddity to pass, short enough that an experiment does not wait on a bug for long)."""


def _context_for_completed(ev: TrialCompleted) -> RecordContext:
    """What the event tells a record beyond the trial's files (it names no task folder:
    ``task_path`` stays None, as for every record the importer builds from an event)."""
    return RecordContext(
        experiment_id=ev.experiment_id,
        trial_id=ev.trial_id,
        repetition=ev.repetition,
        agent_label=ev.agent_label,
        environment=ev.environment,
        harbor_version=ev.harbor_version,
        runner_host=ev.runner_host,
        source=ev.source,
        attempts=ev.attempt,
        archive=ev.result,
        task_archive=ev.task.checksum if ev.task else None,
    )


def _completed_record(files: TrialFiles, event: TrialCompleted) -> TrialRecord:
    record = build_record(files, _context_for_completed(event))
    if event.source != "external":
        return record
    # Read from a scratch copy: the folder itself is on the watcher's machine.
    return record.model_copy(update={"artifacts": Artifacts(archive=event.result)})


def _importer_failure(
    event: TrialCompleted | TrialFailed, error_type: str, message: str, **fields: Any
) -> TrialFailed:
    """A final infrastructure failure standing for ``event`` when the importer cannot
    record it as it came; ``fields``: more of the event's own fields to keep."""
    return TrialFailed(
        experiment_id=event.experiment_id,
        trial_id=event.trial_id,
        correlation_id=event.correlation_id,
        failure_class="infrastructure",
        error_type=error_type,
        message=message,
        attempt=event.attempt,
        final=True,
        result=event.result,
        **fields,
    )


def unreadable_result_record(event: TrialCompleted, exc: BaseException) -> TrialRecord:
    """The partial record of a trial whose stored folder cannot be used."""
    failed = _importer_failure(
        event,
        type(exc).__name__,
        f"stored trial folder {event.result.name} unusable: {exc}"[:2000],
        repetition=event.repetition,
        runner_host=event.runner_host,
    )
    return build_failed_record(failed, _context_for_completed(event))


async def record_for(event: TrialCompleted | TrialFailed, trials: StoredTrials) -> TrialRecord:
    """Build the ledger record of a finished trial (never raises on its files' contents).

    Raises ObjectMissing or a TransientError when the stored folder cannot be fetched
    now; a damaged or unsafe one gives a partial record instead.
    """
    if isinstance(event, TrialFailed):
        return build_failed_record(event)
    try:
        return await trials.use_folder(event, lambda files: _completed_record(files, event))
    except (ObjectCorrupt, ArchiveError) as exc:
        return unreadable_result_record(event, exc)


async def try_record_for(
    event: TrialCompleted | TrialFailed, trials: StoredTrials, limit: asyncio.Semaphore
) -> TrialRecord | Exception:
    """``record_for`` within ``limit``; a bug is returned, not raised: it must settle
    its own message, not the batch."""
    try:
        async with limit:
            return await record_for(event, trials)
    except Exception as exc:  # noqa: BLE001 - every bug becomes a verdict (record_failure_verdict)
        return exc


def record_failure_verdict(
    exc: BaseException, delivered: int, *, transient_delay_s: float
) -> Settle:
    """How to settle a message whose record could not be built (``exc`` was raised).

    A nak leaves the trial to a later delivery: always for a TransientError but a
    missing stored folder, and for it and a bug (settle_error's "bug" verdict) before
    the BUG_MAX_DELIVERIES-th delivery. ACK means give up: the caller writes an
    ImporterError record and acknowledges it. A message is never terminated here: its
    trial would be left with no record at all.
    """
    verdict = settle_error(exc, transient_delay_s=transient_delay_s)
    if isinstance(exc, ObjectMissing):
        return verdict if delivered < BUG_MAX_DELIVERIES else ACK
    if verdict.reason == "transient":
        return verdict
    if verdict.reason == "bug" and delivered < BUG_MAX_DELIVERIES:
        return verdict
    return ACK


def importer_error_record(event: TrialCompleted | TrialFailed, exc: BaseException) -> TrialRecord:
    """The partial record written when the importer gives up on a trial's record."""
    message = f"importer could not build the record: {type(exc).__name__}: {exc}"
    return build_failed_record(_importer_failure(event, "ImporterError", message))
