"""Disks that dead trials left behind: found and released, under one sandbox folder only.

A trial's disk (``services.localenv.disk``) is a loop-mounted image in the trial's
folder, ``<scratch>/<trial>/disk.img`` mounted at ``<scratch>/<trial>/disk``, with a lock
(``disk.lock``) the trial's process holds for its whole life. A runner killed outright
(SIGKILL, OOM killer, a crash) releases nothing: the mount, its loop device and the
image (up to the whole quota on the host's disk) stay. ``sweep_stale`` releases them:
at every trial start and when a runner starts (services.runner.app), so a restarted
runner cleans up after the one it replaces.

What is taken is only what this folder's trials own, checked three ways: the path is
exactly ``<scratch>/<child>/disk`` (a folder nested deeper, e.g. another runner's
sandbox folder inside this one, is not this folder's), the mount's source is a loop
device whose backing file is that trial's ``disk.img``, and the trial's lock is free (a
live trial, of this runner or another sharing the folder, holds it). An image kept on
purpose (``keep_sandbox``: ``disk.kept`` beside it) is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from services.localenv.entry import HELPER_ENV, host_tool

IMAGE_NAME = "disk.img"
MOUNT_NAME = "disk"
LOCK_NAME = "disk.lock"
KEPT_NAME = "disk.kept"
"""Beside an image kept on purpose (``keep_sandbox``): a sweep leaves it."""
LAYERS_NAME = ".layers"
"""The layer cache inside a sandbox folder, unless ``cache_dir`` names another."""
_OCTAL = re.compile(r"\\([0-7]{3})")  # mountinfo escapes space, tab, newline, backslash
_DELETED = " (deleted)"


def default_scratch() -> Path:
    """The sandbox folder of trials whose runner or manifest names none."""
    return Path(tempfile.gettempdir()) / "trialbus-sandboxes"


def sweep_stale(scratch: Path, logger: logging.Logger) -> list[Path]:
    """Release the disks of dead trials under ``scratch``; the trial folders released.

    Unmounts their file systems (which frees the loop devices), detaches loop devices
    still bound to their images without a mount, and deletes their images; each
    release is logged as a warning naming the trial folder.
    """
    real = Path(os.path.realpath(scratch))
    swept: dict[Path, None] = {}
    for mount_point, source in _mounts_under(real):
        root = mount_point.parent
        if mount_point.name != MOUNT_NAME or root.parent != real:
            continue
        if _backing_file(source) != root / IMAGE_NAME:
            continue  # not this trial's image: someone else's mount
        with _dead(root) as dead:
            if dead and _release(root, logger, unmount=mount_point):
                swept[root] = None
    mounted = {source for _, source in _mounts_under(Path("/"))}
    for device, backing in _loop_devices():
        root = backing.parent
        if backing.name != IMAGE_NAME or root.parent != real or device in mounted:
            continue
        with _dead(root) as dead:
            if dead and _release(root, logger, detach=device):
                swept[root] = None
    for image in sorted(real.glob(f"*/{IMAGE_NAME}")):
        root = image.parent
        if root in swept or (root / KEPT_NAME).exists() or os.path.ismount(root / MOUNT_NAME):
            continue
        with _dead(root) as dead:
            if dead and _release(root, logger):
                swept[root] = None
    return list(swept)


@contextlib.contextmanager
def _dead(root: Path) -> Iterator[bool]:
    """Whether the trial of ``root`` is dead (its lock taken here until the block ends)."""
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        yield False  # no lock: not a trial folder of ours
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        yield False  # a live trial holds it
        return
    try:
        yield True
    finally:
        os.close(fd)


def _release(
    root: Path, logger: logging.Logger, *, unmount: Path | None = None, detach: str | None = None
) -> bool:
    try:
        if unmount is not None:
            unmount_disk(unmount)
        if detach is not None:
            run_tool("losetup", "-d", detach)
        with contextlib.suppress(FileNotFoundError):
            (root / IMAGE_NAME).unlink()
    except (OSError, subprocess.CalledProcessError) as exc:
        logger.warning("local environment: cannot release %s: %s", root, describe(exc))
        return False
    what = "unmounted" if unmount else f"{detach} detached" if detach else "no mount left"
    logger.warning(
        "local environment: released the disk of a dead trial (%s, image deleted): %s",
        what,
        root,
    )
    return True


def _mounts_under(prefix: Path) -> list[tuple[Path, str]]:
    """(mount point, source) of the mounts below ``prefix`` in this mount namespace."""
    found = []
    start = str(prefix).rstrip("/") + "/"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        point = _unescape(fields[4])
        try:
            source = _unescape(fields[fields.index("-") + 2])
        except (ValueError, IndexError):
            continue
        if point.startswith(start):
            found.append((Path(point), source))
    return found


def _loop_devices() -> list[tuple[str, Path]]:
    """(device, backing file) of every bound loop device."""
    found = []
    for entry in sorted(Path("/sys/block").glob("loop*")):
        backing = _backing_file(f"/dev/{entry.name}")
        if backing is not None:
            found.append((f"/dev/{entry.name}", backing))
    return found


def _backing_file(device: str) -> Path | None:
    """The file a loop device is bound to (as it was named), or None."""
    if not re.fullmatch(r"/dev/loop[0-9]+", device):
        return None
    try:
        name = Path(f"/sys/block/{device[5:]}/loop/backing_file").read_text().rstrip("\n")
    except OSError:
        return None
    return Path(name.removesuffix(_DELETED))


def _unescape(text: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


def unmount_disk(mount_point: Path) -> None:
    """Unmount a trial's disk (its loop device is freed with it: ``autoclear``)."""
    if not os.path.ismount(mount_point):
        return
    try:
        run_tool("umount", str(mount_point))
    except subprocess.CalledProcessError:
        # Busy (a process of the runner still has a file open there): detach now, the
        # kernel frees the file system and its loop device with the last reference.
        run_tool("umount", "-l", str(mount_point))


def run_tool(tool: str, *args: str) -> None:
    """Run a host tool by absolute path with the helpers' clean environment."""
    subprocess.run(
        [host_tool(tool), *args],
        env=dict(HELPER_ENV),
        check=True,
        capture_output=True,
        timeout=120,
    )


def describe(exc: BaseException) -> str:
    """A failed tool's exit status and stderr, or the exception's text."""
    if isinstance(exc, subprocess.CalledProcessError):
        err = exc.stderr.decode(errors="replace").strip() if exc.stderr else ""
        return f"{exc.cmd[0]} exited with {exc.returncode}: {err}"
    return str(exc)
