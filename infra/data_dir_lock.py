"""One stack per data folder: a lock its process holds while the stack runs.

Two stacks on one data folder would run two nats-servers on one JetStream store and
two ledgers on one database (the second ledger fails, after the second nats-server
has started on the first one's files), and a demo empties its folder first. The lock
is ``flock`` on ``<data>/stack.lock``: the kernel lets it go when the process ends,
however it ends, so a killed stack leaves nothing stale behind. The file holds the
holder's pid, for the message that names it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

LOCK_NAME = "stack.lock"


class DataDirInUse(RuntimeError):
    """Another live process runs a stack on this data folder."""


@dataclass
class DataDirLock:
    """The lock on ``data_dir`` (created when missing)."""

    data_dir: Path
    _fd: int | None = field(default=None, init=False)

    @property
    def path(self) -> Path:
        return self.data_dir / LOCK_NAME

    def acquire(self) -> None:
        """Take the lock, or raise DataDirInUse naming the process that holds it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUse(
                f"{self.data_dir} is in use by another trialbus stack (pid {holder}): "
                f"stop it first (Ctrl-C in its shell, or kill -INT {holder}), "
                "or give this one another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def empty(self) -> None:
        """Remove everything in the folder but the lock (held: nobody else uses it)."""
        assert self._fd is not None, "empty() needs the lock"
        for entry in self.data_dir.iterdir():
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def release(self) -> None:
        """Let the lock go (the file stays: removing it would race a new holder)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
