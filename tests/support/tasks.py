"""Tasks as runners get them: archived in a tasks bucket, fetched through a TaskCache.

For tests that drive an executor directly (no submitter): ``stored_task`` uploads a
task folder into an in-memory tasks bucket and returns its TaskRef (name + checksum,
what a TrialRequested carries) and a TaskCache over that bucket.
"""

from __future__ import annotations

from pathlib import Path

from schemas.events import TaskRef
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.task_cache import TaskCache, upload_task


async def stored_task(folder: Path, cache_root: Path) -> tuple[TaskRef, TaskCache]:
    """Store ``folder`` as the tasks bucket would hold it; its ref and a runner's cache."""
    store = InMemoryObjectStore("TASKS")
    ref = await upload_task(store, folder)
    cache = TaskCache(cache_root, store, budget_bytes=1 << 30)
    return TaskRef(name=folder.name, checksum=ref.name), cache
