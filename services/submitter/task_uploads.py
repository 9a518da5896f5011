"""``POST /tasks``: a task folder uploaded as an archive, for CI with no checkout next to
the API. Unpacking is a trust boundary (services.common.unpack): no absolute names, no
``..``, no links leaving the task, no devices or FIFOs, bounded size, file count and
compression ratio; each refusal is an ArchiveError naming the entry (a 422).

What is stored is not the bytes sent but the task re-packed deterministically
(services.common.archive.pack_task) under its content checksum, exactly as a
submission from a checkout stores it, so the same folder uploaded or submitted from
disk is one task. A manifest then names it by ``{name, checksum}``.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path

from schemas.events import TaskRef
from schemas.trial_events import TASK_NAME_PATTERN
from services.common.errors import ManifestError
from services.common.ports import ObjectStore
from services.common.task_cache import upload_task
from services.common.unpack import TASK_LIMITS, unpack
from services.submitter.resolve import check_task_dir

_NAME_RE = re.compile(TASK_NAME_PATTERN)


async def accept_task_upload(data: bytes, name: str, store: ObjectStore) -> TaskRef:
    """Unpack ``data`` safely as task ``name``, check it is a Harbor task, store it.

    Raises ManifestError (bad name, not a task) or ArchiveError (an unsafe entry), both
    UserInputErrors naming what to fix.
    """
    if not _NAME_RE.match(name):
        raise ManifestError(
            f"name {name!r} must match {TASK_NAME_PATTERN}: it becomes the task's folder "
            "name on every runner"
        )
    with tempfile.TemporaryDirectory(prefix="trialbus-upload-") as tmp:
        folder = Path(tmp) / name
        what = f"task archive {name!r}"
        await asyncio.to_thread(unpack, data, folder, TASK_LIMITS, what=what)
        await asyncio.to_thread(check_task_dir, folder, what)
        stored = await upload_task(store, folder)
    return TaskRef(name=name, checksum=stored.name)
