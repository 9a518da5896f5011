"""One trialbus service (``python -m services.<name>``) as a child process of the stack."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from infra.managed_process import die_with_parent_hook

__all__ = ["ServiceProcess"]


@dataclass
class ServiceProcess:
    """One service process, restartable with the same settings and log file."""

    name: str
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _reaped: bool = field(default=False, repr=False)

    def start(self) -> None:
        """Spawn the service in its own session; output is appended to ``log_path``.

        A start after the first counts as a restart (``restarts``).
        """
        if self.proc is not None:
            self.restarts += 1
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        service = self.name.split("-")[0]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{service}"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # Like the servers: a stack killed outright takes its services along,
                # instead of leaving them reconnecting forever to a NATS that is gone.
                preexec_fn=die_with_parent_hook(),
            )
        self._reaped = False

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the current (or last) run."""
        return self.proc.pid if self.proc is not None else None

    @property
    def where(self) -> str:
        """What a restart keeps: the settings and the log file."""
        return f"same settings, log {self.log_path}"

    def poll(self) -> int | None:
        """Reap the service if it died: its exit status once per run, else None.

        Whatever the dead service left in its session (a trial's processes) is killed,
        so the restarted service does not share the machine with orphans of the old one.
        """
        if self.proc is None or self._reaped:
            return None
        status = self.proc.poll()
        if status is None:
            return None
        self._reaped = True
        self.signal(signal.SIGKILL)
        return status

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the service's whole process group."""
        if self.proc is not None:
            # The group outlives its leader while members remain, so a dead leader's
            # orphans are still reachable through its pid (the group id).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (runners drain), wait, then SIGKILL the whole process group."""
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=5)

    def kill(self) -> None:
        """SIGKILL the whole process group and reap the service (a crash, for tests)."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=5)
