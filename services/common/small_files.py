"""Reading a small file an operator or user names: a manifest, a runner policy.

One way to do it for every such file: open without blocking (a FIFO put where a file
is expected is refused at once instead of waiting for a writer), check that what was
opened is a regular file, and read at most one byte over the limit, so that a huge
file is refused without being read whole. Each caller words the error for its own
file; the exceptions below say which rule was broken.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotRegularFile(OSError):
    """What the path names is a folder, FIFO, socket or device, not a regular file."""


class FileTooLarge(OSError):
    """The file holds more bytes than the caller's limit."""


def read_small_file(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes.

    Raises NotRegularFile, FileTooLarge, or the OSError of the open or read
    (FileNotFoundError, PermissionError, ...).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        # Checked on what was opened (not the path), before fdopen: it would refuse a
        # folder itself, with a message naming the fd rather than the file.
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise FileTooLarge(errno.EFBIG, f"larger than {limit} bytes", str(path))
    return raw
