"""One host of tests/support/netns.py: its pid 1, and the processes started in it.

A host's pid 1 (``_KEEPER``, started by ``Host.boot``) runs in the host's network
namespace and in new pid, mount and UTS namespaces: it mounts a tmpfs over each
private folder, binds the read-only folders, sets the hostname, then only reaps
orphans. ``Host.spawn`` enters those namespaces with ``nsenter``, so every process of
a host sees the same private disk, and SIGKILL to pid 1 ends them all (the kernel
kills a pid namespace with its init): that is ``Host.kill``, "the host dies".

The network side (bridge, veths, addresses, cleanup) is in tests/support/netns.py,
which re-exports this module's public names: its ``__all__`` is the one list of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from infra.managed_process import die_with_parent_hook

HOST_DATA_DIR = "/srv/trialbus-host"
"""A data folder at the same path on every host, different contents on each."""
PRIVATE_DIRS = ("/tmp", "/dev/shm", HOST_DATA_DIR)
"""Folders each host gets its own empty tmpfs over, by default.

None is under /usr, /etc or /var: the local sandbox overlays those host folders from a
user namespace, and the kernel refuses an overlay lower folder with a mount inside it
("failed to clone lowerpath"), so a tmpfs on /var/tmp would break every trial.
"""
REPO = str(Path(__file__).resolve().parents[2])
"""The checkout, bound read-only inside every host by default."""
BOOT_TIMEOUT = 10.0
KILL_TIMEOUT = 10.0

# pid 1 of a host: mounts its disk, names it, says "ready", then reaps orphans (a pid 1
# that never waits would collect zombies) until the host is killed.
_KEEPER = r"""
import ctypes, json, os, socket, subprocess, sys, time
cfg = json.loads(sys.argv[1])
# Held open before the private tmpfs mounts: a read-only folder may lie under one (a
# checkout in /tmp, as a fresh clone is), and is then bound back from the held fd.
held = {d: os.open(d, os.O_PATH | os.O_DIRECTORY) for d in cfg["readonly"]}
for d in cfg["private"]:
    os.makedirs(d, exist_ok=True)
    mode = "1777" if d in ("/tmp", "/dev/shm") else "0755"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=" + mode, cfg["name"], d], check=True)
# mount(2) itself: the mount command canonicalizes /proc/self/fd/N into the path it
# named, which the tmpfs now covers.
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
for d, fd in held.items():
    os.makedirs(d, exist_ok=True)
    src = ("/proc/self/fd/%d" % fd).encode()
    for source, flags in ((src, MS_BIND), (None, MS_REMOUNT | MS_BIND | MS_RDONLY)):
        if libc.mount(source, d.encode(), None, flags, None) != 0:
            raise OSError(ctypes.get_errno(), "bind of %s failed" % d)
    os.close(fd)
