"""The disk quota of a Dockerfile build: its layer is written on a size-limited disk.

A build's writes all land in the overlay upper folders of its new layer (its ``RUN``
steps' files, ``/tmp`` included, ``COPY`` targets); no writable host folder is bound
in. So, as root, the build gets the same loop-mounted ext4 image as a trial
(``disk.TrialDisk``: ``nosuid,nodev``, a hard limit, ENOSPC past it) in its build
folder, and the layer is written there. Only a build that succeeded is copied out
into the layer cache (``cp -a``: owners, modes, links, the overlay's whiteouts and
``user.overlay.*`` attributes kept), so the cache grows by at most the quota per
layer; the disk is then unmounted and its image deleted, whatever the outcome.

The quota is the runner's ``TRIALBUS_SANDBOX_DISK_MB`` (the environment's ``disk_mb``),
not the task's ``storage_mb``: that one bounds what a container writes, not the size
of its image. A build folder of a dead runner is released like a dead trial's disk
(``stale.sweep_stale``, at the next build and at the runner's start). Without root
there is no disk and no quota: the build writes to the cache folder directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from services.localenv.disk import FULL_SLACK_BYTES, TrialDisk
from services.localenv.errors import LocalEnvironmentError
from services.localenv.stale import LOCK_NAME, describe, run_tool, sweep_stale


@dataclass(slots=True)
class BuildDisk:
    """Where a build writes its layer: a size-limited disk, or the build folder itself."""

    dest: Path
    """The build folder (``<cache>/.build-<key>-<id>``); the layer ends up in dest/fs."""
    limit_mb: int | None
    disk: TrialDisk | None

    @classmethod
    def open(cls, dest: Path, limit_mb: int | None, logger: logging.Logger) -> BuildDisk:
        """The build's disk, made and mounted in ``dest`` (none when ``limit_mb`` is None)."""
        if not limit_mb:
            return cls(dest, None, None)
        sweep_stale(dest.parent, logger)  # builds of dead runners in the same cache
        disk = TrialDisk.create(dest, limit_mb << 20, logger)
        return cls(dest, limit_mb if disk is not None else None, disk)

    @property
    def root(self) -> Path:
        """Where the layer's folders (fs/, work/) are written during the build."""
        return self.disk.mount_point if self.disk is not None else self.dest

    def full(self) -> bool:
        """Whether the disk is full: the build's writes are being refused."""
        if self.disk is None:
            return False
        st = os.statvfs(self.disk.mount_point)
        return st.f_bavail * st.f_frsize < FULL_SLACK_BYTES

    def exceeded(self) -> str:
        """The message of a build that wrote past its quota."""
        return (
            f"the environment build wrote past its disk quota of {self.limit_mb} MB (its "
            "file system is full, further writes were refused). The quota of a build is "
            "the runner's TRIALBUS_SANDBOX_DISK_MB (the local environment's disk_mb)"
        )

    def keep(self) -> None:
        """Copy the built layer out of the disk into ``dest/fs`` (nothing without a disk)."""
        if self.disk is None:
            return
        try:
            run_tool("cp", "-a", "--preserve=xattr", str(self.root / "fs"), str(self.dest / "fs"))
        except (OSError, subprocess.CalledProcessError) as exc:
            raise LocalEnvironmentError(
                f"cannot copy the built layer out of its disk into {self.dest}: {describe(exc)}"
            ) from exc

    def release(self) -> None:
        """Unmount the disk, free its loop device and delete its image."""
        if self.disk is not None:
            self.disk.release()
            # The build folder becomes the layer: nothing of the disk stays in it.
            with contextlib.suppress(OSError):
                self.disk.mount_point.rmdir()
            with contextlib.suppress(OSError):
                (self.dest / LOCK_NAME).unlink()
