"""Trial folders from the results bucket, unpacked into the importer's job folders.

A TrialCompleted carries an ObjectRef, never a path: the importer fetches the archive
(verified against the reference's size and sha256), unpacks it safely
(services.common.unpack: no links, no absolute names, bounded size) into
``<jobs_dir>/<experiment_id>/<trial_name>/`` and builds the record from what it
unpacked (``ArchiveFiles``: the few files the record reads are kept in memory while
unpacking, not read back). So the importer's ``jobs_dir`` holds a normal Harbor job
folder per experiment, which ``harbor view`` opens, on the importer's machine;
``trialbus export`` writes the same anywhere from the ledger and the bucket.

A new trial is unpacked straight into its folder (created exclusively, removed on any
refusal). A redelivered event replaces the folder with the archive's contents (the
unpack goes to a temporary folder first, then takes the old one's place).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from schemas.events import TrialCompleted
from services.common.harbor_jobs import ensure_job_dir, job_dir_for, read_marker, write_job_result
from services.common.ports import ObjectStore
from services.common.unpack import Unpacked, unpack_trial_files
from services.importer.trial_files import RECORD_FILES, ArchiveFiles, TrialFiles

_JOB_DIRS_KEPT = 1024  # experiments whose job folder StoredTrials remembers


def job_config_for(experiment_id: str, jobs_root: Path) -> dict[str, object]:
    """The job-level config.json of a job folder built from stored trials."""
    return {"job_name": experiment_id, "jobs_dir": str(jobs_root)}


def checked_job_dir(jobs_root: Path, experiment_id: str) -> Path:
    """The experiment's job folder, resolved and checked to lie directly in ``jobs_root``.

    Resolved once per experiment (StoredTrials keeps it): a link in the jobs folder
    cannot lead its trials elsewhere, and trials do not pay a path resolution each.
    """
    root = jobs_root.resolve()
    job_dir = job_dir_for(root, experiment_id)
    if job_dir.parent != root:
        raise ValueError(f"experiment {experiment_id} would leave the jobs folder")
    return job_dir


def place_trial(
    jobs_root: Path, experiment_id: str, trial_name: str, data: bytes, job_dir: Path | None = None
) -> Path:
    """Unpack one trial archive as ``<jobs_root>/<experiment_id>/<trial_name>``; its path.

    Raises ArchiveError when the archive breaks an unpacking rule (nothing is left
    behind then). ``experiment_id`` and ``trial_name`` are pattern-checked by the event
    schema (one safe path component each); containment is checked here as well.
    ``job_dir``: the experiment's ``checked_job_dir`` when the caller has it already.
    """
    job_dir = job_dir or checked_job_dir(jobs_root, experiment_id)
    return _placed(job_dir, experiment_id, trial_name, data, {}, ensured=False).path


def _ensure(job_dir: Path, experiment_id: str) -> None:
    ensure_job_dir(
        job_dir,
        experiment_id=experiment_id,
        name=experiment_id,
        job_config=job_config_for(experiment_id, job_dir.parent),
    )


def _placed(
    job_dir: Path,
    experiment_id: str,
    trial_name: str,
    data: bytes,
    keep: Mapping[str, int],
    *,
    ensured: bool,
) -> Unpacked:
    """``place_trial``'s work, keeping the bytes of the ``keep`` files.

    ``ensured``: the job folder was made (with its marker) for an earlier trial of the
    experiment, so it is not checked again unless the trial's folder cannot be created.
    """
    if "/" in trial_name or trial_name in ("", ".", ".."):
        raise ValueError(f"trial {experiment_id}/{trial_name} would leave the jobs folder")
    if not ensured:
        _ensure(job_dir, experiment_id)
    dest = job_dir / trial_name
    try:
        # The usual case: a trial nobody holds yet, unpacked straight into place.
        return unpack_trial_files(data, dest, keep=keep, in_place=True)
    except FileNotFoundError:
        if not ensured:
            raise
        # The job folder went away since it was made (an operator removed it).
        _ensure(job_dir, experiment_id)
        with contextlib.suppress(FileExistsError):  # another delivery was faster
            return unpack_trial_files(data, dest, keep=keep, in_place=True)
    except FileExistsError:
        pass  # a redelivery, another delivery's folder, or whatever took the name
    # A redelivery replaces the folder (or whatever took the name: renamed, not followed).
    staged = job_dir / f".{trial_name}.{uuid.uuid4().hex[:8]}.new"
    unpacked = unpack_trial_files(data, staged, keep=keep, in_place=True)
    old = job_dir / f".{trial_name}.{uuid.uuid4().hex[:8]}.old"
    with contextlib.suppress(FileNotFoundError):
        dest.rename(old)
    staged.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return Unpacked(dest, unpacked.kinds, unpacked.sizes, unpacked.kept)


class StoredTrials:
    """Fetches trial archives from the results bucket into the importer's job folders."""

    def __init__(self, store: ObjectStore, jobs_root: Path) -> None:
        self.store = store
        self.jobs_root = jobs_root
        self._job_dirs: dict[str, Path] = {}  # experiment id -> its checked_job_dir
        # Trials being placed, so two deliveries of one trial in a batch take turns: a
        # new trial is written in place, and a second delivery replacing the folder
        # while the first still writes into it would make the first fail (its writes
        # follow its folder, renamed away and removed; tests/unit/test_place_trial.py).
        self._placing: dict[tuple[str, str], tuple[threading.Lock, list[int]]] = {}
        self._placing_guard = threading.Lock()

    def _place(self, event: TrialCompleted, data: bytes) -> TrialFiles:
        """``place_trial`` with the experiment's job folder resolved and made once (off
        the loop), keeping the files the record reads."""
        experiment_id = event.experiment_id
        job_dir = self._job_dirs.get(experiment_id)
        ensured = job_dir is not None
        if job_dir is None:
            if len(self._job_dirs) >= _JOB_DIRS_KEPT:
                self._job_dirs.clear()
            job_dir = checked_job_dir(self.jobs_root, experiment_id)
        key = (experiment_id, event.trial_name)
        with self._placing_guard:  # (the trial's lock, how many deliveries use it)
            turn, users = self._placing.setdefault(key, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with turn:
                placed = _placed(
                    job_dir, experiment_id, event.trial_name, data, RECORD_FILES, ensured=ensured
                )
        finally:
            with self._placing_guard:
                users[0] -= 1
                if not users[0]:
                    del self._placing[key]
        self._job_dirs[experiment_id] = job_dir  # made: later trials skip the checks
        return ArchiveFiles(placed)

    async def use_folder[T](self, event: TrialCompleted, use: Callable[[TrialFiles], T]) -> T:
        """``use(files)``: the trial's files, unpacked from the archive ``event.result`` names.

        A trial trialbus ran lands in its experiment's job folder and stays; one of an
        external job (its own job folder exists where the watcher found it) is
        unpacked into a scratch folder removed after ``use``. Either way ``use`` gets
        ``ArchiveFiles``: what unpacking saw, with the bytes of RECORD_FILES. The
        unpacking and ``use`` run in one worker thread (one hand-off per trial: they
        were two, and each is a wake-up of the event loop). Raises ObjectMissing (gone:
        expired or never stored), ObjectCorrupt (bytes differ from the reference),
        ArchiveError (breaks an unpacking rule), or a TransientError.
        """
        data = await self.store.get(event.result)
        return await asyncio.to_thread(self._unpacked, event, data, use)

    def _unpacked[T](self, event: TrialCompleted, data: bytes, use: Callable[[TrialFiles], T]) -> T:
        if event.source != "external":
            return use(self._place(event, data))
        scratch = self.jobs_root / ".scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        dest = scratch / f"{event.trial_name}.{uuid.uuid4().hex[:8]}"
        try:
            return use(ArchiveFiles(unpack_trial_files(data, dest, keep=RECORD_FILES)))
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    async def finish_job(self, experiment_id: str, n_trials: int) -> bool:
        """Write Harbor's job-level result.json of a completed experiment's job folder.

        False when this importer holds no job folder of it (e.g. an external job).
        """
        job_dir = job_dir_for(self.jobs_root, experiment_id)
        if read_marker(job_dir) is None:
            return False
        await asyncio.to_thread(write_job_result, job_dir, experiment_id, n_trials)
        return True
