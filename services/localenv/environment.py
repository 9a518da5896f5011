"""A Harbor environment that runs a task on this host inside a bubblewrap sandbox.

Selected in a manifest with ``compute.environment: local`` (or by its import path
``services.localenv.environment:LocalEnvironment``). It exists so trials run on a
machine with no Docker engine. It is for TRUSTED tasks only: the sandbox separates a
trial's files and processes from the host and from sibling trials, it is not a
security boundary against hostile code (see docs/local-environment.md).

Layout of one trial's sandbox (``<scratch>/<session_id>``)::

    rootfs/<top>/...   writable per-trial folders bound at /<top> (tmp, root, home,
                       tests, solution, logs, the task workdir, ...)

Host /usr, /etc and /var are bound read-only; /logs/agent, /logs/verifier and
/logs/artifacts are bound straight to Harbor's trial folders, so Harbor reads
rewards and logs without copying. Every exec gets its own PID namespace (stray
background processes die with it) and a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode

from services.localenv.dockerfile import workdir_from_dockerfile

BWRAP = "bwrap"
# Host folders visible read-only inside every sandbox.
_HOST_READ_ONLY = ("usr", "etc", "var")
# Host top-level symlinks (merged /usr on Debian) recreated inside the sandbox.
_HOST_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Writable per-trial folders created up front (others appear when first uploaded to).
_WRITABLE = ("tmp", "root", "home", "opt", "srv", "mnt", "run", "tests", "solution", "logs")
_RESERVED = {*_HOST_READ_ONLY, *_HOST_LINKS, "proc", "dev", "sys"}
_MAX_CAPTURE = 8 * 1024 * 1024
_DEFAULT_WORKDIR = "/app"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class LocalEnvironmentError(RuntimeError):
    """The sandbox could not be set up or used (an environment error, never the agent's)."""


class ExecTimeoutError(RuntimeError):
    """A command exceeded its timeout and was killed with its whole process tree."""


class LocalEnvironment(BaseEnvironment):  # type: ignore[misc]  # Harbor ships no types
    """Harbor BaseEnvironment over bubblewrap (``bwrap``) on the local host."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Instance state read by ``capabilities`` must exist before Harbor's __init__.
        self._keep_sandbox = bool(kwargs.pop("keep_sandbox", False))
        scratch = kwargs.pop("scratch_dir", None)
        self._scratch = Path(scratch or Path(tempfile.gettempdir()) / "trialbus-sandboxes")
        # Bind Harbor's log folders straight into the sandbox: no copies back and forth.
        kwargs.setdefault("auto_mounting", True)
        super().__init__(*args, **kwargs)
        self._root = self._scratch / f"{self.session_id}-{uuid.uuid4().hex[:8]}"
        self._rootfs = self._root / "rootfs"
        self._workdir = self._resolve_workdir()
        self._started = False

    # -- identity and capabilities -------------------------------------------------
    @staticmethod
    def type() -> str:
        return "trialbus-local"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, mounted=True)

    @classmethod
    def preflight(cls) -> None:
        if shutil.which(BWRAP) is None:
            raise SystemExit("the local environment needs bubblewrap: apt-get install bubblewrap")

    def _validate_definition(self) -> None:
        compose = [
            self.environment_dir / name
            for name in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml")
        ]
        found = [p for p in compose if p.exists()]
        if found:
            raise LocalEnvironmentError(
                f"{found[0]}: multi-container (docker compose) tasks cannot run in the "
                "local environment; use compute.environment: docker on a Docker host"
            )

    def _resolve_workdir(self) -> str:
        if self.task_env_config.workdir:
            return str(self.task_env_config.workdir)
        dockerfile = self.environment_dir / "Dockerfile"
        if dockerfile.is_file():
            return workdir_from_dockerfile(dockerfile.read_text()) or _DEFAULT_WORKDIR
        return _DEFAULT_WORKDIR

    @property
    def _network_disabled_now(self) -> bool:
        return bool(self._network_policy.network_mode == NetworkMode.NO_NETWORK)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, force_build: bool) -> None:
        if shutil.which(BWRAP) is None:
            raise LocalEnvironmentError(
                "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
            )
        for top in (*_WRITABLE, self._top_of(self._workdir)):
            (self._rootfs / top).mkdir(parents=True, exist_ok=True)
        self._host_path(self._workdir).mkdir(parents=True, exist_ok=True)
        for mount in self._mounts:
            if mount["type"] == "bind":
                Path(mount["source"]).mkdir(parents=True, exist_ok=True)
        self._started = True
        probe = await self.exec("true", timeout_sec=30)
        if probe.return_code != 0:
            raise LocalEnvironmentError(
                f"bubblewrap sandbox failed to start (exit {probe.return_code}): "
                f"{(probe.stderr or '').strip()[:500]}"
            )

    async def stop(self, delete: bool) -> None:
        self._started = False
        if delete and not self._keep_sandbox:
            await asyncio.to_thread(shutil.rmtree, self._root, True)

    # -- path mapping ------------------------------------------------------------------
    @staticmethod
    def _top_of(path: str) -> str:
        parts = PurePosixPath(path).parts
        if len(parts) < 2 or parts[0] != "/":
            raise LocalEnvironmentError(f"sandbox path {path!r} must be absolute")
        return parts[1]

    def _host_path(self, sandbox_path: str, *, for_write: bool = True) -> Path:
        """Host location backing ``sandbox_path``."""
        path = PurePosixPath(sandbox_path)
        if ".." in path.parts:
            raise LocalEnvironmentError(f"sandbox path {sandbox_path!r} may not contain '..'")
        # Bind mounts (Harbor's log folders), longest target first.
        binds = sorted(
            (m for m in self._mounts if m["type"] == "bind"),
            key=lambda m: len(PurePosixPath(m["target"]).parts),
            reverse=True,
        )
        for m in binds:
            target = PurePosixPath(m["target"])
            if path == target or path.is_relative_to(target):
                return Path(m["source"]).joinpath(*path.relative_to(target).parts)
        top = self._top_of(sandbox_path)
        if top in _RESERVED:
            if for_write:
                raise LocalEnvironmentError(
                    f"cannot write {sandbox_path!r}: /{top} is the host's, read-only in "
                    "the local environment"
                )
            return Path(sandbox_path)
        return self._rootfs.joinpath(*path.parts[1:])

    # -- file transfer -----------------------------------------------------------------
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        dest = self._host_path(target_path)
        await asyncio.to_thread(_copy_file, Path(source_path), dest)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        dest = self._host_path(target_dir)
        await asyncio.to_thread(shutil.copytree, Path(source_dir), dest, dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        src = self._host_path(source_path, for_write=False)
        await asyncio.to_thread(_copy_file, src, Path(target_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        src = self._host_path(source_dir, for_write=False)
        if not src.is_dir():
            raise FileNotFoundError(f"{source_dir} does not exist in the sandbox")
        await asyncio.to_thread(shutil.copytree, src, Path(target_dir), dirs_exist_ok=True)

    # -- exec --------------------------------------------------------------------------
    def _bwrap_args(self, cwd: str, env: dict[str, str], uid: int) -> list[str]:
        args = [
            BWRAP,
            "--die-with-parent",
            "--new-session",
            "--unshare-user",
            "--uid",
            str(uid),
            "--gid",
            str(uid),
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "trial",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
        ]
        if self._network_disabled_now:
            args.append("--unshare-net")
        for top in _HOST_READ_ONLY:
            if Path(f"/{top}").exists():
                args += ["--ro-bind", f"/{top}", f"/{top}"]
        for link in _HOST_LINKS:
            host = Path(f"/{link}")
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{link}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{link}"]
        for entry in sorted(self._rootfs.iterdir()):
            if entry.is_dir() and entry.name not in _RESERVED:
                args += ["--bind", str(entry), f"/{entry.name}"]
        for m in sorted(self._mounts, key=lambda m: len(PurePosixPath(m["target"]).parts)):
            if m["type"] == "bind":
                flag = "--ro-bind" if m.get("read_only") else "--bind"
                args += [flag, str(m["source"]), str(m["target"])]
        args += ["--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
        args += ["--chdir", cwd]
        return args

    def _uid_for(self, user: str | int | None) -> int:
        resolved = self._resolve_user(user)
        if resolved is None or resolved in ("root", 0, "0"):
            return 0
        if isinstance(resolved, int) or str(resolved).isdigit():
            return int(resolved)
        # Named users need an /etc/passwd entry the host may not have; run as root.
        self.logger.debug("local environment runs user %r as root", resolved)
        return 0

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if not self._started:
            raise LocalEnvironmentError("exec before start() or after stop()")
        full_env = {
            "PATH": _PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TERM": "xterm",
            **(self._merge_env(env) or {}),
        }
        workdir = cwd or self._workdir
        with contextlib.suppress(LocalEnvironmentError):
            self._host_path(workdir).mkdir(parents=True, exist_ok=True)
        args = [*self._bwrap_args(workdir, full_env, self._uid_for(user)), "bash", "-c", command]
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        callback = self._output_callback()
        out: list[str] = []
        err: list[str] = []

        async def pump(stream: asyncio.StreamReader | None, sink: list[str], name: str) -> None:
            if stream is None:
                return
            size = 0
            while chunk := await stream.readline():
                text = chunk.decode(errors="replace")
                if size < _MAX_CAPTURE:
                    sink.append(text)
                    size += len(text)
                    if size >= _MAX_CAPTURE:
                        sink.append("\n[trialbus: output truncated]\n")
                if callback is not None:
                    await callback(text, "stdout" if name == "stdout" else "stderr")

        async def run() -> int:
            await asyncio.gather(pump(proc.stdout, out, "stdout"), pump(proc.stderr, err, "stderr"))
            return await proc.wait()

        try:
            if timeout_sec:
                code = await asyncio.wait_for(run(), timeout=timeout_sec)
            else:
                code = await run()
        except TimeoutError:
            await _kill_tree(proc)
            raise ExecTimeoutError(f"Command timed out after {timeout_sec} seconds") from None
        except BaseException:
            await _kill_tree(proc)
            raise
        return ExecResult(
            stdout="".join(out) or None, stderr="".join(err) or None, return_code=code
        )


def _copy_file(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)


async def _kill_tree(proc: asyncio.subprocess.Process) -> None:
    """Kill bwrap's session; its PID namespace takes every descendant with it."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()
