"""Safe unpacking of .tar.gz archives: a security boundary (the HTTP API accepts uploads).

Every refusal is an ArchiveError (a UserInputError: HTTP 4xx, CLI exit 2) naming the
entry and the rule:

- names: relative, no ``..`` component, each entry once (a leading ``./`` is accepted);
- types: regular files and folders; symbolic links only where allowed (task archives),
  and only when they resolve, on the unpacked tree, to a regular file inside it
  (checked with ``realpath`` after every entry is written, so chains of links cannot
  escape either; links to folders are refused: they can form cycles); no hard links
  (packing writes contents, never hard links), devices, FIFOs or sparse files; no
  entry written through a link or below a file;
- limits (ArchiveLimits): entries, bytes per file, total bytes, and the expansion ratio
  of the decompressed stream to the compressed bytes (compression bombs), counted on
  the bytes actually decompressed, not on what headers claim, in bounded reads;
- atomicity: entries go to a temporary folder next to the destination, renamed into
  place only when everything passed (and, for tasks, the checksum matched); or, for a
  trial folder that does not exist yet (``unpack_trial_files(..., in_place=True)``),
  straight into the new folder, created exclusively and removed on any refusal.

Unpacking also returns what it saw (``Unpacked``): every entry's kind and size, and
the bytes of the files the caller asked to ``keep``, so the importer builds a trial's
record from the archive it just read instead of reading the files back.

(Over 350 lines on purpose: tasks and trials go through the same ``_extract``, so
every rule above is one piece of code for both; split, the two would drift.)
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common.errors import UserInputError
from services.common.task_identity import task_checksum

MiB = 1024 * 1024
_CHUNK = MiB


class ArchiveError(UserInputError):
    """An archive (or a folder to pack) breaks a rule; the message names entry and rule."""

    def __init__(self, message: str, *, entry: str | None = None, limit: int | None = None):
        super().__init__(message)
        self.entry = entry
        self.limit = limit


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    """Bounds on what one archive may unpack to."""

    max_entries: int = 20_000
    max_file_bytes: int = 256 * MiB
    max_total_bytes: int = 512 * MiB
    max_ratio: int = 200
    """Decompressed tar bytes per compressed byte; checked once past ``ratio_floor``."""
    ratio_floor: int = MiB
    """Below this many decompressed bytes no ratio is enforced (tiny archives of small
    text files legitimately compress 50-100x because tar pads every entry to 512 bytes)."""


TASK_LIMITS = ArchiveLimits()
# Trial archives come from trialbus's own runners (verified by sha256) and agent logs
# can be very repetitive: the total bounds their expansion, so the ratio is no limit
# (gzip cannot exceed ~1032x).
TRIAL_LIMITS = ArchiveLimits(
    max_entries=20_000, max_file_bytes=128 * MiB, max_total_bytes=128 * MiB, max_ratio=2000
)


def file_mode(mode: int) -> int:
    """0755 when the owner may execute, else 0644 (the only modes archives carry)."""
    return 0o755 if mode & stat.S_IXUSR else 0o644


class Budget:
    """Counts decompressed bytes as they are read and enforces the stream-level limits."""

    def __init__(self, compressed: int, limits: ArchiveLimits) -> None:
        self.compressed = max(compressed, 1)
        self.limits = limits
        # Headers and padding on top of the files' bytes: generous, it only bounds memory.
        self.stream_limit = limits.max_total_bytes + (limits.max_entries + 16) * 4096
        self.read = 0
        self.entry = "(archive headers)"

    def check_ratio(self, expanded: int, what: str) -> None:
        """Refuse when ``expanded`` bytes from the compressed size exceed the ratio."""
        limit = self.limits.max_ratio
        if expanded > self.limits.ratio_floor and expanded > limit * self.compressed:
            raise ArchiveError(
                f"{what}: entry {self.entry!r}: expands more than {limit}x its compressed "
                f"size (ratio limit {limit}; a compression bomb?)",
                entry=self.entry,
                limit=limit,
            )

    def count(self, n: int, what: str) -> None:
        self.read += n
        self.check_ratio(self.read, what)
        if self.read > self.stream_limit:
            raise ArchiveError(
                f"{what}: entry {self.entry!r}: the archive expands past "
                f"{self.stream_limit} bytes (total limit {self.limits.max_total_bytes})",
                entry=self.entry,
                limit=self.limits.max_total_bytes,
            )


class _BoundedReader(io.RawIOBase):
    """The decompressed stream, read in bounded chunks so no single read() balloons."""

    def __init__(self, data: bytes, budget: Budget, what: str) -> None:
        self._gz = gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb")
        self._budget = budget
        self._what = what

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        want = size if size >= 0 else self._budget.stream_limit + 1
        parts: list[bytes] = []
        while want > 0:
            chunk = self._gz.read(min(want, _CHUNK))
            if not chunk:
                break
            self._budget.count(len(chunk), self._what)
            parts.append(chunk)
            want -= len(chunk)
        return b"".join(parts)


@dataclass(frozen=True, slots=True)
class Unpacked:
    """An unpacked archive as unpacking saw it, so nothing needs to be read back.

    ``kinds``: every entry's relative path -> "file", "dir" or "link" (folders implied
    by a path included); ``sizes``: each file's size; ``kept``: the bytes of each file
    named in ``keep`` whose size was at most its bound there.
    """

    path: Path
    kinds: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    kept: dict[str, bytes] = field(default_factory=dict)


def _write_all(fd: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view) :]


def _clean_name(raw: str, what: str) -> str | None:
    """The entry's relative path, None for the archive root ('.'), or ArchiveError."""
    if raw.startswith("/"):
        raise ArchiveError(
            f"{what}: entry {raw!r}: absolute path; entries must be relative", entry=raw
        )
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"{what}: entry {raw!r}: '..' in the path leaves the folder", entry=raw)
    return "/".join(parts) or None


