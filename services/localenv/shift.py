"""Root inside as an unprivileged host uid: the opt-in "shifted" user namespace.

By default root inside a sandbox is the host's uid 0 (identity map, ``sandbox``). With
the runner's ``TRIALBUS_SANDBOX_USERNS=shifted`` (environment kwarg ``userns_base``)
uid N inside is host uid ``base + N`` (``0 base 65536``): a file the host keeps for its
root (mode 0600) is refused to root inside, and whatever the trial writes lands on the
host owned by ``base`` and up, which the runner (root) still reads.

How a shifted sandbox comes up (``stage0``), all before the trial's code runs::

    runner ── unshare --mount (host root, a private mount namespace of its own)
                │  tmpfs on STAGING (only this namespace sees it); idmapped views of
                │  the host's /usr, /etc, /var there (``idmap``); the overlays mounted
                │  there by host root (lowers: layer + views); every bind source bound
                │  there (the uid below cannot walk the runner's 0700 folders)
                └─ setpriv --reuid/--regid base ── unshare --user --mount ── bwrap ...

The uid is dropped *before* the user namespace exists: a process still host uid 0 in
it would keep host root's access as the owner of root's files (measured). Files the
host writes for the trial (upper folders, log folders, uploads, the masks, COPY
output, a built layer) are handed to the shifted ids with ``shift_tree``.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from services.localenv.entry import host_tool

SHIFT_COUNT = 65536
"""Ids mapped per sandbox: 0..65535 inside, as Docker's default user namespace range."""
DEFAULT_BASE = 100000
STAGING = Path("/run/trialbus-shift")
"""An empty host folder; each shifted sandbox mounts its own tmpfs there, privately."""
IDMAP_SCRIPT = Path(__file__).with_name("idmap.py")


def parse_userns(value: object, base: object = None) -> int | None:
    """The host uid of root inside for an environment kwarg ``userns`` (None: identity).

    ``"shifted"`` maps to ``base`` (default ``DEFAULT_BASE``); ``""``/``"identity"``/None
    keep the identity map. Anything else is refused, naming the accepted values.
    """
    if value in (None, "", "identity", False):
        return None
    if value != "shifted":
        raise ValueError(f"userns must be 'identity' or 'shifted', not {value!r}")
    chosen = DEFAULT_BASE if base in (None, "") else int(str(base))
    if chosen < SHIFT_COUNT or chosen + SHIFT_COUNT > 2**32 - 1:
        raise ValueError(
            f"userns_base {chosen} must be at least {SHIFT_COUNT} (above every id the "
            "host itself uses inside) and leave room for 65536 ids"
        )
    return chosen


def shifted(ident: int, base: int) -> int:
    """The host id of id ``ident`` inside (ids already shifted stay as they are)."""
    return ident + base if ident < SHIFT_COUNT else ident


def shift_owner(path: Path, base: int) -> None:
    """Hand one file, folder or link (never followed) to the shifted ids."""
    st = os.lstat(path)
    uid, gid = shifted(st.st_uid, base), shifted(st.st_gid, base)
    if (uid, gid) != (st.st_uid, st.st_gid):
        mode = st.st_mode & 0o7777
        os.lchown(path, uid, gid)
        if mode & 0o6000 and not os.path.islink(path):
            os.chmod(path, mode)  # chown clears setuid/setgid: the image's bits stay


def make_dir(folder: Path, base: int | None) -> None:
    """``mkdir -p`` of a folder seen from the host (``/proc/<pid>/root/...``); what it
    creates is root inside's (host root's without a shift)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    if base is not None:
        for p in missing:
            shift_owner(p, base)


def shift_tree(path: Path, base: int) -> None:
    """``shift_owner`` on ``path`` and everything below it on its file system (links
    not followed; mounts inside, such as the lent read-only tools, are left alone)."""
    if not os.path.lexists(path):
        return
    shift_owner(path, base)
    if not path.is_dir() or path.is_symlink():
        return
    device = os.lstat(path).st_dev
    for dirpath, dirnames, filenames in os.walk(path):
        for name in (*dirnames, *filenames):
            entry = Path(dirpath, name)
            if os.lstat(entry).st_dev != device:  # a mount (a lent tool): not ours
                if name in dirnames:
                    dirnames.remove(name)
                continue
            shift_owner(entry, base)


@dataclass(slots=True)
class Staging:
    """Where each host path the sandbox mounts is reachable by the shifted uid."""

    base: int
    commands: list[str] = field(default_factory=list)
    staged: dict[Path, str] = field(default_factory=dict)
    _views: list[tuple[str, str]] = field(default_factory=list)
    _count: int = 0

    def _next(self, kind: str) -> str:
        self._count += 1
        return str(STAGING / f"{kind}{self._count}")

    def view(self, host_dir: Path) -> str:
        """An idmapped view of a host folder (an overlay's lower)."""
        target = self._next("h")
        self.commands.append(f"mkdir {shlex.quote(target)}")
        self._views.append((str(host_dir), target))
        return target

    def mountpoint(self) -> str:
        """An empty folder for an overlay mounted by host root."""
        target = self._next("o")
        self.commands.append(f"mkdir {shlex.quote(target)}")
        return target

    def source(self, path: Path) -> str:
        """A bind source, bound (recursively, as bwrap would) under the staging folder."""
        if path in self.staged:
            return self.staged[path]
        target = self._next("b")
        make = "mkdir" if path.is_dir() else ": >"
        self.commands.append(f"{make} {shlex.quote(target)}")
        self.commands.append(shlex.join([_tool("mount"), "-n", "--rbind", str(path), target]))
        self.staged[path] = target
        return target

    def script(self, fstab: Path, then: Iterable[str]) -> str:
        """Stage 0 (host root, private mount namespace): views, overlays, binds, then
        ``then`` (the uid drop and the user namespace)."""
        tmpfs = [_tool("mount"), "-n", "-t", "tmpfs", "-o", "mode=0755,nosuid,nodev,size=1m"]
        lines = ["set -e", shlex.join([*tmpfs, "trialbus-shift", str(STAGING)])]
        mkdirs = [c for c in self.commands if c.startswith("mkdir")]
        lines += mkdirs
        if self._views:
            pairs = [p for view in self._views for p in view]
            idmap = [sys.executable, "-I", "-S", str(IDMAP_SCRIPT), str(self.base)]
            lines.append(shlex.join([*idmap, str(SHIFT_COUNT), *pairs]))
        lines.append(shlex.join([_tool("mount"), "-n", "-a", "-T", str(fstab)]))
        lines += [c for c in self.commands if not c.startswith("mkdir")]
        lines.append("exec " + shlex.join([_tool("setpriv"), *drop_args(self.base), *then]))
        return "\n".join(lines)


def drop_args(base: int) -> list[str]:
    """setpriv's options that make a host root process the shifted root."""
    return [f"--reuid={base}", f"--regid={base}", "--clear-groups", "--"]


def _tool(name: str) -> str:
    return host_tool(name)
