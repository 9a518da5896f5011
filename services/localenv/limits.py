"""CPU, memory and process-count limits for one sandbox: a cgroup when the host allows.

``TrialCgroup.create`` makes a cgroup for a trial under the runner's own cgroup
(so the trial stays inside whatever limits the runner itself has) and sets:

- cgroup v2: ``memory.max``, ``memory.swap.max = 0``, ``cpu.max`` and ``pids.max``;
- cgroup v1: ``memory.limit_in_bytes`` (and ``memsw`` when present),
  ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` and ``pids.max``.

The process count is best effort: without a pids controller the other limits still
apply and ``pids_limited`` is False (the sandbox then falls back to ``prlimit
--nproc``, which binds a non-root runner's trials only: the kernel exempts host uid 0).

Every process of the sandbox is started inside it (``join_command``), so the
limits cover the whole trial, background processes included. When no cgroup can
be made (no permission, no controller), ``create`` returns None and the sandbox
falls back to a per-process data-size rlimit (``prlimit --data``) for memory, and
no CPU limit; the trial's log says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_SELF_CGROUP = Path("/proc/self/cgroup")
_CFS_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class _Spec:
    """One trial's cgroup request: where it goes, its name and its limits (None = none)."""

    root: Path
    membership: str
    name: str
    cpus: float | None
    memory_mb: int | None
    pids: int | None

    def v1_dir(self, controller: str) -> Path:
        """The trial's folder in one v1 hierarchy, under this process's own cgroup there."""
        own = _own_path(self.membership, controller).lstrip("/")
        return self.root / controller / own / f"trialbus-{self.name}"


@dataclass(slots=True)
class TrialCgroup:
    """The cgroup folder(s) of one trial (one on v2, one per controller on v1)."""

    dirs: list[Path]
    pids_limited: bool = False

    @classmethod
    def create(
        cls,
        name: str,
        *,
        cpus: float | None,
        memory_mb: int | None,
        logger: logging.Logger,
        root: Path = CGROUP_ROOT,
        membership: str | None = None,
        pids: int | None = None,
    ) -> TrialCgroup | None:
        """Make and configure the trial's cgroup; None when the host does not allow it.

        ``membership`` is this process's /proc/self/cgroup (read when not given).
        """
        if cpus is None and memory_mb is None and pids is None:
            return None
        try:
            own = membership if membership is not None else _SELF_CGROUP.read_text()
            spec = _Spec(root, own, name, cpus, memory_mb, pids)
            if (root / "cgroup.controllers").is_file():
                return _create_v2(spec)
            return _create_v1(spec)
        except OSError as exc:
            logger.warning(
                "local environment: no cgroup for %s (%s); CPU not limited, memory "
                "limited per process only",
                name,
                exc,
            )
            return None

    def join_command(self) -> list[str]:
        """A command prefix that moves itself into the cgroup, then runs the rest."""
        script = "".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))} && " for d in self.dirs)
        return ["/bin/sh", "-c", f'{script}exec "$@"', "sh"]

    def remove(self, timeout_s: float = 2.0) -> None:
        """Remove the cgroup once its processes are gone (they are killed before)."""
        deadline = time.monotonic() + timeout_s
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    _kill_members(d)
                    time.sleep(0.02)


def _kill_members(d: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (d / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), 9)


def _own_path(membership: str, controller: str) -> str:
    """This process's cgroup path in one hierarchy ('' = the v2 unified one)."""
    for line in membership.splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    raise OSError(f"no {controller or 'cgroup v2'} hierarchy in /proc/self/cgroup")


def _create_v2(s: _Spec) -> TrialCgroup:
    own = s.root / _own_path(s.membership, "").lstrip("/")
    parent = own / "trialbus"
    parent.mkdir(exist_ok=True)
    wanted = [c for c, v in (("memory", s.memory_mb), ("cpu", s.cpus)) if v is not None]
    # Controllers this process's cgroup hands down to its children (delegation).
    available = set((parent / "cgroup.controllers").read_text().split())
    missing = [c for c in wanted if c not in available]
    if missing:
        raise OSError(f"cgroup v2 controllers not delegated here: {', '.join(missing)}")
    if s.pids is not None and "pids" in available:
        wanted.append("pids")
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    for c in wanted:
        if c not in enabled:
            (parent / "cgroup.subtree_control").write_text(f"+{c}")
    d = parent / s.name
    d.mkdir()
    if s.memory_mb is not None:
        (d / "memory.max").write_text(str(s.memory_mb * 1024 * 1024))
        with contextlib.suppress(OSError):
            (d / "memory.swap.max").write_text("0")
    if s.cpus is not None:
        (d / "cpu.max").write_text(f"{int(s.cpus * _CFS_PERIOD_US)} {_CFS_PERIOD_US}")
    if "pids" in wanted:
        (d / "pids.max").write_text(str(s.pids))
    return TrialCgroup([d], pids_limited="pids" in wanted)


def _create_v1(s: _Spec) -> TrialCgroup:
    dirs: list[Path] = []
    pids_limited = False
    try:
        if s.memory_mb is not None:
            d = s.v1_dir("memory")
            d.mkdir()
            dirs.append(d)
            limit = str(s.memory_mb * 1024 * 1024)
            (d / "memory.limit_in_bytes").write_text(limit)
            with contextlib.suppress(OSError):
                (d / "memory.memsw.limit_in_bytes").write_text(limit)
        if s.cpus is not None:
            d = s.v1_dir("cpu")
            d.mkdir()
            dirs.append(d)
            (d / "cpu.cfs_period_us").write_text(str(_CFS_PERIOD_US))
            (d / "cpu.cfs_quota_us").write_text(str(int(s.cpus * _CFS_PERIOD_US)))
        if s.pids is not None and (s.root / "pids").is_dir():
            pids_limited = _pids_v1(s, s.pids, dirs)
    except OSError:
        TrialCgroup(dirs).remove(0)
        raise
    if not dirs:
        raise OSError("no cgroup v1 controller to use")
    return TrialCgroup(dirs, pids_limited=pids_limited)


def _pids_v1(s: _Spec, pids: int, dirs: list[Path]) -> bool:
    """Add a v1 pids cgroup to ``dirs``; False (and nothing added) when it cannot be made."""
    try:
        d = s.v1_dir("pids")
        d.mkdir()
    except OSError:
        return False
    try:
        (d / "pids.max").write_text(str(pids))
    except OSError:
        TrialCgroup([d]).remove(0)
        return False
    dirs.append(d)
    return True
