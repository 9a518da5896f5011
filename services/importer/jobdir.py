"""Import a Harbor job directory (made by ``harbor run`` or by trialbus) into the ledger.

A job directory holds one folder per trial, named after Harbor's ``trial_name``
(trialbus sets it to its trial_id). A trial folder is any non-hidden subfolder with a
``result.json``, ``config.json`` or ``trial.log``; one without ``result.json`` is
imported as a partial record, never skipped. Hidden folders (trialbus keeps earlier
attempts of retried trials under ``.attempts/``) are not trials.

Experiment id: a job made by trialbus has a job-level ``trialbus.json`` holding
``{"experiment_id": ...}``; any other job gets ``"harbor-" + slug(job folder name)``.

Importing is idempotent: what the folder cannot tell (repetition, agent label, runner
host, ...) is taken from the ledger's existing record of the same trial, so importing
an unchanged folder again, or importing a folder the runners already reported,
rewrites nothing.

Given an EventBus, an import is announced like any other: one ResultImported per
record written (``changed`` False when the ledger already held it), published after
the ledger write of its batch, as the importer service does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from schemas.ids import slug
from schemas.record import TrialRecord
from services.common.errors import UserInputError
from services.common.folder_reads import Unread, read_inside
from services.common.harbor_jobs import MARKER, MAX_MARKER_BYTES
from services.common.ports import EventBus, Ledger
from services.importer.handlers import result_imported
from services.importer.records import RecordContext, RecordSource, build_record

_TRIAL_FILES: Final = ("result.json", "config.json", "trial.log")


class JobDirError(UserInputError, ValueError):
    """The job directory itself cannot be imported (the message says why and how to fix)."""


@dataclass(frozen=True, slots=True)
class TrialDirInfo:
    """One trial folder found in a job directory."""

    trial_dir: Path
    trial_id: str
    experiment_id: str
    has_result: bool
    context: RecordContext


@dataclass(frozen=True, slots=True)
class TrialIssue:
    """A diagnostic of one imported trial."""

    trial_id: str
    trial_dir: Path
    message: str

    def __str__(self) -> str:
        return f"{self.trial_id}: {self.message}"


@dataclass(slots=True)
class ImportSummary:
    """What an import did. ``imported`` = inserted + updated."""

    job_dir: Path
    experiment_id: str
    total: int = 0
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    partial: int = 0
    errors: list[TrialIssue] = field(default_factory=list)

    @property
    def imported(self) -> int:
        return self.inserted + self.updated


def experiment_id_for_job(job_dir: Path) -> tuple[str, bool]:
    """(experiment id, made by trialbus) of a job directory.

    Raises JobDirError when a ``trialbus.json`` exists but is unusable: guessing an
    id would file the trials under the wrong experiment.
    """
    marker = job_dir / MARKER
    got = read_inside(job_dir, MARKER, MAX_MARKER_BYTES)
    if isinstance(got, Unread) and got.missing:
        return f"harbor-{slug(job_dir.name)}", False
    if isinstance(got, Unread):
        raise JobDirError(
            f"{marker}: {got.reason}; replace it with a regular file or delete it to "
            "import the folder as a plain Harbor job"
        )
    try:
        data = json.loads(got.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deeply
        raise JobDirError(
            f"{marker}: unreadable ({exc}); fix it or delete it to import the folder as a "
            "plain Harbor job"
        ) from exc
    experiment_id = data.get("experiment_id") if isinstance(data, dict) else None
    if not isinstance(experiment_id, str) or not experiment_id:
        raise JobDirError(
            f"{marker}: needs a non-empty string field 'experiment_id' "
            '(e.g. {"experiment_id": "my-exp"})'
        )
    return experiment_id, True


def scan_job_dir(job_dir: Path) -> list[TrialDirInfo]:
    """List the trial folders of a Harbor job directory, sorted by name."""
    job_dir = job_dir.absolute()
    if not job_dir.is_dir():
        raise JobDirError(f"{job_dir}: not a directory; pass a Harbor job folder")
    if (job_dir / "result.json").is_file() and (job_dir / "agent").is_dir():
        raise JobDirError(f"{job_dir}: this is a trial folder, not a job folder; pass its parent")
    experiment_id, by_trialbus = experiment_id_for_job(job_dir)
    source: RecordSource = "runner" if by_trialbus else "import"
    found: list[TrialDirInfo] = []
    for child in sorted(job_dir.iterdir()):
        if child.name.startswith(".") or not child.is_dir():
            continue
        if not any((child / name).exists() for name in _TRIAL_FILES):
            continue
        context = RecordContext(
            experiment_id=experiment_id,
            trial_id=child.name,
            source=source,
            job_dir=job_dir,
        )
        found.append(
            TrialDirInfo(
                trial_dir=child,
                trial_id=child.name,
                experiment_id=experiment_id,
                has_result=(child / "result.json").exists(),
                context=context,
            )
        )
    return found


def _with_known(context: RecordContext, known: TrialRecord | None) -> RecordContext:
    """Fill what a folder cannot tell from the ledger's record of the same trial."""
    if known is None:
        return context
    p = known.provenance
    return dataclasses.replace(
        context,
        repetition=known.repetition,
        agent_label=p.agent_label,
        environment=p.environment,
        harbor_version=p.harbor_version,
        runner_host=p.runner_host,
        source=p.source,
        task_path=p.task_path,
        attempts=known.attempts,
    )


