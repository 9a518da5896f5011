"""Task and trial folders as deterministic .tar.gz archives (unpacking: services.common.unpack).

Tasks travel to runners as archives named by their content checksum, trial folders
back to the importer. Packing is deterministic (same folder, same bytes): entries in
path order, mtime 0, uid/gid 0, no user names, modes 0644/0755 (the owner's exec bit
kept), a gzip header without time or name. The task identity stays ``task_checksum``
(sha256 over relative paths and file contents; services.submitter.resolve): the
submitter records it in provenance and the local environment keys its layer cache on it.

A task is packed under the limits its unpacking will enforce, so a folder the runners
would refuse is refused at submit time, naming the entry. A trial folder is written by
the agent: nothing in it is followed, and what does not fit its cap is listed in the
archive's TRIAL_MANIFEST instead of being dropped silently.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from services.common.unpack import (
    TASK_LIMITS,
    TRIAL_LIMITS,
    ArchiveError,
    ArchiveLimits,
    Budget,
    MiB,
    file_mode,
    refuse,
    unpack,
    unpack_task,
    unpack_trial,
)

__all__ = [
    "DEFAULT_TRIAL_CAP_BYTES",
    "TASK_LIMITS",
    "TRIAL_LIMITS",
    "TRIAL_MANIFEST",
    "ArchiveError",
    "ArchiveLimits",
    "LeftOut",
    "TrialArchive",
    "pack_task",
    "pack_trial",
    "unpack",
    "unpack_task",
    "unpack_trial",
]

TRIAL_MANIFEST = "trialbus-manifest.json"
"""Member of every trial archive listing what was left out (name, size, reason)."""
DEFAULT_TRIAL_CAP_BYTES = 32 * MiB
_MANIFEST_MAX_LISTED = 1000
# Parts of a trial folder in the order they matter to the importer and `harbor view`;
# other top-level files rank third, anything else last.
_TRIAL_PRIORITY = ("result.json", "config.json", None, "verifier/", "agent/", "artifacts/")


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A file of a trial folder that is not in its archive, and why."""

    name: str
    size: int
    reason: str


@dataclass(frozen=True, slots=True)
class TrialArchive:
    """A packed trial folder: its bytes and what was kept or left out."""

    data: bytes
    files: int
    file_bytes: int
    left_out: list[LeftOut] = field(default_factory=list)
    redactions: int = 0
    """Secret occurrences replaced while packing (``pack_trial``'s ``scrub``)."""


# -- packing -----------------------------------------------------------------------------


