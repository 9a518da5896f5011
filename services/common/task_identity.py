"""A task's identity: the checksum that names it in events, the tasks bucket and caches.

sha256 over the task folder's relative file paths and contents, so the same folder on
any machine gives the same name; the submitter records it in provenance, runners check
an unpacked archive against it, and the local environment keys its layer cache on it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from services.common.errors import ManifestError

_MAX_TASK_FILES = 20_000


def task_checksum(task_dir: Path) -> str:
    """sha256 over the task folder's relative file paths and contents."""
    h = hashlib.sha256()
    files = sorted(p for p in task_dir.rglob("*") if p.is_file())
    if len(files) > _MAX_TASK_FILES:
        raise ManifestError(
            f"{task_dir}: more than {_MAX_TASK_FILES} files; is this a task folder?"
        )
    for p in files:
        h.update(p.relative_to(task_dir).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()
