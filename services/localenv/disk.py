"""The disk quota of one trial: a size-limited file system for its overlay upper layers.

A trial's writes land in two kinds of host folders: the upper (and work) folders of
its overlays (everything it writes under /, /tmp included) and the writable folders
Harbor binds in (/logs/agent, /logs/verifier, /logs/artifacts). Both are bounded by
one number, ``limit_bytes``:

- **Upper layers, a hard limit.** As root, ``TrialDisk.create`` makes a sparse file
  of ``limit_bytes`` in the trial's folder, formats it ext4 (no journal, no reserved
  blocks) and loop-mounts it (``nosuid,nodev``); the overlays' upper and work folders
  live inside it. A write past the quota fails with ENOSPC, as in a container whose
  writable layer sits on a full disk, and the host file can never grow past
  ``limit_bytes``. The loop device is released when the trial's folder is unmounted
  (``autoclear``: the kernel frees it once the sandbox's own mount namespace is gone).
- **Everything, detection.** ``DiskQuota.check`` adds the file system's used bytes (one
  statvfs) to a bounded walk of the bound folders and names the quota once the sum
  passes it or the file system is full. The environment checks after every command and
  every few seconds while one runs, and ends the trial with ``DiskQuotaExceededError``.
  Without root (or without loop devices) the upper folders are walked too: detection
  only, best effort.

A runner that dies leaves the mount and its loop device behind; ``stale.sweep_stale``
(run at every trial start and at the runner's start) unmounts those of trials whose
lock (``disk.lock``, held by the trial's process for its whole life) is free, and
deletes their image files.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.localenv.errors import DiskQuotaExceededError, LocalEnvironmentError
from services.localenv.stale import (
    IMAGE_NAME,
    KEPT_NAME,
    LOCK_NAME,
    MOUNT_NAME,
    describe,
    run_tool,
    sweep_stale,
    unmount_disk,
)

__all__ = [
    "IMAGE_NAME",
    "LOCK_NAME",
    "MOUNT_NAME",
    "DiskQuota",
    "QuotaGuard",
    "TrialDisk",
    "folder_bytes",
    "sweep_stale",
]

FULL_SLACK_BYTES = 1 << 20
"""A file system with less free space than this is full: its writes are being refused."""
MAX_WALK_ENTRIES = 200_000
"""Entries one measurement of a folder visits at most (a bounded walk)."""
_MIN_IMAGE_BYTES = 16 << 20  # below this, ext4's own metadata leaves too little room


@dataclass(slots=True)
class TrialDisk:
    """A loop-mounted, size-limited file system in a trial's folder (see module doc)."""

    image: Path
    mount_point: Path
    lock_fd: int

    @classmethod
    def create(cls, root: Path, limit_bytes: int, logger: logging.Logger) -> TrialDisk | None:
        """Make, format and mount the trial's file system; None when the host cannot.

        The lock is taken before anything is mounted, so that a sweep never takes a
        disk being made for a stale one.
        """
        if os.geteuid() != 0:
            logger.warning(
                "local environment: not root, so no size-limited disk for %s; the disk "
                "quota is detected by measuring, not enforced",
                root.name,
            )
            return None
        root.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        image, mount_point = root / IMAGE_NAME, root / MOUNT_NAME
        try:
            with image.open("wb") as f:
                f.truncate(max(limit_bytes, _MIN_IMAGE_BYTES))  # sparse: no block yet
            mount_point.mkdir(exist_ok=True)
            run_tool(
                "mkfs.ext4",
                "-q",
                "-F",
                "-m",
                "0",
                "-O",
                "^has_journal",
                "-E",
                "lazy_itable_init=1,nodiscard",
                str(image),
            )
            # noinit_itable: the kernel does not zero inode tables in the background,
            # which would write them all into the sparse file.
            opts = "loop,nosuid,nodev,noatime,noinit_itable"
            run_tool("mount", "-o", opts, str(image), str(mount_point))
        except (OSError, subprocess.CalledProcessError, LocalEnvironmentError) as exc:
            logger.warning(
                "local environment: no size-limited disk for %s (%s); the disk quota is "
                "detected by measuring, not enforced",
                root.name,
                describe(exc),
            )
            with contextlib.suppress(OSError):
                image.unlink()
            os.close(lock_fd)
            return None
        return cls(image, mount_point, lock_fd)

    def release(self, *, keep_image: bool = False) -> None:
        """Unmount, free the loop device, delete the image (unless kept), drop the lock."""
        try:
            unmount_disk(self.mount_point)
            if keep_image:
                # Kept on purpose (keep_sandbox): a later sweep must not delete it.
                (self.image.parent / KEPT_NAME).touch()
            else:
                with contextlib.suppress(FileNotFoundError):
                    self.image.unlink()
        finally:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)


