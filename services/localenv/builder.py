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

Every step is written to the build log (``#N`` headers, output, duration).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from services.localenv.dockerfile import BuildPlan, CopyStep, WorkdirStep
from services.localenv.errors import DockerfileBuildError, LocalEnvironmentError
from services.localenv.images import BaseImage
from services.localenv.layers import FS_TOPS, HOST_TOPS, ImageConfig
from services.localenv.masks import mask_host_secrets
from services.localenv.sandbox import Bind, Overlay, Sandbox, SandboxSpec
from services.localenv.tools import seed_home
from services.localenv.users import lookup_group, lookup_user

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


class _Log:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self._stream.write(text)
        self._stream.flush()
        self.lines.extend(text.splitlines())

    def tail(self) -> str:
        return "\n".join(self.lines[-_TAIL_LINES:])


async def build_layer(req: BuildRequest, dest: Path, logger: logging.Logger) -> ImageConfig:
    """Build the layer into ``dest`` (a new folder); returns the image configuration."""
    fs = dest / "fs"
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
    overlays = [Overlay("/", (req.empty_dir,), fs / "root", dest / "work" / "root")]
    overlays += [
        Overlay(f"/{top}", (Path(f"/{top}"),), fs / top, dest / "work" / top) for top in HOST_TOPS
    ]
    etc = fs / "etc"
    # Before any step runs: a RUN step must not read the host's secrets either.
    masked = mask_host_secrets(fs)
    (etc / "resolv.conf").write_text("nameserver 10.0.2.3\n")
    (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n")
    spec = SandboxSpec(
        state_dir=dest / "state",
        overlays=overlays,
        binds=binds,
        network=req.network,
        helpers_root=dest.parent / ".exec-helpers",
    )
    sandbox = Sandbox(spec, logger)
    log_path = dest / "build.log"
    with log_path.open("w") as stream:
        log = _Log(stream)
        log.write(f"#0 host secrets masked: {', '.join(masked) or 'none found'}\n")
        await sandbox.start()
        try:
            await _replay(req, sandbox, log, log_path)
        finally:
            await sandbox.stop()
    for name in RUNTIME_ETC_FILES:
        (etc / name).unlink(missing_ok=True)
    for scratch in ("work", "state"):
        shutil.rmtree(dest / scratch, ignore_errors=True)
    python = req.base.python
    return ImageConfig(
        base=req.plan.base,
        base_description=req.base.describe(),
        env=dict(req.plan.env),
        workdir=req.plan.workdir,
        user=req.plan.user,
        python_prefix=python.prefix if python is not None and python.needs_bind else None,
    )


async def _replay(req: BuildRequest, sandbox: Sandbox, log: _Log, log_path: Path) -> None:
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
        )
    log.write("#1 DONE\n")
    for n, step in enumerate(plan.steps, start=2):
        started = time.monotonic()
        if isinstance(step, WorkdirStep):
            log.write(f"#{n} [{n}/{total}] WORKDIR {step.path}\n")
            sandbox.resolve(step.path).mkdir(parents=True, exist_ok=True)
        elif isinstance(step, CopyStep):
            log.write(f"#{n} [{n}/{total}] {step.text}\n")
            try:
                await asyncio.to_thread(_copy, step, req.context, sandbox)
            except (OSError, LocalEnvironmentError) as exc:
                log.write(f"#{n} ERROR: {exc}\n")
                raise DockerfileBuildError(
                    f"Dockerfile:{step.line}: {step.text} failed: {exc}", log_path
                ) from exc
        else:
            log.write(f"#{n} [{n}/{total}] {step.text}\n")
            sandbox.resolve(step.workdir).mkdir(parents=True, exist_ok=True)
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
) -> None:
    uid, gid, home = lookup_user(sandbox.root, user) if user else (0, 0, "/root")
    env = {"HOME": home, **env}

    async def sink(text: str, _stream: str) -> None:
        log.write(text)

    result = await sandbox.exec(argv, env=env, cwd=workdir, uid=uid, gid=gid, on_output=sink)
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


def _copy(step: CopyStep, context: Path, sandbox: Sandbox) -> None:
    owner = _owner(step.chown, sandbox.root) if step.chown else None
    mode = int(step.chmod, 8) if step.chmod else None
    written: list[Path] = []
    if step.content is not None:
        dest = sandbox.resolve(step.dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(step.content)
        written.append(dest)
    else:
        ctx = context.resolve()
        for pattern in step.sources:
            matches = (
                sorted(ctx.glob(pattern.lstrip("/"))) if any(c in pattern for c in "*?[") else []
            )
            if not matches:
                src = (ctx / pattern.lstrip("/")).resolve()
                if not src.is_relative_to(ctx):
                    raise LocalEnvironmentError(f"{pattern} is outside the build context")
                if not src.exists():
                    raise LocalEnvironmentError(f"{pattern}: not found in the build context {ctx}")
                matches = [src]
            for src in matches:
                written += _copy_one(src, step, sandbox)
    for path in written:
        for p in [path, *(path.rglob("*") if path.is_dir() and not path.is_symlink() else [])]:
            if owner is not None:
                os.lchown(p, *owner)
            if mode is not None and not p.is_symlink():
                p.chmod(mode)


def _copy_one(src: Path, step: CopyStep, sandbox: Sandbox) -> list[Path]:
    dest = sandbox.resolve(step.dest)
    if step.add and src.is_file() and tarfile.is_tarfile(src):
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(src) as tar:
            tar.extractall(dest, filter="tar")
        return [dest]
    if src.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
        return [dest / child.name for child in src.iterdir()]
    if step.dest_is_dir or dest.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        dest = dest / src.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest, follow_symlinks=False)
    return [dest]


def _owner(chown: str, root: Path) -> tuple[int, int]:
    user, _, group = chown.partition(":")
    uid, gid, _ = lookup_user(root, user)
    if group:
        gid = lookup_group(root, group)
    return uid, gid
