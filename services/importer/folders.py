"""Trial folders from the results bucket, unpacked into the importer's job folders.

A TrialCompleted carries an ObjectRef, never a path: the importer fetches the archive
(verified against the reference's size and sha256), unpacks it safely
(services.common.unpack: no links, no absolute names, bounded size) into
``<jobs_dir>/<experiment_id>/<trial_name>/`` and builds the record from that folder.
So the importer's ``jobs_dir`` holds a normal Harbor job folder per experiment, which
``harbor view`` opens, on the importer's machine; ``trialbus export`` writes the same
anywhere from the ledger and the bucket.

A redelivered event replaces the folder with the archive's contents (the unpack goes
to a temporary folder first, then takes the old one's place).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from schemas.events import TrialCompleted
from services.common.harbor_jobs import ensure_job_dir, job_dir_for, read_marker, write_job_result
from services.common.ports import ObjectStore
from services.common.unpack import unpack_trial


def job_config_for(experiment_id: str, jobs_root: Path) -> dict[str, object]:
    """The job-level config.json of a job folder built from stored trials."""
    return {"job_name": experiment_id, "jobs_dir": str(jobs_root)}


def place_trial(jobs_root: Path, experiment_id: str, trial_name: str, data: bytes) -> Path:
    """Unpack one trial archive as ``<jobs_root>/<experiment_id>/<trial_name>``; its path.

    Raises ArchiveError when the archive breaks an unpacking rule (nothing is left
    behind then). ``experiment_id`` and ``trial_name`` are pattern-checked by the event
    schema (one safe path component each); containment is checked here as well.
    """
    job_dir = job_dir_for(jobs_root, experiment_id)
    dest = (job_dir / trial_name).resolve()
    if dest.parent != job_dir or job_dir.parent != jobs_root.resolve():
        raise ValueError(f"trial {experiment_id}/{trial_name} would leave the jobs folder")
    ensure_job_dir(
        job_dir,
        experiment_id=experiment_id,
        name=experiment_id,
        job_config=job_config_for(experiment_id, jobs_root.resolve()),
    )
    staged = job_dir / f".{trial_name}.{uuid.uuid4().hex[:8]}.new"
    unpack_trial(data, staged)
    if dest.exists():
        old = job_dir / f".{trial_name}.{uuid.uuid4().hex[:8]}.old"
        dest.rename(old)
        staged.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staged.rename(dest)
    return dest


class StoredTrials:
    """Fetches trial archives from the results bucket into the importer's job folders."""

    def __init__(self, store: ObjectStore, jobs_root: Path) -> None:
        self.store = store
        self.jobs_root = jobs_root

    @contextlib.asynccontextmanager
    async def folder(self, event: TrialCompleted) -> AsyncIterator[Path]:
        """The trial's folder, unpacked from the archive ``event.result`` names.

        A trial trialbus ran lands in its experiment's job folder and stays; one of an
        external job (its own job folder exists where the watcher found it) is
        unpacked into a scratch folder removed on exit. Raises ObjectMissing (gone:
        expired or never stored), ObjectCorrupt (bytes differ from the reference),
        ArchiveError (breaks an unpacking rule), or a TransientError.
        """
        data = await self.store.get(event.result)
        if event.source != "external":
            yield await asyncio.to_thread(
                place_trial, self.jobs_root, event.experiment_id, event.trial_name, data
            )
            return
        scratch = self.jobs_root / ".scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        dest = scratch / f"{event.trial_name}.{uuid.uuid4().hex[:8]}"
        try:
            yield await asyncio.to_thread(unpack_trial, data, dest)
        finally:
            await asyncio.to_thread(shutil.rmtree, dest, True)

    async def finish_job(self, experiment_id: str, n_trials: int) -> bool:
        """Write Harbor's job-level result.json of a completed experiment's job folder.

        False when this importer holds no job folder of it (e.g. an external job).
        """
        job_dir = job_dir_for(self.jobs_root, experiment_id)
        if read_marker(job_dir) is None:
            return False
        await asyncio.to_thread(write_job_result, job_dir, experiment_id, n_trials)
        return True
