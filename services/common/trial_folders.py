"""A finished trial's folder, stored in the results bucket: what TrialCompleted points at.

The runner (and the watcher, for external jobs) shares no disk with the importer: when
an attempt ends, its Harbor trial folder is packed (services.common.archive.pack_trial:
deterministic, capped, overflow listed in the archive's manifest, nothing followed) and
stored under a name keyed by
the run and attempt. The event carries the ObjectRef (bucket, name, size, sha256); the
local folder is only a cache, deleted once the run's ending is published.

A runner's trial folder is redacted as it is packed (``scrub_for``: the trial's
secrets, services.common.redaction.TrialSecrets): result.json's exception message,
agent logs and trajectories can quote an API key or the runner's own password, and
Harbor scrubs only exact values of variables named like KEY/SECRET/TOKEN. Text files
only, within the archive's cap; binary files are stored as they are. The archive's
manifest counts the replacements (never the values), and the local copy is not
rewritten (it is deleted once stored, unless kept by setting for debugging).
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from schemas.events import TrialRequested
from schemas.objects import ObjectRef
from services.common.archive import Scrub, pack_trial
from services.common.errors import TransientError
from services.common.logging import get_logger
from services.common.ports import ObjectStore

log = get_logger(__name__)

# A put that is not confirmed is tried again after these pauses before the trial's
# message is handed back (which would run the whole trial again).
UPLOAD_RETRY_DELAYS_S = (1.0, 3.0, 10.0)


DISCARDING_PREFIX = ".discarding-"
"""Name prefix of a stored trial folder set aside for deletion (``set_aside``)."""


def sweep_set_aside(jobs_root: Path) -> int:
    """Delete the folders a runner set aside (``TrialFolders.set_aside``) but did not
    get to delete before it stopped; each was stored, and its ending published, before
    it was set aside. Returns how many were deleted."""
    swept = 0
    for aside in jobs_root.glob(f"*/{DISCARDING_PREFIX}*"):
        shutil.rmtree(aside, ignore_errors=True)
        swept += 1
    return swept


def result_object_name(request: TrialRequested, attempt: int) -> str:
    """Object name of one attempt's trial folder: keyed by experiment, run and attempt."""
    return f"{request.experiment_id}/{request.dedup_id()}/{attempt}.tar.gz"


@dataclass(frozen=True, slots=True)
class TrialFolders:
    """Stores trial folders in the results bucket (and tidies the local copies)."""

    store: ObjectStore
    cap_bytes: int
    keep_local: bool = False
    retry_delays_s: tuple[float, ...] = UPLOAD_RETRY_DELAYS_S
    scrub_for: Callable[[TrialRequested], Scrub | None] | None = None
    """The redaction of a trial's files (None: stored as they are; the watcher's
    external jobs, whose secrets trialbus does not know)."""

    async def upload(self, request: TrialRequested, attempt: int, folder: Path) -> ObjectRef:
        """Pack (redacted: ``scrub_for``) and store one attempt's folder."""
        scrub = self.scrub_for(request) if self.scrub_for is not None else None
        return await self.store_as(result_object_name(request, attempt), folder, scrub)

    async def store_as(self, name: str, folder: Path, scrub: Scrub | None = None) -> ObjectRef:
        """Pack ``folder`` and store it as ``name``; TransientError when not confirmed."""
        archive = await asyncio.to_thread(pack_trial, folder, self.cap_bytes, scrub=scrub)
        if archive.left_out:
            log.warning(
                "trial folder stored in part",
                object=name,
                left_out=len(archive.left_out),
                left_out_bytes=sum(f.size for f in archive.left_out),
            )
        if archive.redactions:
            log.info("trial folder redacted", object=name, replacements=archive.redactions)
        for delay in (*self.retry_delays_s, None):
            try:
                return await self.store.put(name, archive.data)
            except TransientError as exc:
                if delay is None:
                    raise
                log.warning("trial folder upload failed; retrying", error=str(exc), delay_s=delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # the loop returns or raises

    def set_aside(self, folder: Path) -> Path | None:
        """Move an uploaded trial folder out of its trial's path, for ``discard`` later:
        one rename in the same folder (a hidden name), so a next attempt of the trial
        finds its path free at once. None: kept by setting, or not there."""
        if self.keep_local:
            return None
        aside = folder.parent / f"{DISCARDING_PREFIX}{folder.name}.{uuid.uuid4().hex[:12]}"
        try:
            folder.rename(aside)
        except FileNotFoundError:
            return None
        return aside

    async def discard(self, folder: Path) -> None:
        """Delete the local copy of an uploaded trial folder (unless kept by setting)."""
        await self.discard_all([folder])

    async def discard_all(self, folders: list[Path]) -> None:
        """Delete the local copies of uploaded trial folders, in one worker thread."""
        if not self.keep_local and folders:
            await asyncio.to_thread(_remove_all, folders)


def _remove_all(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
