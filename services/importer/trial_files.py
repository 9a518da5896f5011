"""The files of one trial as the record builder sees them: on disk, or as just unpacked.

The record is built by one path (services.importer.records) from a ``TrialFiles``:

- ``FolderFiles``: a trial folder on disk (``trialbus import`` of a Harbor job folder),
  read with services.common.folder_reads (no link followed, bounded, never a FIFO);
- ``ArchiveFiles``: a trial archive the importer has just unpacked into its job folder
  (``Unpacked``): the bytes of the few files the record reads were kept while
  unpacking (``RECORD_FILES``), so they are not read back from the disk.

Both answer every question exactly alike for what a trial archive can hold (files and
folders: unpacking refuses links and special files), down to each diagnostic's text;
``tests/unit/test_record_sources.py`` holds them to it on the bad-input corpus.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Protocol

from services.common.archive import TRIAL_MANIFEST
from services.common.folder_reads import MAX_FILE_BYTES, Unread, limit_text, read_inside
from services.common.unpack import Unpacked

MAX_MANIFEST_BYTES: Final = 1024 * 1024
"""The bound on reading TRIAL_MANIFEST (what the runner left out of the archive)."""

RECORD_FILES: Final[Mapping[str, int]] = {
    "result.json": MAX_FILE_BYTES,
    "config.json": MAX_FILE_BYTES,
    "verifier/reward.json": MAX_FILE_BYTES,
    "verifier/reward.txt": MAX_FILE_BYTES,
    TRIAL_MANIFEST: MAX_MANIFEST_BYTES,
}
"""Every file the record builder reads, with the largest size it reads: the bytes
unpacking keeps for ``ArchiveFiles``."""


class TrialFiles(Protocol):
    """A trial folder's files, for building its record (see the module docstring)."""

    @property
    def path(self) -> Path:
        """Where the folder is (the record names it)."""
        ...

    def read(self, relative: str, limit: int) -> bytes | Unread:
        """The bytes of ``relative`` ("verifier/reward.txt"), or why they were not read."""
        ...

    def lexists(self, relative: str) -> bool:
        """Whether anything (a link too) has that name."""
        ...

    def is_file(self, relative: str) -> bool:
        """Whether ``relative`` is a regular file."""
        ...

    def is_dir(self, relative: str) -> bool:
        """Whether ``relative`` is a folder."""
        ...


class FolderFiles:
    """A trial folder on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, relative: str, limit: int) -> bytes | Unread:
        """``read_inside``: bounded, no link followed, no FIFO or device opened."""
        return read_inside(self.path, relative, limit)

    def lexists(self, relative: str) -> bool:
        """``os.path.lexists``."""
        return os.path.lexists(self.path / relative)

    def is_file(self, relative: str) -> bool:
        """``Path.is_file``."""
        return (self.path / relative).is_file()

    def is_dir(self, relative: str) -> bool:
        """``Path.is_dir``."""
        return (self.path / relative).is_dir()


_MISSING: Final = Unread("missing", missing=True)


class ArchiveFiles:
    """A trial archive just unpacked at ``unpacked.path``, answered from what unpacking saw."""

    def __init__(self, unpacked: Unpacked) -> None:
        self.path = unpacked.path
        self._seen = unpacked

    def read(self, relative: str, limit: int) -> bytes | Unread:
        """What ``read_inside`` would return for the unpacked folder, without reading it.

        Raises LookupError for a file whose bytes unpacking was not asked to keep (a
        bug: RECORD_FILES must name every file the record reads).
        """
        parts = relative.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"{relative!r}: a plain relative path is required")
        kinds = self._seen.kinds
        for depth in range(1, len(parts)):
            shown = "/".join(parts[:depth])
            kind = kinds.get(shown)
            if kind is None:
                return _MISSING
            if kind == "link":
                return Unread(f"{shown}/ is a symbolic link; not followed")
            if kind != "dir":
                return Unread(f"unreadable: {shown} is not a folder")
        kind = kinds.get(relative)
        if kind is None:
            return _MISSING
        if kind == "link":
            return Unread("a symbolic link; not followed")
        if kind == "dir":
            return Unread(f"unreadable: {os.strerror(errno.EISDIR)}")
        size = self._seen.sizes[relative]
        if size > limit:
            return Unread(f"{size} bytes exceeds the {limit_text(limit)} limit; not read")
        data = self._seen.kept.get(relative)
        if data is None:
            raise LookupError(
                f"{relative}: its bytes were not kept while unpacking; add it to RECORD_FILES"
            )
        return data

    def lexists(self, relative: str) -> bool:
        """Whether the archive had an entry (or a folder implied) of that name."""
        return relative in self._seen.kinds

    def is_file(self, relative: str) -> bool:
        """Whether the archive had a regular file of that name (it holds no links)."""
        return self._seen.kinds.get(relative) == "file"

    def is_dir(self, relative: str) -> bool:
        """Whether the archive had a folder of that name (or one implied by a path)."""
        return self._seen.kinds.get(relative) == "dir"


def trial_files(trial: Path | TrialFiles) -> TrialFiles:
    """``trial`` as TrialFiles: a path is a folder on disk."""
    return FolderFiles(trial) if isinstance(trial, Path) else trial
