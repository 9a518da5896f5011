"""Several "hosts" on one machine, for multi-host tests: namespaces, a bridge, cleanup.

A host is what a runner on another machine would have: its own network (a network
namespace with one address on a bridge, its own loopback, no NAT: it reaches the root
namespace's addresses, never its loopback, and nothing beyond the machine), its own disk
(a mount namespace with a tmpfs over each private folder: the same path on every host
shows different files), its own processes (a pid namespace: killing the host kills all
of them, sandboxes included) and its own hostname. The hub stays in the root
namespaces and binds its servers to the bridge address ``Hosts.hub_address``::

    root namespace (the hub)                   host tbh-1a2b3c-0, tbh-1a2b3c-1, ...
    bridge tbhb1a2b3c 10.K.J.1/24 ── veth ──── eth0 10.K.J.2/24, lo, default via .1
                                   ── veth ──── eth0 10.K.J.3/24, ...

Typical use (root only; see ``unavailable_reason``)::

    with Hosts(2, log_dir=tmp_path / "hosts") as hosts:
        nats = NatsServer(tmp_path / "nats", host=hosts.hub_address).start()
        env = {**os.environ, "NATS_URL": nats.url}  # the hub's servers, via the bridge
        runner = hosts[0].spawn([sys.executable, "-m", "services.runner"], env, label="runner")
        ...
        hosts[0].kill()  # the host dies: every process in it, and its disk

Inside a host the repository is bound read-only by default (``readonly``), so a
process that still writes to a shared path fails loudly instead of passing by luck;
its stdout and stderr go to files in ``log_dir`` on the hub (``HostProcess.output``).

Cleanup always runs (``with`` exit, ``close()``, atexit): processes, namespaces, veths
and the bridge go. Every process of a host also dies with the test process (the kernel
kills the host's pid 1 when the process that started it dies). A run that was
SIGKILLed leaves names behind: ``sweep_stale`` (called by every ``Hosts``) removes
those whose owner process is gone, found by the ``tbh`` name prefix and a marker
file per run, and never touches a run that is still alive.

A host's own side (pid 1, spawn, kill) is in tests/support/netns_host.py; import
everything from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Self

from infra.managed_process import StartStop, cleaned_up_at_exit
from tests.support.netns_host import (
    HOST_DATA_DIR,
    PRIVATE_DIRS,
    REPO,
    Host,
    HostDownError,
    HostError,
    HostProcess,
    ip,
    netns_pids,
    signal_pid,
)

__all__ = [
    "HOST_DATA_DIR",
    "MAX_HOSTS",
    "PRIVATE_DIRS",
    "REPO",
    "Host",
    "HostDownError",
    "HostError",
    "HostProcess",
    "Hosts",
    "netns_pids",
    "sweep_stale",
    "unavailable_reason",
]

PREFIX = "tbh"
"""Every namespace, link and marker of this harness starts with it (the stale sweep's key)."""
MAX_HOSTS = 6
MARKER_DIR = Path("/run/trialbus-hosts")
_TOOLS = ("ip", "unshare", "nsenter", "mount")


def unavailable_reason() -> str | None:
    """Why hosts cannot be created here (not root, a tool missing), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the multi-host tests as root, as CI does)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (iproute2/util-linux; `make setup`)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (with the pid, a process identity reuse cannot fake)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _remove_names(token: str) -> None:
    """Kill what runs in run ``token``'s namespaces, then delete them and its links."""
    for name in ip("netns", "list", check=False).split():
        if name.startswith(f"{PREFIX}-{token}-"):
            for pid in netns_pids(name):
                signal_pid(pid, signal.SIGKILL)
            ip("netns", "del", name, check=False)
    for line in ip("-o", "link", "show", check=False).splitlines():
        link = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if link.startswith((f"{PREFIX}b{token}", f"{PREFIX}v{token}")):
            ip("link", "del", link, check=False)
    (MARKER_DIR / token).unlink(missing_ok=True)


def sweep_stale() -> list[str]:
    """Remove what earlier runs left behind; returns the run tokens removed.

    A run is stale when the process named in its marker is gone (or is another
    process that reused the pid); names with the prefix but no marker are stale too,
    since a run writes its marker before creating anything.
    """
    live: set[str] = set()
    stale: set[str] = set()
    if MARKER_DIR.is_dir():
        for marker in MARKER_DIR.iterdir():
            with contextlib.suppress(OSError, ValueError, KeyError):
                owner = json.loads(marker.read_text())
                alive = _start_time(owner["pid"]) == owner["start"]
                (live if alive else stale).add(marker.name)
                continue
            stale.add(marker.name)
    for name in ip("netns", "list", check=False).split():
        if name.startswith(f"{PREFIX}-") and name.count("-") >= 2:
            stale.add(name.split("-")[1])
    for line in ip("-o", "link", "show", check=False).splitlines():
        link = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if link.startswith((f"{PREFIX}b", f"{PREFIX}v")) and len(link) >= 10:
            stale.add(link[4:10])
    stale -= live
    for token in stale:
        _remove_names(token)
    return sorted(stale)


def _used_subnets() -> set[str]:
    used = set()
    for line in (
        ip("-4", "-o", "addr", "show", check=False).splitlines()
        + ip("-4", "route", "show", check=False).splitlines()
    ):
        for word in line.split():
            if word.startswith("10."):
                used.add(".".join(word.split("/")[0].split(".")[:3]))
    return used


_live: set[Hosts] = cleaned_up_at_exit(lambda hosts: hosts.close())


class Hosts(StartStop):
    """``count`` hosts on one bridge, created by ``start()``/``with``, removed by ``close()``.

    Args:
        count: how many hosts (1 to ``MAX_HOSTS``).
        log_dir: where the hosts' process output goes (a new temporary folder when None).
        private_dirs: folders each host gets its own tmpfs over (``PRIVATE_DIRS``).
        readonly: folders bound read-only inside every host (the repository), so a
            write to a path the hub shares fails instead of going unnoticed.
        hidden: existing folders that look empty (and read-only) inside every host,
            e.g. the example tasks, to prove runners never read the hub's copy.

    Attributes:
        token: six hex digits naming this run's namespaces and links.
        bridge: the bridge's name in the root namespace.
        subnet: ``10.K.J.0/24``, unused on this machine when chosen.
        hub_address: the bridge's address (``10.K.J.1``): bind the hub's servers here.
        hosts: the ``Host`` objects; ``hosts[i]`` and iteration work on ``Hosts`` too.
    """

    def __init__(
        self,
        count: int,
        *,
        log_dir: Path | None = None,
        private_dirs: Sequence[str] = PRIVATE_DIRS,
        readonly: Sequence[str] = (REPO,),
        hidden: Sequence[str] = (),
    ) -> None:
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"count must be 1..{MAX_HOSTS} (each host is a pid 1), not {count}")
        for d in (*private_dirs, *readonly, *hidden):
            if not d.startswith("/"):
                raise ValueError(f"folders given to Hosts must be absolute paths, not {d!r}")
        for d in hidden:
            if not Path(d).is_dir():
                raise ValueError(f"hidden folder {d} is not an existing folder")
        self.count = count
        self.log_dir = (
            Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix=f"{PREFIX}-logs-"))
        )
        self.private_dirs = tuple(private_dirs)
        self.readonly = tuple(readonly)
        self.hidden = tuple(str(d) for d in hidden)
        self.token = secrets.token_hex(3)
        self.bridge = f"{PREFIX}b{self.token}"
        self.subnet = ""
        self.hub_address = ""
        self.hosts: list[Host] = []

    def start(self) -> Self:
        """Sweep stale runs, then create the bridge and boot every host."""
        reason = unavailable_reason()
        if reason:
            raise HostError(reason)
        sweep_stale()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        MARKER_DIR.mkdir(parents=True, exist_ok=True)
        # The marker comes first: a name without one is stale by definition.
        me = {"pid": os.getpid(), "start": _start_time(os.getpid())}
        (MARKER_DIR / self.token).write_text(json.dumps(me))
        _live.add(self)
        try:
            used = _used_subnets()
            free = [f"10.{k}.{j}" for k in range(200, 250) for j in range(256)]
            net = random.choice([n for n in free if n not in used])
            self.subnet, self.hub_address = f"{net}.0/24", f"{net}.1"
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.hub_address}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i in range(self.count):
                host = Host(
                    f"{PREFIX}-{self.token}-{i}",
                    i,
                    f"{net}.{i + 2}",
                    self.hub_address,
                    private_dirs=self.private_dirs,
                    readonly=self.readonly,
                    hidden=self.hidden,
                    log_dir=self.log_dir,
                )
                self.hosts.append(host)
                veth = f"{PREFIX}v{self.token}{i}"
                ip("netns", "add", host.name)
                ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.name)
                ip("link", "set", veth, "master", self.bridge, "up")
                ip("-n", host.name, "link", "set", "lo", "up")
                ip("-n", host.name, "addr", "add", f"{host.address}/24", "dev", "eth0")
                ip("-n", host.name, "link", "set", "eth0", "up")
                ip("-n", host.name, "route", "add", "default", "via", self.hub_address)
                host.boot()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill every host, delete namespaces, veths and bridge; safe to call twice."""
        try:
            for host in self.hosts:
                with contextlib.suppress(HostError):
                    host.kill()
        finally:
            _remove_names(self.token)
            _live.discard(self)

    def stop(self) -> None:
        """The same as ``close()`` (what leaving a ``with`` block calls)."""
        self.close()

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)
