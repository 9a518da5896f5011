"""Import a Harbor job directory (made by ``harbor run`` or by trialbus) into the ledger.

A job directory holds one folder per trial, named after Harbor's ``trial_name``
(trialbus sets it to its trial_id). A trial folder is any non-hidden subfolder with a
``result.json``, ``config.json`` or ``trial.log``; one without ``result.json`` is
imported as a partial record, never skipped. Hidden folders (trialbus keeps earlier
attempts of retried trials under ``.attempts/``) are not trials. A folder that holds
job folders (``harbor_jobs.is_job_folder``: ``trialbus export``'s destination, a jobs folder) is
refused, naming one to import: its jobs' result.json are not trials' results.

Experiment id: a job made by trialbus has a job-level ``trialbus.json`` holding
``{"experiment_id": ...}``; any other job gets ``"harbor-" + slug(job folder name)``.

Trial ids: the trial folder's name, i.e. Harbor's ``trial_name`` (trialbus's own
trial_id in a trialbus job; ``<task>__<random>`` in a ``harbor run`` job, so two
different Harbor runs do not share trial ids, and re-importing a folder, or a folder
the watcher already reported, keeps its ids). A copied or renamed folder has the
same trial ids under another experiment: the ledger refuses to move them (a record
never changes experiment) and the import fails with ``ImportConflict`` naming both
experiments. Importing it anyway is an explicit choice (``as_new``, the CLI's
``--as-new``): each trial id then carries a digest of the experiment id
(``scoped_trial_id``), so the folder's trials become records of their own.

Importing is idempotent: what the folder cannot tell (repetition, agent label, runner
host, ...) is taken from the ledger's existing record of the same trial, so importing
an unchanged folder again, or importing a folder the runners already reported,
rewrites nothing.

Given an EventBus, an import is announced like any other: one ResultImported per
record written (``changed`` False when the ledger already held it), published after
the ledger write of its batch, as the importer service does; a conflict is not
announced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from schemas.ids import slug
from schemas.record import TrialRecord
from services.common.errors import UserInputError
from services.common.folder_reads import Unread, read_inside
from services.common.harbor_jobs import MARKER, MAX_MARKER_BYTES, is_job_folder
from services.common.ports import EventBus, Ledger
from services.importer.handlers import result_imported
from services.importer.records import RecordContext, RecordSource, build_record

_TRIAL_FILES: Final = ("result.json", "config.json", "trial.log")


class JobDirError(UserInputError, ValueError):
    """The job directory itself cannot be imported (the message says why and how to fix)."""


AS_NEW_FLAG: Final = "--as-new"
"""The CLI flag of ``import_job_dir(..., as_new=True)``, named in conflict messages."""


def scoped_trial_id(experiment_id: str, name: str) -> str:
    """The trial id of folder ``name`` imported as a new experiment (``as_new``).

    The folder's name keeps the id readable; the digest of the experiment id makes it
    the experiment's own, so a copy of a folder never shares ids with the original.
    """
    digest = hashlib.sha256(experiment_id.encode()).hexdigest()[:10]
    return f"{name}__{digest}"


@dataclass(frozen=True, slots=True)
class TrialDirInfo:
    """One trial folder found in a job directory, and what trialbus knows of it (its
    ``context`` names the trial and its experiment)."""

    trial_dir: Path
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
    """What an import did (``trialbus import --json``). ``imported`` = inserted + updated."""

    job_dir: Path
    experiment_id: str
    """The experiment the trials were filed under (the marker's, or ``harbor-<folder>``)."""
    total: int = 0
    """Trial folders found."""
    inserted: int = 0
    """Records the ledger did not hold before."""
    updated: int = 0
    """Records whose content changed (a fixed trial folder, a better result)."""
    unchanged: int = 0
    """Records the ledger already held with the same content, or a better one it kept."""
    partial: int = 0
    """Records built as partial: the folder held no complete, readable result.json."""
    errors: list[TrialIssue] = field(default_factory=list)
    """What could not be read in each trial folder (the record is still written)."""
    conflicts: dict[str, str] = field(default_factory=dict)
    """Trial id -> the experiment the ledger holds it under (a copied or renamed folder):
    not imported."""

    @property
    def imported(self) -> int:
        return self.inserted + self.updated


class ImportConflict(JobDirError):
    """Trials of the folder are stored under another experiment: they were not moved.

    The trials of the folder that are not another experiment's were imported;
    ``summary`` says what was done, ``summary.conflicts`` which trials were refused.
    """

    def __init__(self, summary: ImportSummary, by_trialbus: bool) -> None:
        self.summary = summary
        others = sorted(set(summary.conflicts.values()))
        n = len(summary.conflicts)
        if by_trialbus:
            fix = (
                f"its {MARKER} names experiment {summary.experiment_id!r}; fix the marker, "
                "or delete it and re-run with " + AS_NEW_FLAG
            )
        else:
            fix = (
                "it looks like a copied or renamed job folder; to import it as a new "
                f"experiment with trial ids of its own, re-run with {AS_NEW_FLAG}"
            )
        super().__init__(
            f"{summary.job_dir}: {n} of {summary.total} trials already belong to experiment "
            f"{', '.join(others)} and were not moved to experiment {summary.experiment_id} "
            f"({summary.imported} imported, {summary.unchanged} unchanged); {fix}"
        )


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


def scan_job_dir(job_dir: Path, *, as_new: bool = False) -> list[TrialDirInfo]:
    """List the trial folders of a Harbor job directory, sorted by name.

    A trial's id is its folder's name, or with ``as_new`` its ``scoped_trial_id``.
    """
    job_dir = job_dir.absolute()
    if not job_dir.is_dir():
        raise JobDirError(f"{job_dir}: not a directory; pass a Harbor job folder")
    if (job_dir / "result.json").is_file() and (job_dir / "agent").is_dir():
        raise JobDirError(f"{job_dir}: this is a trial folder, not a job folder; pass its parent")
    experiment_id, by_trialbus = experiment_id_for_job(job_dir)
    source: RecordSource = "runner" if by_trialbus else "import"
    children = [c for c in sorted(job_dir.iterdir()) if not c.name.startswith(".") and c.is_dir()]
    if jobs := [c.name for c in children if is_job_folder(c)]:
        # A folder of jobs (`trialbus export`'s destination, a jobs folder): each job's
        # result.json would be read as a trial's, into a record of nothing.
        shown = ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
        raise JobDirError(
            f"{job_dir}: holds Harbor job folders ({shown}), not trial folders; import "
            f"each job folder on its own (e.g. {job_dir / jobs[0]})"
        )
    found: list[TrialDirInfo] = []
    for child in children:
        if not any((child / name).exists() for name in _TRIAL_FILES):
            continue
        trial_id = scoped_trial_id(experiment_id, child.name) if as_new else child.name
        context = RecordContext(
            experiment_id=experiment_id, trial_id=trial_id, source=source, job_dir=job_dir
        )
        found.append(TrialDirInfo(child, context))
    return found


def _with_known(context: RecordContext, known: TrialRecord | None, folder: Path) -> RecordContext:
    """Fill what a folder cannot tell from the ledger's record of the same trial.

    A folder the importer unpacked from the results bucket (the record names it)
    keeps pointing at that archive.
    """
    if known is None:
        return context
    p = known.provenance
    same_folder = known.artifacts.trial_dir == str(folder.absolute())
    return dataclasses.replace(
        context,
        repetition=known.repetition,
        agent_label=p.agent_label,
        environment=p.environment,
        harbor_version=p.harbor_version,
        runner_host=p.runner_host,
        source=p.source,
        task_path=p.task_path,
        task_archive=p.task_archive,
        attempts=known.attempts,
        archive=known.artifacts.archive if same_folder else None,
    )


def _stored_copy(record: TrialRecord, known: TrialRecord | None) -> TrialRecord:
    """``record``, or the ledger's when they differ only in where the files are.

    A trial the importer first read from the results bucket (a runner's, or an external
    job's announced by the watcher) keeps pointing at that stored copy when the same
    folder is imported by hand: the content is the same, the stored copy is reachable
    from anywhere, and a re-import stays a no-op.
    """
    if known is None or known.artifacts.archive is None:
        return record
    candidate = record.model_copy(update={"artifacts": known.artifacts})
    return known if candidate == known else record


def _build_all(infos: list[TrialDirInfo], known: dict[str, TrialRecord]) -> list[TrialRecord]:
    records = []
    for i in infos:
        old = known.get(i.context.trial_id)
        built = build_record(i.trial_dir, _with_known(i.context, old, i.trial_dir))
        records.append(_stored_copy(built, old))
    return records


def _start_build(
    chunks: list[list[TrialDirInfo]], index: int, known: dict[str, TrialRecord]
) -> asyncio.Future[list[TrialRecord]] | None:
    if index >= len(chunks):
        return None
    return asyncio.ensure_future(asyncio.to_thread(_build_all, chunks[index], known))


async def import_job_dir(
    job_dir: Path,
    ledger: Ledger,
    batch_size: int = 500,
    *,
    bus: EventBus | None = None,
    as_new: bool = False,
) -> ImportSummary:
    """Import every trial folder of ``job_dir``; a malformed trial never stops the others.

    With ``bus``, each record written is announced with a ResultImported once its
    batch is in the ledger. With ``as_new``, trial ids are the experiment's own
    (``scoped_trial_id``). Raises ImportConflict (a JobDirError) after the import when
    trials of the folder belong to another experiment (they are left there, not
    announced), JobDirError when the folder itself is unusable,
    LedgerUnavailable when the ledger cannot be reached, and TransientError when a
    publish is not confirmed (re-running the import is always safe: it rewrites
    nothing and announces every record again, unchanged).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    infos = await asyncio.to_thread(lambda: scan_job_dir(job_dir, as_new=as_new))
    experiment_id, by_trialbus = experiment_id_for_job(job_dir.absolute())
    if as_new and by_trialbus:
        # Its trials would be filed twice in the marker's experiment, under two ids each.
        raise JobDirError(
            f"{job_dir.absolute() / MARKER}: {AS_NEW_FLAG} imports folders made outside "
            f"trialbus; this one belongs to experiment {experiment_id!r}. Import it without "
            f"{AS_NEW_FLAG}, or delete the marker to import it as a plain Harbor job"
        )
    summary = ImportSummary(job_dir=job_dir.absolute(), experiment_id=experiment_id)
    known = {r.trial_id: r for r in await ledger.records_for(experiment_id)}
    if as_new and any(info.trial_dir.name in known for info in infos):
        # The folder's own ids are this experiment's already: scoped ids would file
        # each trial twice in it.
        raise JobDirError(
            f"{job_dir.absolute()}: its trials are already experiment {experiment_id}'s "
            f"under their own ids; import it without {AS_NEW_FLAG}"
        )
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
                await bus.publish_many(
                    [
                        result_imported(r, outcome)
                        for r in records
                        if r.trial_id not in outcome.conflicts
                    ]
                )
            summary.total += len(records)
            summary.inserted += len(outcome.inserted)
            summary.updated += len(outcome.updated)
            summary.unchanged += len(outcome.unchanged)
            summary.conflicts.update(outcome.conflicts)
            for info, record in zip(chunk, records, strict=True):
                if record.status == "partial":
                    summary.partial += 1
                summary.errors.extend(
                    TrialIssue(record.trial_id, info.trial_dir, e) for e in record.errors
                )
    finally:
        if building is not None:
            building.cancel()  # the ledger failed: the read-ahead is not wanted
    if summary.conflicts:
        raise ImportConflict(summary, by_trialbus)
    return summary