@dataclass(slots=True)
class DiskQuota:
    """What one trial may write, and where its writes are measured."""

    limit_bytes: int
    disk: TrialDisk | None
    walked: list[Path] = field(default_factory=list)
    """Writable host folders measured by walking (bound folders; the uppers without a disk)."""

    @classmethod
    def open(
        cls, root: Path, limit_mb: int, bound: list[Path], logger: logging.Logger
    ) -> DiskQuota:
        """The quota of the trial whose folder is ``root``: its disk made and mounted
        (``writable_root``), ``bound`` (the writable bound folders) measured by walking."""
        sweep_stale(root.parent, logger)
        limit = limit_mb << 20
        disk = TrialDisk.create(root, limit, logger)
        walked = list(bound) if disk is not None else [*bound, root / "upper", root / "work"]
        return cls(limit, disk, walked)

    def writable_root(self, root: Path) -> Path:
        """Where the overlays' upper and work folders go: the disk, else ``root``."""
        return self.disk.mount_point if self.disk is not None else root

    def usage(self) -> tuple[int, bool]:
        """Bytes the trial holds now, and whether its file system is full."""
        used, full = 0, False
        if self.disk is not None:
            st = os.statvfs(self.disk.mount_point)
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            full = st.f_bavail * st.f_frsize < FULL_SLACK_BYTES
        return used + sum(folder_bytes(p) for p in self.walked), full

    def check(self) -> str | None:
        """Why the trial is past its quota (a message naming it), or None."""
        used, full = self.usage()
        if not full and used <= self.limit_bytes:
            return None
        mb, now = self.limit_bytes >> 20, used >> 20
        state = "its file system is full" if full else f"{now} MB written"
        return (
            f"the trial wrote past its disk quota of {mb} MB ({state}; files and log "
            "folders count, writes past the quota are refused). The quota is "
            "the smaller of the runner's TRIALBUS_SANDBOX_DISK_MB and the task's "
            "[environment] storage_mb"
        )


def folder_bytes(root: Path, max_entries: int = MAX_WALK_ENTRIES) -> int:
    """Bytes allocated under ``root`` (links not followed), visiting at most ``max_entries``."""
    total, seen, stack = 0, 0, [root]
    while stack and seen < max_entries:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue  # removed or unreadable meanwhile
        with entries:
            for entry in entries:
                seen += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
    return total


class QuotaGuard:
    """Checks a trial's ``DiskQuota`` after each command and every ``interval_s`` while
    one runs; past it, calls ``on_exceeded`` (which ends the trial) once and raises."""

    def __init__(
        self,
        quota: DiskQuota,
        on_exceeded: Callable[[], Awaitable[None]],
        logger: logging.Logger,
        interval_s: float = 2.0,
    ) -> None:
        self.quota = quota
        self.reason: str | None = None
        self._on_exceeded = on_exceeded
        self._logger = logger
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def error(self) -> DiskQuotaExceededError | None:
        """The error every later command of an exceeded trial raises."""
        return DiskQuotaExceededError(self.reason) if self.reason else None

    def start(self) -> None:
        """Measure in the background from now until ``close``."""
        self._task = asyncio.create_task(self._watch())

    async def check(self) -> None:
        """Measure now; raise DiskQuotaExceededError (and end the trial) when past it."""
        if self.reason is None:
            reason = await asyncio.to_thread(self.quota.check)
            if reason is not None and self.reason is None:
                self.reason = reason
                self._logger.warning("local environment: %s; ending the trial", reason)
                await self._on_exceeded()
        if (error := self.error()) is not None:
            raise error

    async def _watch(self) -> None:
        while self.reason is None:
            await asyncio.sleep(self._interval_s)
            with contextlib.suppress(DiskQuotaExceededError):
                await self.check()

    async def close(self, *, keep_image: bool = False) -> None:
        """Stop measuring; unmount and delete the trial's disk (kept with its image)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.quota.disk is not None:
            await asyncio.to_thread(self.quota.disk.release, keep_image=keep_image)
