"""The runner's task cache (services.common.task_cache) against the in-memory store.

Two TaskCache objects over one root stand for two runner processes: their asyncio locks
are separate, so only the file locks (flock, per open file) coordinate them, exactly as
between processes. Waits are on events (the store's gate, the lock-wait hook), never
on sleeps; each invariant has a negative control showing the test can fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.objects import ObjectRef
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.archive import ArchiveError, pack_task
from services.common.errors import InternalError, ObjectCorrupt, ObjectMissing
from services.common.task_cache import TaskCache, task_object_name, upload_task
from services.common.task_identity import task_checksum
from tests.harbor_fixtures import EXAMPLE_TASKS

NAMES = ["hello-file", "count-words", "multi-metric"]


class GatedStore(InMemoryObjectStore):
    """Gets wait for ``gate`` (when closed); ``entered`` fires on each get."""

    def __init__(self) -> None:
        super().__init__("TASKS")
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()
        self.started = 0

    async def get(self, ref: ObjectRef) -> bytes:
        self.started += 1
        self.entered.set()
        await self.gate.wait()
        return await super().get(ref)


@pytest.fixture
async def store() -> GatedStore:
    return GatedStore()


@pytest.fixture
async def refs(store: GatedStore) -> dict[str, ObjectRef]:
    return {name: await upload_task(store, EXAMPLE_TASKS / name) for name in NAMES}


def cache(
    root: Path,
    store: GatedStore,
    budget: int = 10**9,
    clock: itertools.count[int] | None = None,
    **kwargs: object,
) -> TaskCache:
    """A TaskCache whose clock ticks once per reading (shared when ``clock`` is given)."""
    ticks = clock or itertools.count(1_000_000)
    return TaskCache(root, store, budget_bytes=budget, clock=lambda: float(next(ticks)), **kwargs)  # type: ignore[arg-type]


async def test_first_use_downloads_verifies_and_unpacks(
    tmp_path: Path, store: GatedStore, refs: dict[str, ObjectRef]
) -> None:
    c = cache(tmp_path / "c", store)
    ref = refs["hello-file"]
    path = await c.ensure(ref, "hello-file")
    assert path == tmp_path / "c" / ref.name / "hello-file"
    assert task_checksum(path) == task_checksum(EXAMPLE_TASKS / "hello-file") == ref.name
    assert await c.ensure(ref.name, "hello-file") == path  # by checksum alone
    assert store.gets == 1
    # Same task under another folder name: unpacked beside it, from the same object.
    assert (await c.ensure(ref, "alias")).name == "alias"
    assert store.gets == 2


async def test_upload_is_skipped_when_present(
    store: GatedStore, refs: dict[str, ObjectRef]
) -> None:
    puts = store.puts
    assert await upload_task(store, EXAMPLE_TASKS / "hello-file") == refs["hello-file"]
    assert store.puts == puts
    assert refs["hello-file"].name == task_object_name(task_checksum(EXAMPLE_TASKS / "hello-file"))


async def test_concurrent_callers_in_one_process_download_once(
    tmp_path: Path, store: GatedStore, refs: dict[str, ObjectRef]
) -> None:
    c = cache(tmp_path / "c", store)
    store.gate.clear()
    calls = [asyncio.create_task(c.ensure(refs["hello-file"], "hello-file")) for _ in range(5)]
    await store.entered.wait()
    store.gate.set()
    paths = await asyncio.gather(*calls)
    assert len(set(paths)) == 1 and store.gets == store.started == 1


@contextlib.asynccontextmanager
async def no_lock(
    self: TaskCache, checksum: str, kind: str, *, exclusive: bool
) -> AsyncIterator[None]:
    yield


@pytest.mark.parametrize("file_lock", [True, False], ids=["flock", "negative-control-no-flock"])
async def test_two_processes_download_once(
    tmp_path: Path,
    store: GatedStore,
    refs: dict[str, ObjectRef],
    file_lock: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not file_lock:
        monkeypatch.setattr(TaskCache, "_flock", no_lock)
    waiting = asyncio.Event()
    a = cache(tmp_path / "c", store)
    b = cache(tmp_path / "c", store, on_lock_wait=lambda checksum: waiting.set())
    store.gate.clear()
    ref = refs["count-words"]
    first = asyncio.create_task(a.ensure(ref, "count-words"))
    await store.entered.wait()  # a holds the download lock and is fetching
    store.entered.clear()
    second = asyncio.create_task(b.ensure(ref, "count-words"))
    # b either waits for a's file lock, or (without it) starts its own download.
    await asyncio.wait(
        [asyncio.create_task(waiting.wait()), asyncio.create_task(store.entered.wait())],
        return_when=asyncio.FIRST_COMPLETED,
    )
    store.gate.set()
    results = await asyncio.gather(first, second, return_exceptions=True)
    if file_lock:
        assert waiting.is_set() and store.started == 1
        assert results[0] == results[1] == tmp_path / "c" / ref.name / "count-words"
    else:
        assert store.started == 2  # the test detects a second download


async def sizes(tmp_path: Path, store: GatedStore, refs: dict[str, ObjectRef]) -> dict[str, int]:
    scratch = cache(tmp_path / "scratch", store)
    for name in NAMES:
        await scratch.ensure(refs[name], name)
    by_checksum = {e.checksum: e.size for e in scratch.entries()}
    return {name: by_checksum[refs[name].name] for name in NAMES}


@pytest.mark.parametrize("reuse_first", [True, False])
async def test_least_recently_used_is_evicted(
    tmp_path: Path, store: GatedStore, refs: dict[str, ObjectRef], reuse_first: bool
) -> None:
    size = await sizes(tmp_path, store, refs)
    budget = sum(size.values()) - min(size.values())  # any two fit, three do not
    c = cache(tmp_path / "c", store, budget)
    hello, count, multi = (refs[n] for n in NAMES)
    await c.ensure(hello, "hello-file")
    await c.ensure(count, "count-words")
    if reuse_first:
        await c.ensure(hello, "hello-file")
    await c.ensure(multi, "multi-metric")
    left = {e.checksum for e in c.entries()}
    victim = count if reuse_first else hello  # the control: without reuse, hello goes
    assert left == {hello.name, count.name, multi.name} - {victim.name}
    assert sum(e.size for e in c.entries()) <= budget


async def test_an_entry_in_use_is_never_evicted(
    tmp_path: Path, store: GatedStore, refs: dict[str, ObjectRef]
) -> None:
    size = await sizes(tmp_path, store, refs)
    clock = itertools.count(1_000_000)  # one clock for both "processes"
    c = cache(tmp_path / "c", store, sum(size.values()) - min(size.values()), clock)
    other_process = cache(tmp_path / "c", store, clock=clock)
    hello, count, multi = (refs[n] for n in NAMES)
    async with c.use(hello, "hello-file") as path:
        async with other_process.use(count, "count-words"):
            await c.ensure(multi, "multi-metric")
            # Over budget, yet the tasks in use (here and in the "other process") stay,
            # and so does the one just fetched.
            assert {e.checksum for e in c.entries()} == {hello.name, count.name, multi.name}
            assert await c.evict() == [multi.name]  # hello is older, but in use
        assert (path / "task.toml").is_file()
    # The control: once released, the oldest entries are evictable.
    assert await cache(tmp_path / "c", store, 0, clock).evict() == [count.name, hello.name]


async def test_use_refetches_an_entry_evicted_before_it_was_pinned(
    tmp_path: Path, store: GatedStore, refs: dict[str, ObjectRef]
) -> None:
    c = cache(tmp_path / "c", store, budget=0)
    ref = refs["hello-file"]
    await c.ensure(ref, "hello-file")
    assert await c.evict() == [ref.name]
    async with c.use(ref, "hello-file") as path:
        assert (path / "instruction.md").is_file()
    assert store.gets == 2


async def test_failures_leave_no_entry(
    tmp_path: Path, store: GatedStore, refs: dict[str, ObjectRef]
) -> None:
    c = cache(tmp_path / "c", store)
    with pytest.raises(ObjectMissing, match="no archive"):
        await c.ensure("a" * 64, "ghost")
    # An archive stored under another task's checksum: unpacked, checked, refused.
    wrong = task_checksum(EXAMPLE_TASKS / "broken-verifier")
    await store.put(wrong, pack_task(EXAMPLE_TASKS / "hello-file"))
    with pytest.raises(ArchiveError, match="not the task it claims"):
        await c.ensure(wrong, "broken-verifier")
    store.tamper(refs["multi-metric"].name)
    with pytest.raises(ObjectCorrupt):
        await c.ensure(refs["multi-metric"], "multi-metric")
    assert c.entries() == []
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "c").rglob("*"))
    with pytest.raises(ArchiveError, match="folder name"):
        await c.ensure(refs["hello-file"], "../escape")
    with pytest.raises(InternalError):
        await c.ensure("not-a-checksum", "x")


async def test_a_crashed_unpack_is_cleaned_up(
    tmp_path: Path, store: GatedStore, refs: dict[str, ObjectRef]
) -> None:
    ref = refs["hello-file"]
    stale = tmp_path / "c" / ref.name / ".hello-file.abc.partial"
    shutil.copytree(EXAMPLE_TASKS / "hello-file", stale)
    c = cache(tmp_path / "c", store)
    await c.ensure(ref, "hello-file")
    assert not stale.exists()
