"""The runner's cache of task folders, keyed by content checksum, filled from the store.

Task archives live in the tasks bucket under their checksum (``task_object_name``); the
submitter uploads what is missing (``upload_task``). A runner asks ``TaskCache`` for a
task; the first request downloads the archive, verifies it (the store checks sha256,
unpacking checks ``task_checksum``) and unpacks it to ``<root>/<checksum>/<name>/``:
one copy shared by every trial of the task, under the task's own folder name because
Harbor takes a task's name from it.

Concurrency: in one process, callers of the same checksum wait on one asyncio lock, so
the archive is downloaded once; across processes sharing ``root``, an exclusive
``flock`` on ``.locks/<checksum>.dl`` does the same. Unpacking is atomic (a temporary
folder renamed into place), so a folder that exists is complete.

Eviction: after each download the least recently used entries (entry folder mtime,
touched on every use) go until the cache fits ``budget_bytes``. An entry in use is
never evicted: ``use()`` holds a shared ``flock`` on ``.locks/<checksum>.use`` for as
long as a trial runs, and the evictor takes that lock (and the download lock) without
waiting, skipping the entry when it cannot. ``ensure()`` alone does not pin: its path
stays until evicted. The budget is soft: entries in use, and the task just fetched,
are kept even when the cache is over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from schemas.objects import ObjectRef
from services.common.archive import (
    TASK_LIMITS,
    ArchiveError,
    ArchiveLimits,
    pack_task,
    unpack_task,
)
from services.common.errors import InternalError, ObjectMissing
from services.common.logging import get_logger
from services.common.ports import ObjectStore
from services.common.task_identity import task_checksum

log = get_logger(__name__)

_CHECKSUM = re.compile(r"^[0-9a-f]{64}$")


def task_object_name(checksum: str) -> str:
    """The object name of a task's archive in the tasks bucket: its checksum."""
    return checksum