for d in cfg["hidden"]:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,mode=0555", "hidden", d], check=True)
socket.sethostname(cfg["name"])
print("ready", flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(1)
"""


class HostError(RuntimeError):
    """A host could not be created, booted, spawned into or removed; says which and why."""


class HostDownError(HostError):
    """``spawn`` on a host that was killed (``Host.boot()`` brings it back, disk wiped)."""


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS`` (iproute2); its stdout. Raises HostError quoting ip's message."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise HostError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


def netns_pids(name: str) -> list[int]:
    """Pids of the processes in network namespace ``name`` (none when it is gone)."""
    return [int(p) for p in ip("netns", "pids", name, check=False).split()]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def signal_pid(pid: int | None, sig: signal.Signals) -> None:
    """Send ``sig`` to ``pid`` unless it is None or already gone."""
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class HostProcess:
    """A process running inside a host, seen from the hub.

    ``pid`` is the process's own pid (in the root pid namespace), not its launcher's;
    ``wait``/``poll`` give its exit status (negative: killed by that signal, as in
    ``subprocess``); its output is in ``stdout_path`` and ``stderr_path``.
    """

    def __init__(
        self, launcher: subprocess.Popen[bytes], argv: Sequence[str], stdout: Path, stderr: Path
    ) -> None:
        self._launcher = launcher
        self.argv = list(argv)
        self.stdout_path = stdout
        self.stderr_path = stderr
        self.pid = self._find_pid()

    def _find_pid(self) -> int:
        # nsenter forks to enter the pid namespace; the process is its only child.
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            children = _children(self._launcher.pid)
            if children:
                return children[0]
            if self._launcher.poll() is not None:
                return self._launcher.pid  # already over: its status is the launcher's
            time.sleep(0.005)  # polling interval for the fork to happen
        raise HostError(f"{self.argv[0]}: no process appeared under nsenter {self._launcher.pid}")

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self._launcher.poll() is None

    def poll(self) -> int | None:
        """Exit status once it has exited, else None."""
        return self._launcher.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status (``subprocess.TimeoutExpired`` after ``timeout`` s)."""
        return self._launcher.wait(timeout)

    def send_signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process itself (a no-op once it has exited)."""
        if self.running:
            signal_pid(self.pid, sig)

    def terminate(self) -> None:
        """SIGTERM the process."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the process."""
        self.send_signal(signal.SIGKILL)

    def output(self) -> str:
        """Stdout and stderr so far, labelled, for assertion messages."""
        out = self.stdout_path.read_text(errors="replace")
        err = self.stderr_path.read_text(errors="replace")
        return f"$ {' '.join(self.argv)}\n--- stdout\n{out}--- stderr\n{err}"


@dataclass(eq=False, repr=False)
class Host:
    """One host: its network, disk, processes and hostname (see the module docstring).

    Made by ``Hosts.start``, which passes the folders every host shares the settings of.
    """

    name: str
    """Network namespace name and hostname, unique to the run (``tbh-<token>-<i>``)."""
    index: int
    """Position in ``Hosts``."""
    address: str
    """The host's own address on the bridge."""
    hub_address: str
    """The bridge address, where the hub's servers listen."""
    _: KW_ONLY
    private_dirs: tuple[str, ...]
    """Every folder this host has its own tmpfs over."""
    readonly: tuple[str, ...]
    """Folders bound read-only inside the host (the repository)."""
    hidden: tuple[str, ...] = ()
    """Existing folders that look empty (and read-only) inside the host."""
    log_dir: Path
    """Where the host's pid 1 and its processes write their output."""
    data_dir: Path = field(default=Path(HOST_DATA_DIR), init=False)
    """``HOST_DATA_DIR``, private to this host (a tmpfs)."""
    _keeper: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _pid1: int | None = field(default=None, init=False)
    _launchers: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False)
    _spawned: int = field(default=0, init=False)

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address}, {'up' if self.alive else 'down'})"

    @property
    def alive(self) -> bool:
        """True between ``boot()`` and ``kill()``."""
        return self._keeper is not None and self._keeper.poll() is None

    def boot(self) -> None:
        """Start the host's pid 1 (with an empty disk); called by ``Hosts.start``.

        After ``kill()`` this is a reboot: same name and address, empty private folders.
        """
        if self.alive:
            raise HostError(f"{self.name} is already up")
        config = {
            "name": self.name,
            "private": self.private_dirs,
            "readonly": self.readonly,
            "hidden": self.hidden,
        }
        with (self.log_dir / f"{self.name}.pid1.err").open("ab") as err:
            # --kill-child: when unshare dies (with the test process, by PDEATHSIG), pid 1
            # dies and the kernel takes every process of the host with it.
            self._keeper = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.name}",
                 "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts",
                 "--mount", "--propagation", "private",
                 sys.executable, "-c", _KEEPER, json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                process_group=0, preexec_fn=die_with_parent_hook(),
            )  # fmt: skip
        assert self._keeper.stdout is not None
        ready, _, _ = select.select([self._keeper.stdout], [], [], BOOT_TIMEOUT)
        line = self._keeper.stdout.readline() if ready else b""
        self._keeper.stdout.close()
        children = _children(self._keeper.pid)
        if line.strip() != b"ready" or not children:
            self.kill()
            tail = (self.log_dir / f"{self.name}.pid1.err").read_text(errors="replace")[-2000:]
            raise HostError(f"{self.name} did not boot within {BOOT_TIMEOUT:.0f} s: {tail}")
        self._pid1 = children[0]

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        *,
        label: str | None = None,
    ) -> HostProcess:
        """Start ``argv`` inside this host; returns at once (see ``HostProcess``).

        Args:
            argv: the command; absolute paths of the repository (its .venv) work.
            env: the whole environment (the hub's own when None). Point services at
                ``hub_address`` (e.g. ``NatsServer(host=hosts.hub_address).url``) and
                their data at ``data_dir``: the hub's loopback and files are not here.
            cwd: working directory as the host sees it; ``data_dir`` when None, so
                relative paths (e.g. the runner's default ``.trialbus/runner``) land
                on the host's own disk. The package imports from anywhere (editable
                install), and the checkout is read-only here anyway.
            label: names the output files ``<host>.<n>.<label>.out|.err`` in ``log_dir``.
        """
        if not self.alive or self._pid1 is None:
            raise HostDownError(f"{self.name} is down (killed); boot() it to run {argv[0]}")
        self._spawned += 1
        stem = f"{self.name}.{self._spawned}.{label or Path(argv[0]).name}"
        stdout, stderr = self.log_dir / f"{stem}.out", self.log_dir / f"{stem}.err"
        # nsenter enters the namespaces of pid 1, where "/" is the host's view; env -C
        # then changes directory inside that view (nsenter --wd would resolve the path
        # on the hub, which could put the process in a hub folder).
        command = [
            "nsenter", f"--target={self._pid1}", "--net", "--mount", "--pid", "--uts",
            "--", "env", "-C", str(cwd or HOST_DATA_DIR), "--", *argv,
        ]  # fmt: skip
        with stdout.open("wb") as out, stderr.open("wb") as err:
            launcher = subprocess.Popen(
                command,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                process_group=0,  # a Ctrl-C for pytest does not reach the hosts directly
                preexec_fn=die_with_parent_hook(),
            )
        self._launchers.append(launcher)
        return HostProcess(launcher, argv, stdout, stderr)

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        *,
        timeout: float = 30.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this host to the end; its exit status and output."""
        proc = self.spawn(argv, env, cwd)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise HostError(f"{self.name}: {argv} still running after {timeout} s") from None
        out = proc.stdout_path.read_text(errors="replace")
        return subprocess.CompletedProcess(argv, code, out, proc.stderr_path.read_text())

    def path(self, path: str | os.PathLike[str]) -> Path:
        """``path`` as this host sees it, readable from the hub (``/proc/<pid 1>/root``).

        For inspecting a host's private disk from the test without spawning a process,
        e.g. ``host.path(HOST_DATA_DIR) / "runner"``; valid while the host is up.
        """
        if self._pid1 is None:
            raise HostDownError(f"{self.name} is down: its disk went with it")
        return Path(f"/proc/{self._pid1}/root") / Path(path).relative_to("/")

    def pids(self) -> list[int]:
        """Pids of every process on this host's network (``ip netns pids``)."""
        return netns_pids(self.name)

    def kill(self) -> None:
        """The host dies: SIGKILL its pid 1, so the kernel kills every process of it.

        Returns once nothing runs in its network namespace any more; its disk (the
        tmpfs mounts) goes with the last process. ``spawn`` then raises HostDownError.
        """
        signal_pid(self._pid1, signal.SIGKILL)
        deadline = time.monotonic() + KILL_TIMEOUT
        # Anything that entered the network namespace some other way dies too.
        while pids := self.pids():
            if time.monotonic() > deadline:
                raise HostError(f"{self.name}: processes {pids} survive SIGKILL")
            for pid in pids:
                signal_pid(pid, signal.SIGKILL)
            time.sleep(0.01)  # polling interval while the kernel tears processes down
        for proc in [*self._launchers, *([self._keeper] if self._keeper else [])]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(KILL_TIMEOUT)
        self._launchers.clear()
        self._pid1 = None
