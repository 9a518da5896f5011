"""Replay a Dockerfile's ``BuildPlan`` into a new layer, as ``docker build`` would.

The build runs in its own sandbox (host folders below, the new layer's folders as
upper), with network, as Docker builds have. Steps:

- FROM: nothing for ubuntu/debian bases; for ``python:3.X`` a virtual environment
  of the host's Python 3.X is created at /usr/local (python, python3, pip there).
- WORKDIR: the folder is created.
- COPY/ADD: files from the task's environment folder (the build context), with
  ``--chown``/``--chmod``; ADD unpacks local tar archives.
- RUN: the command runs with the ARG and ENV values in scope, in the current
  WORKDIR, as the current USER; a non-zero exit ends the build with
  ``DockerfileBuildError`` carrying the log's tail.

Every step is written to the build log (``#N`` headers, output, duration), up to
``MAX_BUILD_LOG_BYTES``; only its last lines are kept in memory. The whole build has
a deadline (the task's ``build_timeout_sec``) and runs in a cgroup with a process
limit (and a memory limit when asked), like every trial, and writes its layer on a
disk of the runner's quota, ``disk_mb`` (``build_disk``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from services.localenv.build_copy import copy_step
from services.localenv.build_disk import BuildDisk
from services.localenv.dockerfile import BuildPlan, CopyStep, WorkdirStep
from services.localenv.errors import DockerfileBuildError, ExecTimeoutError, LocalEnvironmentError
from services.localenv.images import BaseImage
from services.localenv.layers import FS_TOPS, HOST_TOPS, ImageConfig
from services.localenv.limits import TrialCgroup
from services.localenv.masks import mask_host_secrets
from services.localenv.sandbox import Sandbox
from services.localenv.shift import make_dir, shift_tree
from services.localenv.spec import Bind, Overlay, SandboxSpec
from services.localenv.tools import seed_home
from services.localenv.users import lookup_user

# Folders every image has (Debian's base image), with their modes.
SKELETON = {
    "tmp": 0o1777,
    "run": 0o755,
    "run/lock": 0o1777,
    "root": 0o700,
    "home": 0o755,
    "opt": 0o755,
    "srv": 0o755,
    "mnt": 0o755,
    "media": 0o755,
}
# Harbor's log folders, bound into every trial (their mount points live in the layer).
HARBOR_MOUNTS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
# Files Docker provides per container, never part of an image.
RUNTIME_ETC_FILES = ("resolv.conf", "hosts", "hostname")
_TAIL_LINES = 25
MAX_BUILD_LOG_BYTES = 16 * 1024 * 1024
"""The build log on disk stops here (a step printing without end cannot fill the disk)."""


@dataclass(slots=True)
class BuildRequest:
    """What to build: a plan, its mapped base, the context folder and the run defaults."""

    plan: BuildPlan
    base: BaseImage
    context: Path
    base_env: Mapping[str, str]
    binds: tuple[Bind, ...]
    seed_uv_home: bool
    empty_dir: Path
    network: bool = True
    timeout_sec: float | None = None
    """Deadline of the whole build (Harbor's ``build_timeout_sec``); None: none."""
    pids_limit: int | None = None
    memory_mb: int | None = None
    hidden: tuple[Path, ...] = ()
    """Host paths a RUN step must not see (``SandboxSpec.hidden``)."""
    seccomp: bool = True
    """RUN steps get the trial's seccomp filter (``SandboxSpec.seccomp``)."""
    disk_mb: int | None = None
    """What the build may write (``build_disk``); None: unbounded."""
    userns_base: int | None = None
    """RUN steps run with root inside as this host uid (``shift``); the layer's files
    are then owned by the shifted ids. None: the identity map."""


class _Log:
    """The build log: written to disk up to a size, its last lines kept in memory."""

    def __init__(self, stream: TextIO, limit: int = MAX_BUILD_LOG_BYTES) -> None:
        self._stream = stream
        self._left = limit
        self.lines: deque[str] = deque(maxlen=_TAIL_LINES)

    def write(self, text: str) -> None:
        if self._left > 0:
            data = text[: self._left]
            self._left -= len(data)
            if self._left <= 0:
                data += "\n[trialbus: build log truncated here]\n"
            self._stream.write(data)
            self._stream.flush()
        # Long lines count once per 500 characters of the tail, not whole.
        self.lines.extend(line[:500] for line in text.splitlines()[-_TAIL_LINES:])

    def tail(self) -> str:
        return "\n".join(self.lines)


async def build_layer(req: BuildRequest, dest: Path, logger: logging.Logger) -> ImageConfig:
    """Build the layer into ``dest`` (a new folder); returns the image configuration.

    With ``req.disk_mb`` the layer is written on a disk of that size (``build_disk``)
    and copied into ``dest/fs`` once built; a build that fills it fails naming the quota.
    """
    disk = await asyncio.to_thread(BuildDisk.open, dest, req.disk_mb, logger)
    try:
        try:
            config = await _build(req, dest, disk.root, logger)
        except (DockerfileBuildError, OSError) as exc:
            if not disk.full():
                raise
            log_path = dest / "build.log"
            raise DockerfileBuildError(
                f"{disk.exceeded()}: {str(exc).splitlines()[0][:300]}", log_path
            ) from exc
        await asyncio.to_thread(disk.keep)
    finally:
        await asyncio.to_thread(disk.release)
    return config


async def _build(req: BuildRequest, dest: Path, base: Path, logger: logging.Logger) -> ImageConfig:
    """Replay the plan with the layer's folders under ``base`` (the build's disk or
    ``dest``); the log, state and helpers stay in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    fs = base / "fs"
    for top in FS_TOPS:
        (fs / top).mkdir(parents=True, exist_ok=True)
    for rel, mode in SKELETON.items():
        folder = fs / "root" / rel
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(mode)
    if req.seed_uv_home:
        seed_home(fs / "root" / "root")
    binds = list(req.binds)
    if req.base.python is not None and req.base.python.needs_bind:
        prefix = req.base.python.prefix
        binds.append(Bind(Path(prefix), prefix, read_only=True))
    _make_mountpoints(fs / "root", [*binds, *(Bind(Path("/"), t) for t in HARBOR_MOUNTS)])
    overlays = [Overlay("/", (req.empty_dir,), fs / "root", base / "work" / "root")]
    overlays += [
        Overlay(f"/{top}", (Path(f"/{top}"),), fs / top, base / "work" / top) for top in HOST_TOPS
    ]
    etc = fs / "etc"
    # Before any step runs: a RUN step must not read the host's secrets either.
    masked = mask_host_secrets(fs)
    (etc / "resolv.conf").write_text("nameserver 10.0.2.3\n")
    (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n")
    if req.userns_base is not None:
        # Skeleton, masks, seeded home and mount points: root inside's, not host root's.
        await asyncio.to_thread(shift_tree, fs, req.userns_base)
    cgroup = TrialCgroup.create(
        dest.name, cpus=None, memory_mb=req.memory_mb, pids=req.pids_limit, logger=logger
    )
    spec = SandboxSpec(
        state_dir=dest / "state",
        overlays=overlays,
        binds=binds,
        network=req.network,
        cgroup=cgroup,
        memory_rlimit_mb=req.memory_mb if cgroup is None else None,
        pids_rlimit=req.pids_limit if cgroup is None or not cgroup.pids_limited else None,
        helpers_root=dest.parent / ".exec-helpers",
        hidden=req.hidden,
        seccomp=req.seccomp,
        userns_base=req.userns_base,
    )
    sandbox = Sandbox(spec, logger)
    log_path = dest / "build.log"
    with log_path.open("w") as stream:
        log = _Log(stream)
        log.write(f"#0 host secrets masked: {', '.join(masked) or 'none found'}\n")
        await sandbox.start()
        deadline = time.monotonic() + req.timeout_sec if req.timeout_sec else None
        try:
            await _replay(req, sandbox, log, log_path, deadline)
        finally:
            await sandbox.stop()
    for name in RUNTIME_ETC_FILES:
        (etc / name).unlink(missing_ok=True)
    for scratch in (base / "work", dest / "state"):
        shutil.rmtree(scratch, ignore_errors=True)
    python = req.base.python
    return ImageConfig(
        base=req.plan.base,
        base_description=req.base.describe(),
        env=dict(req.plan.env),
        workdir=req.plan.workdir,
        user=req.plan.user,
        python_prefix=python.prefix if python is not None and python.needs_bind else None,
    )


async def _replay(
    req: BuildRequest, sandbox: Sandbox, log: _Log, log_path: Path, deadline: float | None
) -> None:
    plan = req.plan
    total = len(plan.steps) + 1
    log.write(f"#1 [1/{total}] FROM {req.base.describe()}\n")
    for note in plan.notes:
        log.write(f"#1 note: {note}\n")
    if req.base.python is not None:
        py = req.base.python
        await _run(
            sandbox,
            log,
            log_path,
            argv=(py.executable, "-m", "venv", "/usr/local"),
            env=dict(req.base_env),
            workdir="/",
            user=None,
            label=f"FROM {plan.base} (Python {py.version} at /usr/local)",
            line=plan.base_line,
            deadline=deadline,
        )
    log.write("#1 DONE\n")
    for n, step in enumerate(plan.steps, start=2):
        started = time.monotonic()
        if isinstance(step, WorkdirStep):
            log.write(f"#{n} [{n}/{total}] WORKDIR {step.path}\n")
            make_dir(sandbox.resolve(step.path), req.userns_base)
        elif isinstance(step, CopyStep):
            log.write(f"#{n} [{n}/{total}] {step.text}\n")
            try:
                await asyncio.to_thread(copy_step, step, req.context, sandbox)
                if req.userns_base is not None:
                    # COPY writes as host root; --chown ids are shifted as well.
                    dest = sandbox.resolve(step.dest)
                    await asyncio.to_thread(shift_tree, dest, req.userns_base)
            except (OSError, LocalEnvironmentError) as exc:
                log.write(f"#{n} ERROR: {exc}\n")
                raise DockerfileBuildError(
                    f"Dockerfile:{step.line}: {step.text} failed: {exc}", log_path
                ) from exc
        else:
            log.write(f"#{n} [{n}/{total}] {step.text}\n")
            make_dir(sandbox.resolve(step.workdir), req.userns_base)
            await _run(
                sandbox,
                log,
                log_path,
                argv=step.argv,
                env={**req.base_env, **step.env},
                workdir=step.workdir,
                user=step.user,
                label=step.text,
                line=step.line,
                deadline=deadline,
            )
        log.write(f"#{n} DONE {time.monotonic() - started:.1f}s\n")


async def _run(
    sandbox: Sandbox,
    log: _Log,
    log_path: Path,
    *,
    argv: tuple[str, ...],
    env: dict[str, str],
    workdir: str,
    user: str | None,
    label: str,
    line: int,
    deadline: float | None,
) -> None:
    uid, gid, home = lookup_user(sandbox.root, user) if user else (0, 0, "/root")
    env = {"HOME": home, **env}

    async def sink(text: str, _stream: str) -> None:
        log.write(text)

    left = max(deadline - time.monotonic(), 0.001) if deadline is not None else None
    try:
        result = await sandbox.exec(
            argv, env=env, cwd=workdir, uid=uid, gid=gid, on_output=sink, timeout_sec=left
        )
    except ExecTimeoutError:
        log.write("ERROR: the build's time limit was reached\n")
        raise DockerfileBuildError(
            f"Dockerfile:{line}: {label[:200]} was stopped: the environment build exceeded "
            f"its time limit (build_timeout_sec in task.toml; full log: {log_path}). "
            f"Last lines of the build log:\n{log.tail()}",
            log_path,
        ) from None
    if result.return_code != 0:
        log.write(f"ERROR: exit code {result.return_code}\n")
        raise DockerfileBuildError(
            f"Dockerfile:{line}: {label[:200]} failed with exit code {result.return_code} "
            f"(the environment could not be built; full log: {log_path}). "
            f"Last lines of the build log:\n{log.tail()}",
            log_path,
        )


def _make_mountpoints(root_fs: Path, binds: list[Bind]) -> None:
    """Create bind targets in the layer, so trials need not create them each time."""
    for b in binds:
        target = root_fs / b.target.lstrip("/")
        if os.path.lexists(target):
            continue
        if b.source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
