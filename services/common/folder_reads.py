"""Reads of files inside a folder that someone else filled (Harbor trial and job folders).

A trial's ``verifier/`` and ``agent/`` folders are written from inside its sandbox or
container, so any file there may be a link to a host file, a FIFO, a device, or
endless. ``read_inside`` therefore

- walks from the folder one component at a time with directory fds (``openat``), each
  opened with ``O_NOFOLLOW``: neither the file nor any folder on the way may be a
  symbolic link, so no path can leave the folder (``..`` is refused outright);
- opens the file with ``O_NONBLOCK`` (a FIFO swapped in after the look does not wait
  for a writer) and ``O_CLOEXEC``, and checks what it opened (``fstat``): only a
  regular file is read; a FIFO, socket or device is refused;
- reads at most ``limit + 1`` bytes, so a file that grows while read is still bounded.

Every refusal is a value (``Unread``, naming why), never an exception: readers turn it
into their own diagnostic and carry on with the next file.

The folder itself (``root``) is opened following links: its path comes from the
reader's configuration or from the runner, not from the files inside it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MAX_FILE_BYTES: Final = 16 * 1024 * 1024
"""The default bound of one read: larger files are refused unread."""

_MIB: Final = 1024 * 1024
_CHUNK: Final = 1024 * 1024
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


@dataclass(frozen=True, slots=True)
class Unread:
    """Why a file was not read: ``reason`` completes "<file>: ..." in a diagnostic.

    ``missing``: the file (or a folder on its way) does not exist; readers usually
    treat that as "no such file" rather than as a problem.
    """

    reason: str
    missing: bool = False


_MISSING: Final = Unread("missing", missing=True)


def limit_text(limit: int) -> str:
    """A byte bound as a diagnostic shows it: ``16 MiB``, ``4096-byte``."""
    return f"{limit // _MIB} MiB" if limit % _MIB == 0 else f"{limit}-byte"


def read_inside(root: Path, relative: str, limit: int = MAX_FILE_BYTES) -> bytes | Unread:
    """The bytes of ``root/relative``, or why they were not read (see the module doc).

    ``relative`` is a "/"-separated path chosen by the caller's code (``result.json``,
    ``verifier/reward.txt``); it may not contain ``..``, ``.`` or empty components.
    """
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{relative!r}: a plain relative path is required")
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return _MISSING
    except OSError as exc:
        return Unread(f"unreadable: {exc.strerror or exc}")
    except ValueError as exc:
        # A path the OS cannot name (a NUL byte, from an event's trial_dir): refused
        # by the system call before any file is looked for.
        return Unread(f"unreadable: invalid path ({exc})")
    try:
        for depth, part in enumerate(parts[:-1], start=1):
            try:
                child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                return _refused_folder(fd, part, "/".join(parts[:depth]), exc)
            os.close(fd)
            fd = child
        return _read_file(fd, parts[-1], limit)
    finally:
        os.close(fd)


def _refused_folder(parent: int, name: str, shown: str, exc: OSError) -> Unread:
    """Why the folder ``name`` on the way could not be entered."""
    if exc.errno == errno.ENOENT:
        return _MISSING
    if exc.errno in (errno.ENOTDIR, errno.ELOOP):
        try:
            mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return _MISSING
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            return Unread(f"{shown}/ is a symbolic link; not followed")
        return Unread(f"unreadable: {shown} is not a folder")
    return Unread(f"unreadable: {exc.strerror or exc}")


def _kind(mode: int) -> str | None:
    """What a non-regular file is, for a diagnostic; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"  # character or block: nothing else is left once links and folders are out


def _read_file(parent: int, name: str, limit: int) -> bytes | Unread:
    # Look first (without following): a device is then never even opened, unless it
    # is swapped in between the look and the open, which fstat below catches.
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return _MISSING
    except OSError as exc:
        return Unread(f"unreadable: {exc.strerror or exc}")
    refused = _refused_mode(mode)
    if refused is not None:
        return refused
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return _MISSING
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a link after the look
            return Unread("a symbolic link; not followed")
        return Unread(f"unreadable: {exc.strerror or exc}")
    try:
        st = os.fstat(fd)  # what was opened, not what was looked at
        refused = _refused_mode(st.st_mode)
        if refused is not None:
            return refused
        if st.st_size > limit:
            return _too_large(st.st_size, limit)
        chunks: list[bytes] = []
        total = 0
        # One byte past the bound at most: the file may grow after fstat.
        while total <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            return _too_large(max(st.st_size, total), limit)
        return b"".join(chunks)
    except OSError as exc:
        return Unread(f"unreadable: {exc.strerror or exc}")
    finally:
        os.close(fd)


def _refused_mode(mode: int) -> Unread | None:
    if stat.S_ISLNK(mode):
        return Unread("a symbolic link; not followed")
    if stat.S_ISDIR(mode):
        return Unread(f"unreadable: {os.strerror(errno.EISDIR)}")
    kind = _kind(mode)
    if kind is not None:
        return Unread(f"not a regular file ({kind}); not read")
    return None


def _too_large(size: int, limit: int) -> Unread:
    return Unread(f"{size} bytes exceeds the {limit_text(limit)} limit; not read")