def refuse(what: str, name: str, reason: str, limit: int | None = None) -> ArchiveError:
    """An ArchiveError naming ``what`` (the archive or folder), the entry and the rule."""
    return ArchiveError(f"{what}: entry {name!r}: {reason}", entry=name, limit=limit)


def _extract(
    data: bytes,
    into: Path,
    top: int,
    limits: ArchiveLimits,
    allow_links: bool,
    what: str,
    keep: Mapping[str, int],
) -> Unpacked:
    budget = Budget(len(data), limits)
    seen = Unpacked(into)
    kinds, sizes, kept = seen.kinds, seen.sizes, seen.kept
    links: list[tuple[str, str]] = []
    total = 0
    # Created relative to the folder's fd (``top``), not by path: were the folder
    # renamed away meanwhile (a redelivery replacing it, in place), the writes follow
    # it and never land in the folder that took its name.
    try:
        with tarfile.open(fileobj=_BoundedReader(data, budget, what), mode="r|") as tar:
            for member in tar:
                name = _clean_name(member.name, what)
                if name is None:
                    continue  # './' of `tar -C dir .`
                budget.entry = name
                # A folder may be named again (implied by an earlier entry's path first).
                if name in kinds and not (member.isdir() and kinds[name] == "dir"):
                    raise refuse(what, name, "appears twice in the archive")
                if len(kinds) + 1 > limits.max_entries:
                    raise refuse(what, name, "too many entries", limits.max_entries)
                parent = name.rpartition("/")[0]
                prefix = ""
                for part in parent.split("/") if parent else []:
                    prefix = f"{prefix}/{part}" if prefix else part
                    kind = kinds.get(prefix)
                    if kind is None:
                        # Each folder is made once: every folder in ``kinds`` exists.
                        os.mkdir(prefix, 0o755, dir_fd=top)
                        kinds[prefix] = "dir"
                    elif kind != "dir":
                        raise refuse(what, name, f"lies below {prefix!r}, a {kind}")
                if member.isdir():
                    if name not in kinds:
                        os.mkdir(name, 0o755, dir_fd=top)
                    kinds[name] = "dir"
                elif member.isreg() and not member.issparse():
                    if member.size > limits.max_file_bytes:
                        raise refuse(
                            what,
                            name,
                            f"{member.size} bytes, over the per-file limit",
                            limits.max_file_bytes,
                        )
                    total += member.size
                    if total > limits.max_total_bytes:
                        raise refuse(
                            what,
                            name,
                            "the files add up past the total limit",
                            limits.max_total_bytes,
                        )
                    kinds[name] = "file"
                    sizes[name] = member.size
                    source = tar.extractfile(member)
                    assert source is not None  # a regular member always has a file object
                    wanted = member.size <= keep.get(name, -1)
                    parts: list[bytes] = []
                    fd = os.open(
                        name,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                        file_mode(member.mode),
                        dir_fd=top,
                    )
                    try:
                        while chunk := source.read(_CHUNK):
                            _write_all(fd, chunk)
                            if wanted:
                                parts.append(chunk)
                    finally:
                        os.close(fd)
                    if wanted:
                        kept[name] = b"".join(parts)
                elif member.issym():
                    if not allow_links:
                        raise refuse(what, name, "symbolic links are not accepted in this archive")
                    if not member.linkname or member.linkname.startswith("/"):
                        raise refuse(
                            what, name, f"link to {member.linkname!r}: targets must be relative"
                        )
                    kinds[name] = "link"
                    links.append((name, member.linkname))
                elif member.islnk():
                    raise refuse(
                        what,
                        name,
                        f"hard link to {member.linkname!r}: store the file's contents instead",
                    )
                else:
                    kind = "sparse file" if member.issparse() else _member_kind(member)
                    raise refuse(
                        what, name, f"a {kind}: only files, folders and links are accepted"
                    )
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, ValueError) as exc:
        raise refuse(what, budget.entry, f"not a valid .tar.gz ({exc})") from None
    except OSError as exc:
        if exc.errno in (errno.ENAMETOOLONG, errno.EILSEQ, errno.EINVAL, errno.ELOOP, errno.EEXIST):
            raise refuse(what, budget.entry, f"cannot be created: {exc.strerror}") from None
        raise
    # Links last, then judged on the finished tree: realpath follows chains of links
    # exactly as a reader would, which a lexical check of each target cannot. Only links
    # to files: a link to a folder can form a cycle that copying tools follow forever.
    if links:
        # Resolved here, not up front: only a link needs the folder's real path.
        real_root = os.path.realpath(into)
    for name, target in links:
        os.symlink(target, into / name)
    for name, target in links:
        real = os.path.realpath(into / name)
        if not real.startswith(f"{real_root}/") or not os.path.isfile(real):
            raise refuse(
                what, name, f"link to {target!r} does not resolve to a file inside the folder"
            )
    return seen