async def upload_task(
    store: ObjectStore, folder: Path, limits: ArchiveLimits = TASK_LIMITS
) -> ObjectRef:
    """Store a task folder's archive unless the bucket already has it; its reference.

    The reference's name is the task's checksum. Packing refuses what runners would
    refuse to unpack (ArchiveError, naming the entry).
    """
    checksum = await asyncio.to_thread(task_checksum, folder)
    existing = await store.info(task_object_name(checksum))
    if existing is not None:
        return existing
    data = await asyncio.to_thread(pack_task, folder, limits)
    return await store.put(task_object_name(checksum), data)


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One cached task: its checksum, bytes on disk and last use (epoch seconds)."""

    checksum: str
    size: int
    last_used: float


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name or len(name) > 255:
        raise ArchiveError(f"task name {name!r} cannot be a folder name")


def _size(folder: Path) -> int:
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for n in dirnames + filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, n)).st_size
    return total


@dataclass(eq=False)
class TaskCache:
    """Task folders by checksum under ``root``, fetched from ``store``, LRU within a budget."""

    root: Path
    store: ObjectStore
    _: KW_ONLY
    budget_bytes: int
    limits: ArchiveLimits = TASK_LIMITS
    """The bounds a downloaded task archive is unpacked within."""
    clock: Callable[[], float] = time.time
    on_lock_wait: Callable[[str], None] | None = None
    """Called with the checksum when a wait for an entry's lock begins."""
    poll_s: float = 0.05
    """How often a lock held by another process is tried again."""
    _locks: dict[str, asyncio.Lock] = field(init=False, default_factory=dict)
    _pinned: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        (self.root / ".locks").mkdir(parents=True, exist_ok=True)
        (self.root / ".trash").mkdir(exist_ok=True)
        # Entries a crashed process renamed away but did not finish deleting.
        for leftover in (self.root / ".trash").iterdir():
            shutil.rmtree(leftover, ignore_errors=True)

    # -- fetching ------------------------------------------------------------------------

    async def ensure(self, ref_or_checksum: ObjectRef | str, name: str) -> Path:
        """The task's folder, downloading and unpacking it on first use.

        Raises ObjectMissing when the bucket has no such archive, ObjectCorrupt when
        its bytes do not match, ArchiveError when it is unsafe or not the task named.
        """
        checksum, ref = self._parse(ref_or_checksum)
        _check_name(name)
        path = self.root / checksum / name
        downloaded = False
        async with self._locks.setdefault(checksum, asyncio.Lock()):
            if not path.is_dir():
                async with self._flock(checksum, "dl", exclusive=True):
                    if not path.is_dir():  # another process may have finished meanwhile
                        await self._download(checksum, ref, name, path)
                        downloaded = True
            self._touch(checksum)
        if downloaded:
            await self.evict(keep={checksum})
        return path

    @contextlib.asynccontextmanager
    async def use(self, ref_or_checksum: ObjectRef | str, name: str) -> AsyncIterator[Path]:
        """``ensure`` the task and keep it from eviction (in any process) until exit."""
        checksum, _ = self._parse(ref_or_checksum)
        while True:
            path = await self.ensure(ref_or_checksum, name)
            async with self._flock(checksum, "use", exclusive=False):
                # Evicted between ensure and the lock: fetch again.
                if not path.is_dir():
                    continue
                self._pinned[checksum] = self._pinned.get(checksum, 0) + 1
                try:
                    yield path
                finally:
                    self._pinned[checksum] -= 1
                    if not self._pinned[checksum]:
                        del self._pinned[checksum]
                    self._touch(checksum)
                return

    def _parse(self, ref_or_checksum: ObjectRef | str) -> tuple[str, ObjectRef | None]:
        if isinstance(ref_or_checksum, ObjectRef):
            checksum, ref = ref_or_checksum.name, ref_or_checksum
        else:
            checksum, ref = ref_or_checksum, None
        if not _CHECKSUM.match(checksum):
            raise InternalError(f"{checksum!r} is not a task checksum (64 lowercase hex digits)")
        return checksum, ref

    async def _download(self, checksum: str, ref: ObjectRef | None, name: str, path: Path) -> None:
        entry = self.root / checksum
        # Leftovers of an unpack a crash interrupted; no one else unpacks here now.
        for stale in entry.glob(".*.partial") if entry.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)
        if ref is None:
            ref = await self.store.info(task_object_name(checksum))
            if ref is None:
                raise ObjectMissing(
                    f"task {name} ({checksum[:12]}): no archive in bucket {self.store.bucket}; "
                    "was it submitted through this NATS server (or expired)?"
                )
        started = time.monotonic()
        try:
            data = await self.store.get(ref)
            await asyncio.to_thread(unpack_task, data, path, checksum, self.limits)
        except BaseException:
            with contextlib.suppress(OSError):
                entry.rmdir()  # only when empty: other names of the task stay
            raise
        log.info(
            "task fetched",
            task=name,
            checksum=checksum,
            bytes=len(data),
            seconds=round(time.monotonic() - started, 3),
        )

    def _touch(self, checksum: str) -> None:
        now = self.clock()
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.root / checksum, (now, now))

    # -- locks ---------------------------------------------------------------------------

    def _lock_fd(self, checksum: str, kind: str) -> int:
        return os.open(self.root / ".locks" / f"{checksum}.{kind}", os.O_RDWR | os.O_CREAT, 0o644)

    @contextlib.asynccontextmanager
    async def _flock(self, checksum: str, kind: str, *, exclusive: bool) -> AsyncIterator[None]:
        # Polled rather than blocking in a thread: a cancelled waiter must not go on to
        # take (and keep) the lock after its task is gone.
        fd = self._lock_fd(checksum, kind)
        try:
            op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
            waited = False
            while True:
                try:
                    fcntl.flock(fd, op)
                    break
                except BlockingIOError:
                    if not waited:
                        waited = True
                        log.info("waiting for task lock", checksum=checksum, lock=kind)
                        if self.on_lock_wait is not None:
                            self.on_lock_wait(checksum)
                    await asyncio.sleep(self.poll_s)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _try_exclusive(self, checksum: str, kind: str) -> int | None:
        fd = self._lock_fd(checksum, kind)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    # -- eviction ------------------------------------------------------------------------

    def entries(self) -> list[CacheEntry]:
        """The cached tasks, least recently used first."""
        found = []
        for child in self.root.iterdir():
            if _CHECKSUM.match(child.name):
                with contextlib.suppress(FileNotFoundError):
                    used = child.stat().st_mtime
                    found.append(CacheEntry(child.name, _size(child), used))
        return sorted(found, key=lambda e: (e.last_used, e.checksum))

    async def evict(self, keep: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Remove least recently used entries not in use until within the budget.

        Returns the evicted checksums, oldest first.
        """
        entries = await asyncio.to_thread(self.entries)
        total = sum(e.size for e in entries)
        evicted: list[str] = []
        for entry in entries:
            if total <= self.budget_bytes:
                break
            if entry.checksum in keep or entry.checksum in self._pinned:
                continue
            if not await asyncio.to_thread(self._remove, entry.checksum):
                continue
            total -= entry.size
            evicted.append(entry.checksum)
        if evicted or total > self.budget_bytes:
            log.info(
                "task cache evicted",
                evicted=evicted,
                bytes=total,
                budget=self.budget_bytes,
                over_budget=total > self.budget_bytes,
            )
        return evicted

    def _remove(self, checksum: str) -> bool:
        """Remove an entry unless some process downloads or uses it (never waits)."""
        dl = self._try_exclusive(checksum, "dl")
        if dl is None:
            return False
        try:
            use = self._try_exclusive(checksum, "use")
            if use is None:
                return False
            try:
                # Renamed away under the locks, deleted after: a reader never sees a
                # half-deleted task folder.
                trash = self.root / ".trash" / f"{checksum}.{secrets.token_hex(4)}"
                try:
                    os.rename(self.root / checksum, trash)
                except FileNotFoundError:
                    return False
            finally:
                os.close(use)
        finally:
            os.close(dl)
        shutil.rmtree(trash, ignore_errors=True)
        return True