def _walk(
    root: Path, on_error: Callable[[str, OSError], None] | None = None
) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative name, path, lstat) of everything under ``root``, parents first, sorted.

    Links are yielded, never followed. Iterative, so a deep tree cannot exhaust the
    stack; ``on_error`` receives folders that cannot be listed (else they raise).
    """
    stack = [("", iter(sorted(os.listdir(root))))]
    while stack:
        rel, names = stack[-1]
        name = next(names, None)
        if name is None:
            stack.pop()
            continue
        child = f"{rel}/{name}" if rel else name
        st = os.lstat(root / child)
        yield child, root / child, st
        if stat.S_ISDIR(st.st_mode):
            try:
                stack.append((child, iter(sorted(os.listdir(root / child)))))
            except OSError as exc:
                if on_error is None:
                    raise
                on_error(child, exc)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _info(name: str, kind: bytes, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = linkname
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _Writer:
    """A deterministic .tar.gz being written to memory."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()
        # mtime=0 and no file name: the gzip header must not vary between packings.
        # Level 6: level 9 (gzip's default here) took 3.5x the time for 0.02% smaller
        # output on a 1 MB trial folder.
        self._gz = gzip.GzipFile(
            fileobj=self.buffer, mode="wb", compresslevel=6, mtime=0, filename=""
        )
        # Closed in finish(); a context manager cannot span the caller's loop.
        self.tar = tarfile.open(fileobj=self._gz, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115

    def file(self, rel: str, path: Path) -> int:
        """Add a regular file (opened without following links); return its size."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            self.tar.addfile(_info(rel, tarfile.REGTYPE, file_mode(st.st_mode), st.st_size), f)
            return st.st_size

    def finish(self) -> bytes:
        """Close the archive; its bytes (``tar_bytes``: the size once decompressed)."""
        self.tar.close()
        self.tar_bytes = self._gz.tell()
        self._gz.close()
        return self.buffer.getvalue()


def pack_task(folder: Path, limits: ArchiveLimits = TASK_LIMITS) -> bytes:
    """A task folder as deterministic .tar.gz bytes; refuses what unpacking would refuse.

    Symbolic links are kept when they resolve to a file inside the task (stored
    relative); links leaving the task, to folders or dangling, devices, FIFOs and
    sockets raise ArchiveError naming the entry.
    """
    root = folder.resolve()
    where = str(folder)
    writer = _Writer()
    total = 0
    for entries, (rel, path, st) in enumerate(_walk(root), start=1):
        if entries > limits.max_entries:
            raise refuse(where, rel, "too many entries; is this a task folder?", limits.max_entries)
        if stat.S_ISDIR(st.st_mode):
            writer.tar.addfile(_info(rel, tarfile.DIRTYPE, 0o755))
        elif stat.S_ISREG(st.st_mode):
            if st.st_size > limits.max_file_bytes:
                raise refuse(
                    where,
                    rel,
                    f"{st.st_size} bytes, over the per-file limit",
                    limits.max_file_bytes,
                )
            total += writer.file(rel, path)
            if total > limits.max_total_bytes:
                raise refuse(
                    where, rel, "the files add up past the total limit", limits.max_total_bytes
                )
        elif stat.S_ISLNK(st.st_mode):
            writer.tar.addfile(_info(rel, tarfile.SYMTYPE, 0o777, linkname=_inside(root, path)))
        else:
            raise refuse(
                where,
                rel,
                f"a {_kind(st.st_mode)}; a task holds only files, folders and links: remove it",
            )
    data = writer.finish()
    # A task that packs like a compression bomb would be refused by every runner.
    budget = Budget(len(data), limits)
    budget.entry = "(all files)"
    budget.check_ratio(writer.tar_bytes, where)
    return data


def _inside(root: Path, link: Path) -> str:
    """The link's target text to store; ArchiveError unless it resolves inside ``root``."""
    rel = link.relative_to(root).as_posix()
    target = os.readlink(link)
    try:
        real = Path(os.path.realpath(link, strict=True))
    except OSError:
        raise refuse(str(root), rel, f"link to {target!r} is dangling or loops") from None
    if not real.is_relative_to(root):
        raise refuse(str(root), rel, f"link to {target!r} leaves the task folder; copy the file in")
    if not real.is_file():
        raise refuse(
            str(root),
            rel,
            f"link to {target!r} is a link to a folder (they can form cycles); copy the folder in",
        )
    # An absolute target inside the task would point elsewhere once unpacked.
    return os.path.relpath(real, link.parent) if os.path.isabs(target) else target


def _read_bounded(f: io.BufferedReader, size: int, limit: int) -> bytes:
    """At most ``limit`` bytes of ``f`` (``size`` when looked at): ``f.read(limit)``
    allocates the whole cap (32 MiB) per file, ~0.1 ms each; this reads the same bytes."""
    blob = f.read(min(limit, size + 1))
    if len(blob) == size + 1 and len(blob) < limit:  # it grew since it was looked at
        blob += f.read(limit - len(blob))
    return blob


Scrub = Callable[[bytes], tuple[bytes, int] | None]
"""Rewrites a file's bytes before they are packed: (new bytes, replacements), or None
to keep them (services.common.redaction.Redactor.redact_file)."""


def pack_trial(
    folder: Path,
    cap_bytes: int = DEFAULT_TRIAL_CAP_BYTES,
    max_entries: int = 10_000,
    scrub: Scrub | None = None,
) -> TrialArchive:
    """A finished trial folder as a deterministic .tar.gz, at most ``cap_bytes`` of files.

    Files are admitted in priority order (result.json, config.json, other top-level
    files, verifier/, agent/, artifacts/, the rest; by path within each part) while
    they fit the cap; the rest, and links, devices or unreadable files (the agent wrote
    them: nothing is followed), are left out and listed in TRIAL_MANIFEST, which every
    trial archive carries, so an overflow is recorded, never silently dropped.
    ``scrub`` (secret redaction) rewrites each admitted file; the manifest records how
    many replacements were made and in how many files, never what was replaced.
    """
    root = folder.resolve()
    left: list[LeftOut] = []
    dirs: list[str] = []
    files: list[tuple[str, Path, int]] = []

    def unlisted(rel: str, exc: OSError) -> None:
        left.append(LeftOut(rel + "/", 0, f"folder not listable: {exc.strerror or exc}"))

    for i, (rel, path, st) in enumerate(_walk(root, unlisted)):
        if i >= max_entries:
            left.append(
                LeftOut(rel, st.st_size, f"over the per-trial limit of {max_entries} entries")
            )
        elif stat.S_ISDIR(st.st_mode):
            dirs.append(rel)
        elif not stat.S_ISREG(st.st_mode):
            left.append(LeftOut(rel, st.st_size, f"{_kind(st.st_mode)} (not followed)"))
        elif rel == TRIAL_MANIFEST:
            left.append(LeftOut(rel, st.st_size, "name reserved for trialbus's manifest"))
        else:
            files.append((rel, path, st.st_size))

    def priority(item: tuple[str, Path, int]) -> tuple[int, str]:
        rel = item[0]
        for rank, part in enumerate(_TRIAL_PRIORITY):
            if part is not None and (rel == part or (part[-1] == "/" and rel.startswith(part))):
                return rank, rel
        return (2 if "/" not in rel else len(_TRIAL_PRIORITY)), rel

    kept: dict[str, Path] = {}
    used = 0
    for rel, path, size in sorted(files, key=priority):
        if used + size > cap_bytes:
            left.append(LeftOut(rel, size, f"over the per-trial cap of {cap_bytes} bytes"))
            continue
        kept[rel] = path
        used += size

    writer = _Writer()
    stored = n_files = scrubbed_files = replacements = 0
    for rel in sorted([*dirs, *kept]):
        if rel not in kept:
            writer.tar.addfile(_info(rel, tarfile.DIRTYPE, 0o755))
            continue
        try:
            # Read whole (at most the cap) before writing the header, so a file the
            # agent left unreadable is recorded and cannot leave a half-written member.
            fd = os.open(kept[rel], os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(fd)
                mode, blob = st.st_mode, _read_bounded(f, st.st_size, cap_bytes - stored + 1)
        except OSError as exc:
            left.append(LeftOut(rel, 0, f"unreadable: {exc.strerror or exc}"))
            continue
        if scrub is not None and (scrubbed := scrub(blob)) is not None and scrubbed[1]:
            blob = scrubbed[0]
            scrubbed_files += 1
            replacements += scrubbed[1]
        if stored + len(blob) > cap_bytes:  # it grew since it was listed (or was redacted)
            left.append(LeftOut(rel, len(blob), f"over the per-trial cap of {cap_bytes} bytes"))
            continue
        writer.tar.addfile(
            _info(rel, tarfile.REGTYPE, file_mode(mode), len(blob)), io.BytesIO(blob)
        )
        stored += len(blob)
        n_files += 1
    left.sort(key=lambda item: item.name)
    manifest = {
        "cap_bytes": cap_bytes,
        "files": n_files,
        "file_bytes": stored,
        "left_out": [
            {"name": x.name, "size": x.size, "reason": x.reason}
            for x in left[:_MANIFEST_MAX_LISTED]
        ],
        "left_out_not_listed": max(0, len(left) - _MANIFEST_MAX_LISTED),
    }
    if scrub is not None:
        manifest["redacted"] = {"files": scrubbed_files, "replacements": replacements}
    blob = json.dumps(manifest, sort_keys=True, indent=1).encode()
    writer.tar.addfile(_info(TRIAL_MANIFEST, tarfile.REGTYPE, 0o644, len(blob)), io.BytesIO(blob))
    return TrialArchive(writer.finish(), n_files, stored, left, replacements)