def _build_all(infos: list[TrialDirInfo], known: dict[str, TrialRecord]) -> list[TrialRecord]:
    return [build_record(i.trial_dir, _with_known(i.context, known.get(i.trial_id))) for i in infos]


def _start_build(
    chunks: list[list[TrialDirInfo]], index: int, known: dict[str, TrialRecord]
) -> asyncio.Future[list[TrialRecord]] | None:
    if index >= len(chunks):
        return None
    return asyncio.ensure_future(asyncio.to_thread(_build_all, chunks[index], known))


async def import_job_dir(
    job_dir: Path, ledger: Ledger, batch_size: int = 500, *, bus: EventBus | None = None
) -> ImportSummary:
    """Import every trial folder of ``job_dir``; a malformed trial never stops the others.

    With ``bus``, each record written is announced with a ResultImported once its
    batch is in the ledger. Raises JobDirError when the folder itself is unusable,
    LedgerUnavailable when the ledger cannot be reached, and TransientError when a
    publish is not confirmed (re-running the import is always safe: it rewrites
    nothing and announces every record again, unchanged).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    infos = await asyncio.to_thread(scan_job_dir, job_dir)
    experiment_id, _ = experiment_id_for_job(job_dir.absolute())
    summary = ImportSummary(job_dir=job_dir.absolute(), experiment_id=experiment_id)
    known = {r.trial_id: r for r in await ledger.records_for(experiment_id)}
    chunks = [infos[i : i + batch_size] for i in range(0, len(infos), batch_size)]
    # File reads run off the event loop (a job may hold thousands of trials), and the
    # next batch is read while the ledger writes this one: reading is this process's
    # work, writing the server's, so they overlap (docs/performance.md).
    building = _start_build(chunks, 0, known)
    try:
        for index, chunk in enumerate(chunks):
            assert building is not None
            records = await building
            building = _start_build(chunks, index + 1, known)
            outcome = await ledger.upsert_records(records)
            if bus is not None:
                await bus.publish_many([result_imported(r, outcome) for r in records])
            summary.total += len(records)
            summary.inserted += len(outcome.inserted)
            summary.updated += len(outcome.updated)
            summary.unchanged += len(outcome.unchanged)
            for info, record in zip(chunk, records, strict=True):
                if record.status == "partial":
                    summary.partial += 1
                summary.errors.extend(
                    TrialIssue(record.trial_id, info.trial_dir, e) for e in record.errors
                )
    finally:
        if building is not None:
            building.cancel()  # the ledger failed: the read-ahead is not wanted
    return summary
