"""One long-lived bubblewrap sandbox: namespaces, overlays, network, exec and teardown.

How a sandbox comes up (``Sandbox.start``)::

    runner ── sh (joins the trial's cgroup) ── unshare --user --mount
                 │   the runner writes the user namespace's uid/gid map (identity
                 │   map as root), then the helper mounts one overlayfs per entry of
                 │   ``spec.overlays`` (lower: cached layer + host folder, upper: the
                 │   trial's own folder) and execs
                 └─ bwrap --unshare-pid/net/ipc/uts  (root = the "/" overlay,
                      /usr /etc /var = their overlays, binds, fresh /proc and /dev)
                      └─ pid 1 (bwrap's reaper) ── sleep infinity

With ``spec.userns_base`` (opt-in, ``shift``) root inside is that unprivileged host
uid instead: host root first mounts the overlays (over idmapped views of the host
folders) in a private mount namespace, then drops to the uid before ``unshare --user``.

Each ``exec`` joins that sandbox's namespaces with ``nsenter`` (so processes survive
between commands, as in ``docker exec``) as the requested user, with Docker's
default capability set and a clean environment. /proc/sys and the other kernel
knobs Docker protects are read-only inside. A seccomp filter (``seccomp``) refuses the
system calls no task needs, in pid 1 (bwrap's ``--seccomp``) and in every command.
``stop`` kills the sandbox's pid 1: the kernel then kills every process of its pid
namespace (stray background processes included), the mount namespace and its
overlays disappear with the last process, and the trial's folders can be removed.

Network: every sandbox has its own network namespace, so servers on fixed ports
never collide. With ``network=True`` a ``slirp4netns`` process gives it a user-mode
NAT to the outside (the host's loopback stays unreachable); otherwise only ``lo``.

Files are read and written from the host through ``/proc/<pid>/root`` (the
sandbox's own view, overlays included), resolving symbolic links inside the
sandbox so a link can never point a transfer at a host file.

What runs with privilege while entering is fixed by the host, never by the trial
(``entry``): absolute host helpers with a clean environment, and ``setpriv`` with its
loader and libraries from a read-only folder bound at ``/.trialbus-exec``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from services.localenv.entry import (
    HELPER_ENV,
    HELPERS_TARGET,
    PRELOAD_FILE,
    ExecHelpers,
    env_loader,
    env_memfd,
    host_tool,
    prepare_helpers,
)
from services.localenv.errors import ExecTimeoutError, LocalEnvironmentError, SandboxStartError
from services.localenv.procs import (
    HelperPipes,
    OutputCapture,
    OutputSink,
    exit_code,
    kill_group,
    read_until,
    spawn,
)
from services.localenv.seccomp import installer, program_memfd
from services.localenv.shift import SHIFT_COUNT, STAGING, Staging, shift_owner
from services.localenv.spec import (
    BWRAP,
    DOCKER_CAPS,
    FORBIDDEN_IN_PATHS,
    HOST_LINKS,
    READ_ONLY_PROC,
    SLIRP4NETNS,
    Bind,
    ExecOutcome,
    SandboxSpec,
    fstab_escape,
    hidden_targets,
    missing_host_tools,
    resolve_in_root,
)

# Re-exported: the tests and older callers import these from here.
__all__ = ["ExecOutcome", "Sandbox", "missing_host_tools", "resolve_in_root"]

_START_TIMEOUT_S = 30.0
_DRAIN_GRACE_S = 0.5


class Sandbox:
    """A running sandbox built from a ``SandboxSpec`` (see the module docstring)."""

    def __init__(self, spec: SandboxSpec, logger: logging.Logger) -> None:
        for ov in spec.overlays:
            for p in (*ov.lowers, ov.upper, ov.work):
                if any(ch in str(p) for ch in FORBIDDEN_IN_PATHS):
                    raise LocalEnvironmentError(f"overlay path {p} may not contain ':' or ','")
        self.spec = spec
        self._logger = logger
        self._proc: asyncio.subprocess.Process | None = None
        self._slirp: asyncio.subprocess.Process | None = None
        self._slirp_exit_w: int | None = None
        self._pid: int | None = None
        self._execs: set[asyncio.subprocess.Process] = set()
        self._drains: set[asyncio.Task[None]] = set()
        self._helpers: ExecHelpers | None = None

    @property
    def running(self) -> bool:
        return self._pid is not None

    @property
    def pid(self) -> int:
        """The sandbox's pid 1, seen from the host (its namespaces are under /proc)."""
        if self._pid is None:
            raise LocalEnvironmentError("the sandbox is not running")
        return self._pid

    @property
    def root(self) -> Path:
        """The sandbox's root file system, seen from the host."""
        if self._pid is None:
            raise LocalEnvironmentError("the sandbox is not running")
        return Path(f"/proc/{self._pid}/root")

    def resolve(self, path: str) -> Path:
        """Host path through which sandbox ``path`` is read or written."""
        return resolve_in_root(self.root, path)

    # -- start ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Bring the sandbox up; raises SandboxStartError with the helper's stderr."""
        spec = self.spec
        spec.state_dir.mkdir(parents=True, exist_ok=True)
        mounts = spec.state_dir / "mnt"
        for i, ov in enumerate(spec.overlays):
            for d in (ov.upper, ov.work, mounts / str(i)):
                d.mkdir(parents=True, exist_ok=True)
            if spec.userns_base is not None:
                for d in (ov.upper, ov.work):
                    shift_owner(d, spec.userns_base)
        if spec.userns_base is not None:
            STAGING.mkdir(mode=0o755, parents=True, exist_ok=True)
        log_path = spec.state_dir / "sandbox.log"
        self._helpers = await asyncio.to_thread(
            prepare_helpers, spec.helpers_root or spec.state_dir / "helpers"
        )
        # bwrap reads the filter (services.localenv.seccomp) from this inherited fd.
        seccomp_fd = program_memfd() if spec.seccomp else None
        pipes = HelperPipes()
        if spec.userns_base is not None:
            # The helper reopens its pipe ends by /dev/fd path once it is the shifted uid.
            for fd in pipes.child_fds:
                os.fchown(fd, spec.userns_base, spec.userns_base)
        try:
            with log_path.open("ab") as log:
                self._proc = await spawn(
                    *self._launch_argv(pipes, mounts, seccomp_fd),
                    env=dict(HELPER_ENV),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(*pipes.child_fds, *([seccomp_fd] if seccomp_fd is not None else [])),
                )
            pipes.close_child_ends()
            await asyncio.to_thread(pipes.read, pipes.ready_r, b"\n", _START_TIMEOUT_S)
            self._write_id_maps(self._proc.pid)
            os.write(pipes.go_w, b"go\n")
            info = await asyncio.to_thread(pipes.read, pipes.info_r, b"}", _START_TIMEOUT_S)
            await asyncio.to_thread(pipes.read, pipes.up_r, b"\n", _START_TIMEOUT_S)
            self._pid = int(json.loads(info)["child-pid"])
            if spec.network:
                await self._start_network()
        except (OSError, ValueError, KeyError, TimeoutError) as exc:
            await self.stop()
            tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
            raise SandboxStartError(f"sandbox failed to start: {exc}\n{tail}".strip()) from exc
        except BaseException:
            await self.stop()
            raise
        finally:
            pipes.close_all()
            if seccomp_fd is not None:
                os.close(seccomp_fd)

    def _launch_argv(self, pipes: HelperPipes, mounts: Path, seccomp_fd: int | None) -> list[str]:
        spec = self.spec
        # One mount(8) for all overlays (an fstab of our own): each exec costs here.
        fstab = spec.state_dir / "fstab"
        # Shifted: host root mounts everything where the dropped uid can reach it.
        staging = Staging(spec.userns_base) if spec.userns_base is not None else None
        targets: list[str] = []
        lines = []
        for i, ov in enumerate(spec.overlays):
            lower_paths = [str(p) for p in ov.lowers]
            target = str(mounts / str(i))
            if staging is not None:
                lower_paths = [
                    staging.view(p) if p == Path(ov.target) and ov.target != "/" else str(p)
                    for p in ov.lowers
                ]
                target = staging.mountpoint()
            targets.append(target)
            lowers = ":".join(lower_paths)
            opts = f"lowerdir={lowers},upperdir={ov.upper},workdir={ov.work},userxattr"
            lines.append(f"overlay {fstab_escape(target)} overlay {fstab_escape(opts)} 0 0\n")
        fstab.write_text("".join(lines))

        def source(path: Path) -> str:
            return staging.source(path) if staging is not None else str(path)

        bwrap = [
            host_tool(BWRAP),
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--unshare-cgroup-try",
            "--hostname",
            spec.hostname,
            "--cap-drop",
            "ALL",
        ]
        for target, ov in zip(targets, spec.overlays, strict=True):
            bwrap += ["--bind", target, ov.target]
        root = spec.overlays[0]
        for link in HOST_LINKS:
            host = Path(f"/{link}")
            present = any(os.path.lexists(d / link) for d in (*root.lowers, root.upper))
            if host.is_symlink() and not present:
                bwrap += ["--symlink", os.readlink(host), f"/{link}"]
        bwrap += ["--proc", "/proc", "--dev", "/dev"]
        for name in READ_ONLY_PROC:
            if os.path.exists(f"/proc/{name}"):
                bwrap += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
        helpers = self._helpers
        assert helpers is not None, "prepared in start()"
        binds = [
            *spec.binds,
            Bind(helpers.host_dir, HELPERS_TARGET, read_only=True),
            Bind(helpers.empty_file, PRELOAD_FILE, read_only=True),
        ]
        # The runner's own files (credentials, data, other trials' folders) are covered
        # where they would show: an empty read-only tmpfs over a folder, the empty file
        # over a file. Without CAP_SYS_ADMIN the trial cannot unmount them.
        hidden = hidden_targets(spec)
        for target, is_dir in hidden:
            if is_dir:
                bwrap += ["--tmpfs", target]
            else:
                bwrap += ["--ro-bind", source(helpers.empty_file), target]
        unique = {b.target: b for b in binds}.values()  # the last bind per target wins
        for b in sorted(unique, key=lambda b: len(PurePosixPath(b.target).parts)):
            bwrap += ["--ro-bind" if b.read_only else "--bind", source(b.source), b.target]
        # Read-only once the binds inside them (if any) have their mount points.
        bwrap += [a for target, is_dir in hidden if is_dir for a in ("--remount-ro", target)]
        bwrap += ["--chdir", "/", "--info-fd", str(pipes.info_w)]
        if seccomp_fd is not None:
            bwrap += ["--seccomp", str(seccomp_fd)]
        # dash (fast to start) writes to the pipes by /dev/fd path: its redirections only
        # take one-digit descriptors. Inherited pipe ends stay open, which is harmless.
        init = f"echo up >/dev/fd/{pipes.up_w}; exec sleep infinity </dev/null >/dev/null 2>&1"
        bwrap += ["--", "/bin/sh", "-c", init]
        # Stage 2 runs once the id map is written: a fresh exec gives root's capabilities.
        mount = shlex.join([host_tool("mount"), "-n", "-a", "-T", str(fstab)])
        # Shifted: the overlays are already mounted (by host root, in stage 0).
        stage2 = f"set -e\n{mount if staging is None else ':'}\nexec {shlex.join(bwrap)}"
        stage1 = (
            f"echo >/dev/fd/{pipes.ready_w}; read -r _ </dev/fd/{pipes.go_r}; "
            f"exec /bin/sh -c {shlex.quote(stage2)}"
        )
        argv = [
            host_tool("unshare"),
            "--user",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            stage1,
        ]
        if staging is not None:
            stage0 = staging.script(fstab, argv)
            private = [host_tool("unshare"), "--mount", "--propagation", "private"]
            argv = [*private, "/bin/sh", "-c", stage0]
        if spec.cgroup is not None:
            argv = [*spec.cgroup.join_command(), *argv]
        return argv

    def _write_id_maps(self, pid: int) -> None:
        uid, gid = os.geteuid(), os.getegid()
        base = self.spec.userns_base
        if base is not None:
            # Root inside is host uid ``base`` (``shift``): host root's files are not its.
            Path(f"/proc/{pid}/uid_map").write_text(f"0 {base} {SHIFT_COUNT}\n")
            Path(f"/proc/{pid}/gid_map").write_text(f"0 {base} {SHIFT_COUNT}\n")
            return
        if uid == 0:
            # Identity map: uids inside are the host's (apt's _apt, useradd, chown work),
            # yet root inside holds capabilities only over the sandbox's own namespaces.
            Path(f"/proc/{pid}/uid_map").write_text("0 0 4294967295\n")
            Path(f"/proc/{pid}/gid_map").write_text("0 0 4294967295\n")
            return
        Path(f"/proc/{pid}/setgroups").write_text("deny\n")
        Path(f"/proc/{pid}/uid_map").write_text(f"0 {uid} 1\n")
        Path(f"/proc/{pid}/gid_map").write_text(f"0 {gid} 1\n")

    async def _start_network(self) -> None:
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        try:
            self._slirp = await spawn(
                host_tool(SLIRP4NETNS),
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                f"--ready-fd={ready_w}",
                f"--exit-fd={exit_r}",
                str(self._pid),
                "tap0",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                pass_fds=(ready_w, exit_r),
                env=dict(HELPER_ENV),
            )
            os.close(ready_w)
            ready_w = -1
            self._slirp_exit_w = exit_w
            await asyncio.to_thread(read_until, ready_r, b"1", _START_TIMEOUT_S)
        finally:
            for fd in (ready_r, ready_w, exit_r):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    async def _stop_network(self) -> None:
        """End the slirp4netns process: its tap device, the sandbox's only way out, goes
        with it (open connections fail; ``lo`` stays)."""
        if self._slirp_exit_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._slirp_exit_w)
            self._slirp_exit_w = None
        if self._slirp is not None:
            if self._slirp.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self._slirp.kill()
            await self._slirp.wait()
            self._slirp = None

    async def set_network(self, enabled: bool) -> None:
        """Give the running sandbox the outside network, or take it away (Harbor's
        phase network policies: e.g. a public setup, an agent with no network, a
        verifier that downloads its test tools)."""
        if self._pid is None:
            raise LocalEnvironmentError("the sandbox is not running: no network to change")
        if enabled and self._slirp is None:
            try:
                await self._start_network()
            except (OSError, TimeoutError) as exc:
                await self._stop_network()
                raise SandboxStartError(f"the sandbox's network did not come up: {exc}") from exc
        elif not enabled and self._slirp is not None:
            await self._stop_network()

    # -- exec ----------------------------------------------------------------------------
    def exec_argv(
        self, argv: Sequence[str], *, cwd: str, uid: int, gid: int, env_fd: int
    ) -> list[str]:
        """The host command that runs ``argv`` inside the sandbox.

        ``nsenter`` joins the sandbox's namespaces, root directory and working folder
        as the user, ``setpriv`` (from the read-only helpers) bounds the capabilities
        to Docker's default set, then the trial's bash exports the environment read
        from ``env_fd`` and execs ``argv`` (see ``entry``).
        """
        if self._pid is None or self._helpers is None:
            raise LocalEnvironmentError("exec on a sandbox that is not running")
        spec = self.spec
        out = list(spec.cgroup.join_command()) if spec.cgroup is not None else []
        out += [host_tool("nsenter"), "-t", str(self._pid), "-U", "-m", "-p", "-n", "-u", "-i"]
        out += ["--root", f"--wdns={cwd}", "-S", str(uid), "-G", str(gid), "--"]
        if uid == 0 and os.geteuid() == 0:
            # Joining a user namespace grants every capability in it (setns resets the
            # bounding set), so the bound is applied inside, by the sandbox's setpriv.
            # (Other users hold no capabilities; as non-root runner, root is not uid 0.)
            caps = ",".join(f"+{c}" for c in DOCKER_CAPS)
            out += [*self._helpers.privileged("setpriv"), f"--bounding-set=-all,{caps}", "--"]
        # Run after the bound: the trial's own prlimit and bash may be anything.
        rlimits = []
        if spec.memory_rlimit_mb is not None:
            rlimits.append(f"--data={spec.memory_rlimit_mb * 1024 * 1024}")
        if spec.pids_rlimit is not None:
            rlimits.append(f"--nproc={spec.pids_rlimit}")
        if rlimits:
            out += ["prlimit", *rlimits, "--"]
        return [*out, *env_loader(env_fd), *argv]

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str,
        uid: int = 0,
        gid: int = 0,
        timeout_sec: float | None = None,
        on_output: OutputSink | None = None,
    ) -> ExecOutcome:
        """Run ``argv`` in the sandbox; on timeout kill its process group and raise."""
        env_fd = env_memfd(env)
        try:
            proc = await spawn(
                *self.exec_argv(argv, cwd=cwd, uid=uid, gid=gid, env_fd=env_fd),
                env=dict(HELPER_ENV),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                pass_fds=(env_fd,),
                # Commands enter through nsenter, not as bwrap's descendants: the
                # seccomp filter goes on here, before nsenter runs.
                preexec_fn=installer() if self.spec.seccomp else None,
            )
        finally:
            os.close(env_fd)
        self._execs.add(proc)
        out, err = OutputCapture(on_output), OutputCapture(on_output)
        pumps = [
            asyncio.create_task(out.pump(proc.stdout, "stdout")),
            asyncio.create_task(err.pump(proc.stderr, "stderr")),
        ]

        async def finish() -> int:
            code = await exit_code(proc)
            # A background process may keep the pipes open: take what is there, no more.
            await asyncio.wait(pumps, timeout=_DRAIN_GRACE_S)
            return code

        try:
            code = (
                await asyncio.wait_for(finish(), timeout=timeout_sec)
                if timeout_sec
                else await finish()
            )
        except TimeoutError:
            await kill_group(proc)
            for task in pumps:
                task.cancel()
            raise ExecTimeoutError(f"Command timed out after {timeout_sec} seconds") from None
        except BaseException:
            await kill_group(proc)
            for task in pumps:
                task.cancel()
            raise
        finally:
            self._execs.discard(proc)
        # Keep reading (and dropping) what background processes still write, so that
        # they never block on a full pipe; the reads end with the sandbox.
        for capture, task in ((out, pumps[0]), (err, pumps[1])):
            capture.detached = True
            if not task.done():
                self._drains.add(task)
                task.add_done_callback(self._drains.discard)
        return ExecOutcome(out.text(), err.text(), code)

    # -- stop ----------------------------------------------------------------------------
    async def stop(self) -> None:
        """Kill every process of the sandbox and its helpers; idempotent."""
        pid, self._pid = self._pid, None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # pid 1 of the namespace: all of it dies
        for proc in list(self._execs):
            await kill_group(proc)
        for task in list(self._drains):
            task.cancel()
        if self._proc is not None:
            if self._proc.returncode is None:
                try:
                    await asyncio.wait_for(self._proc.wait(), timeout=5)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        self._proc.kill()
                    await self._proc.wait()
            self._proc = None
        await self._stop_network()
        if self.spec.cgroup is not None:
            await asyncio.to_thread(self.spec.cgroup.remove)
