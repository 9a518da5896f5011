"""What a sandbox is made of (overlays, binds, limits) and paths resolved inside it.

Plain data and pure functions, apart from ``Sandbox`` (``sandbox``) so that the
environment, the builder and the tests can describe a sandbox without starting one.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from services.localenv.entry import HOST_PATH
from services.localenv.errors import LocalEnvironmentError
from services.localenv.limits import TrialCgroup

BWRAP = "bwrap"
SLIRP4NETNS = "slirp4netns"
HOST_TOOLS = ("unshare", "nsenter", "setpriv", "mount")
# Docker's default capability set for a container's root. Root inside is the host's
# uid 0 (identity map), so this bound matters: without CAP_SYS_ADMIN it cannot undo
# the read-only /proc paths below.
DOCKER_CAPS = (
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "net_bind_service",
    "net_raw",
    "sys_chroot",
    "mknod",
    "audit_write",
    "setfcap",
)
# Kernel settings a trial must not change (Docker makes the same paths read-only).
READ_ONLY_PROC = ("sys", "sysrq-trigger", "irq", "bus", "fs")
# Host top-level links (merged /usr on Debian) recreated inside the sandbox.
HOST_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
FORBIDDEN_IN_PATHS = (":", ",", "\n")


@dataclass(frozen=True, slots=True)
class Overlay:
    """An overlayfs mounted at ``target``: ``lowers`` (top first) under ``upper``."""

    target: str
    lowers: tuple[Path, ...]
    upper: Path
    work: Path


@dataclass(frozen=True, slots=True)
class Bind:
    """A host path bound into the sandbox."""

    source: Path
    target: str
    read_only: bool = False


@dataclass(slots=True)
class SandboxSpec:
    """Everything that defines one sandbox. ``overlays[0]`` must target "/"."""

    state_dir: Path
    overlays: list[Overlay]
    binds: list[Bind] = field(default_factory=list)
    network: bool = False
    hostname: str = "trial"
    cgroup: TrialCgroup | None = None
    memory_rlimit_mb: int | None = None
    pids_rlimit: int | None = None
    """Fallback when no pids cgroup exists (``prlimit --nproc``; host uid 0 is exempt)."""
    helpers_root: Path | None = None
    """Where the read-only exec helpers are prepared (default: ``state_dir``)."""
    seccomp: bool = True
    """Refuse the system calls no task needs (``seccomp``); off only by the operator."""
    userns_base: int | None = None
    """Host uid of root inside (``shift``: uid N inside is host ``base + N``); None:
    the identity map (root inside is host root), the default."""
    hidden: tuple[Path, ...] = ()
    """Host paths the sandbox must not show (the runner's credentials, data, other
    trials' folders): each place where one would appear is covered (``hidden_targets``)."""


@dataclass(frozen=True, slots=True)
class ExecOutcome:
    """Captured output and exit code of one command."""

    stdout: str
    stderr: str
    return_code: int


def hidden_targets(spec: SandboxSpec) -> list[tuple[str, bool]]:
    """Where each of ``spec.hidden`` would show inside the sandbox: (path, is a folder).

    A host path shows through an overlay's host lower folder (the host's /usr, /etc,
    /var: everything below them) and through a bind's source; it is compared once
    links are resolved (``/srv/x -> /var/lib/x`` shows as ``/var/lib/x``). Paths that
    do not exist, or show nowhere (under /tmp, /root, /home: the sandbox's root is the
    task's layer, not the host's), need nothing.
    """
    found: dict[str, bool] = {}
    sources = [
        (low, ov.target) for ov in spec.overlays for low in ov.lowers if low == Path(ov.target)
    ]
    sources += [(b.source, b.target) for b in spec.binds]
    for hidden in spec.hidden:
        real = Path(os.path.realpath(hidden))
        if not os.path.lexists(real):
            continue
        for source, target in sources:
            host = Path(os.path.realpath(source))
            if real.is_relative_to(host):
                inside = PurePosixPath(target, real.relative_to(host))
                found[str(inside)] = real.is_dir()
    return sorted(found.items(), key=lambda item: len(PurePosixPath(item[0]).parts))


def fstab_escape(field: str) -> str:
    """An fstab field: whitespace and backslashes as octal escapes."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\\" else c for c in field)


def missing_host_tools(network: bool) -> list[str]:
    """Host programs the sandbox needs that are not installed."""
    needed = [BWRAP, *HOST_TOOLS, *([SLIRP4NETNS] if network else [])]
    return [t for t in needed if shutil.which(t, path=HOST_PATH) is None]


def resolve_in_root(root: Path, path: str) -> Path:
    """Host path of sandbox ``path`` under ``root``, symlinks resolved *inside* root.

    Absolute link targets restart from ``root`` and ``..`` stops at it, so the result
    never leaves the sandbox's file system (barring concurrent changes by the trial).
    """
    if not path.startswith("/"):
        raise LocalEnvironmentError(f"sandbox path {path!r} must be absolute")
    pending = list(PurePosixPath(path).parts[1:])
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise LocalEnvironmentError(f"too many symbolic links in {path!r}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            pending = [*PurePosixPath(target).parts[1 if target.startswith("/") else 0 :], *pending]
            continue
        resolved.append(part)
    return root.joinpath(*resolved)
