"""Host-side file access to what a trial (or a task author) controls.

A trial is root inside and writes whatever it likes into its own folders, some of
which are host folders bound in (Harbor's ``/logs/...``). The runner reads and
copies such files on the host, and the task's environment folder (the build
context) and tests come from the task author. Every such access goes through here:

- no symbolic link is followed out of the folder it belongs to (links are copied as
  links, or resolved inside their root, or removed from host-bound folders);
- FIFOs, sockets and devices are refused (opening a FIFO blocks forever, a device
  reads without end);
- reads are bounded (``MAX_COPY_BYTES`` per file);
- folders the runner keeps trial files in are private (``private_dir``).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from services.localenv.errors import LocalEnvironmentError

MAX_COPY_BYTES = 4 * 1024 * 1024 * 1024
"""Largest single file copied in or out of a sandbox (a sparse 1 TB file would fill
the host's disk)."""
_CHUNK = 1024 * 1024


def private_dir(path: Path) -> None:
    """Make ``path`` a folder only this runner's user can enter (0700).

    A folder that is a link, or that another user owns (``/tmp`` is shared: someone
    may have made it first), is refused rather than used.
    """
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise LocalEnvironmentError(f"{path} must be a folder, not a link or a file")
    if st.st_uid != os.geteuid():
        raise LocalEnvironmentError(
            f"{path} belongs to uid {st.st_uid}, not to this runner (uid {os.geteuid()}): "
            "another user may read or plant trial files there; choose another folder "
            "(scratch_dir / cache_dir, or TRIALBUS_SANDBOX_DIR for the runner)"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def _check_special(st: os.stat_result, path: Path) -> None:
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        kind = "FIFO" if stat.S_ISFIFO(st.st_mode) else "socket or device"
        raise LocalEnvironmentError(f"{path} is a {kind}: only files, folders and links are copied")


def copy_file(
    src: Path, dest: Path, *, limit: int = MAX_COPY_BYTES, allow_link: bool = True
) -> None:
    """Copy one regular file, never following a link at ``src`` itself, never blocking
    on a FIFO, at most ``limit`` bytes; mode and times are kept. A link is copied as
    a link (or refused, ``allow_link=False``); a link at ``dest`` is replaced."""
    st = os.lstat(src)
    _check_special(st, src)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{src} is a folder")
    if stat.S_ISLNK(st.st_mode) and not allow_link:
        raise LocalEnvironmentError(f"{src} is a symbolic link: not followed")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if dest.is_symlink():
            dest.unlink()
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            dest.unlink()
        dest.symlink_to(os.readlink(src))
        return
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)  # what was opened, not what was looked at (it may have changed)
        _check_special(st, src)
        if st.st_size > limit:
            raise LocalEnvironmentError(f"{src} is larger than {limit} bytes: not copied")
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            copied = 0
            while chunk := os.read(fd, _CHUNK):
                copied += len(chunk)
                if copied > limit:
                    raise LocalEnvironmentError(f"{src} grew beyond {limit} bytes: not copied")
                os.write(out, chunk)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(fd)


def copy_tree(src: Path, dest: Path, *, limit: int = MAX_COPY_BYTES) -> list[Path]:
    """Copy a folder: links as links, special files refused, each file bounded; the
    copied top-level entries. ``src`` itself must be a real folder (not a link)."""
    st = os.lstat(src)
    if not stat.S_ISDIR(st.st_mode):
        raise LocalEnvironmentError(f"{src} is not a folder")
    if dest.is_symlink():  # never write through a link the other side planted
        dest.unlink()
    dest.mkdir(parents=True, exist_ok=True)
    top = []
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        target = dest / entry.name
        if entry.is_dir(follow_symlinks=False):
            copy_tree(Path(entry.path), target, limit=limit)
            with contextlib.suppress(OSError):
                os.chmod(target, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode))
        else:
            copy_file(Path(entry.path), target, limit=limit)
        top.append(target)
    return top


def sweep_bound_folder(folder: Path) -> list[str]:
    """Make a host folder a trial wrote into safe for host readers; what was changed.

    Removes links that point outside ``folder`` (a reward file linked to
    /etc/shadow would otherwise be read by the host) and FIFOs, sockets and devices,
    and clears setuid/setgid bits (the files are the host's root's).
    """
    changed: list[str] = []
    base = folder.resolve()
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                # Resolving names only (nothing is opened); the whole chain must stay in.
                if not Path(os.path.realpath(path)).is_relative_to(base):
                    _unlink(path, changed, "link out of the folder")
            elif not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                _unlink(path, changed, "special file")
            elif st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                with contextlib.suppress(OSError):
                    os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                    changed.append(f"{path}: setuid/setgid bit cleared")
    return changed


def _unlink(path: Path, changed: list[str], why: str) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
        changed.append(f"{path}: removed ({why})")