def _member_kind(member: tarfile.TarInfo) -> str:
    if member.ischr():
        return "character device"
    if member.isblk():
        return "block device"
    if member.isfifo():
        return "FIFO"
    return f"member of type {member.type!r}"


def unpack(
    data: bytes,
    dest: Path,
    limits: ArchiveLimits = TASK_LIMITS,
    *,
    expected_checksum: str | None = None,
    allow_links: bool = True,
    what: str = "task archive",
) -> Path:
    """Unpack ``data`` safely into the new folder ``dest`` (atomically) and return it.

    Entries are written to a temporary folder next to ``dest``; it is renamed to
    ``dest`` only once every rule passed and, when ``expected_checksum`` is given,
    ``task_checksum`` of the result equals it. On any refusal nothing is left behind.
    Raises ArchiveError (see the module docstring); FileExistsError if ``dest`` exists.
    """
    return _unpack(data, dest, limits, expected_checksum, allow_links, what, {}, False).path


def _unpack(
    data: bytes,
    dest: Path,
    limits: ArchiveLimits,
    expected_checksum: str | None,
    allow_links: bool,
    what: str,
    keep: Mapping[str, int],
    in_place: bool,
) -> Unpacked:
    if in_place:
        os.mkdir(dest, 0o755)  # exclusive: FileExistsError leaves someone else's alone
        tmp = dest
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    top = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(top, 0o755)  # whatever the umask, as every folder packing writes
        seen = _extract(data, tmp, top, limits, allow_links, what, keep)
        if expected_checksum is not None:
            actual = task_checksum(tmp)
            if actual != expected_checksum:
                raise ArchiveError(
                    f"{what}: its files have checksum {actual}, not the expected "
                    f"{expected_checksum}: the archive is not the task it claims to be"
                )
        if not in_place:
            try:
                os.rename(tmp, dest)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise FileExistsError(errno.EEXIST, "destination exists", str(dest)) from None
                raise
    except BaseException:
        if not in_place or _same_folder(top, dest):  # never the one that took its place
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(top)
    return Unpacked(dest, seen.kinds, seen.sizes, seen.kept)


def _same_folder(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def unpack_task(
    data: bytes, dest: Path, checksum: str, limits: ArchiveLimits = TASK_LIMITS
) -> Path:
    """Unpack a task archive into ``dest``, verifying it is the task ``checksum`` names."""
    return unpack(data, dest, limits, expected_checksum=checksum)


def unpack_trial(data: bytes, dest: Path, limits: ArchiveLimits = TRIAL_LIMITS) -> Path:
    """Unpack a trial archive into ``dest`` (no links: pack_trial never writes any)."""
    return unpack_trial_files(data, dest, limits).path


def unpack_trial_files(
    data: bytes,
    dest: Path,
    limits: ArchiveLimits = TRIAL_LIMITS,
    *,
    keep: Mapping[str, int] | None = None,
    in_place: bool = False,
) -> Unpacked:
    """``unpack_trial``, returning what was unpacked and the bytes of the ``keep`` files.

    ``keep``: relative path -> the largest size whose bytes are kept. ``in_place``: the
    entries go straight into ``dest``, created here (its parent must exist; raises
    FileExistsError when it does exist) and removed again on any refusal: no staging
    folder and no rename, for a trial folder nobody holds yet.
    """
    return _unpack(data, dest, limits, None, False, "trial archive", keep or {}, in_place)
