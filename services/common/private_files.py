"""Files only their owner may read: API token tables, NATS credentials.

``write_private`` replaces a file atomically and never lets it exist with wider
permissions, even for an instant: the temporary file is created 0600 with
``O_EXCL`` (a file or link planted under that name is refused, not followed), synced,
then renamed over the target. A reader sees the old content or the new, never half.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, created with mode 0600 (never wider)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        # The temporary file must not be left behind, whatever interrupted the write.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
