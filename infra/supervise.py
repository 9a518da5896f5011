"""Keep the embedded stack's children alive: servers and services, one policy for all.

A child that dies is reaped at once (no zombie), restarted in place (same data
folder, same port, same settings) and the restart is reported; a child that keeps
dying (more than ``max_restarts`` deaths within ``window_s``) makes the supervisor give
up with a message that names it, its last exit and its log, rather than restart it
forever or hang.

Why not a library: supervisor (supervisord) and circus are daemons of their own,
configured by files and controlled over RPC / ZeroMQ, so ``trialbus up`` would need
supervising itself; honcho stops everything when one process exits; simpervisor
restarts forever without a give-up limit or a restart report, and none of them knows
when nats-server or the ledger is ready again. What is needed here is a loop over
objects that can already start (and wait for readiness), poll and stop themselves:
a few dozen lines.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

__all__ = ["GaveUp", "RestartBudget", "RestartPolicy", "Supervised", "Supervisor", "describe_exit"]


class Supervised(Protocol):
    """A child process the supervisor can watch and restart."""

    @property
    def name(self) -> str:
        """Short name shown on the console (``nats-server``, ``ledger``, ``runner-0``)."""

    @property
    def where(self) -> str:
        """What stays the same across a restart (port, data folder or log file)."""

    @property
    def log_path(self) -> Path:
        """The child's own log file, quoted when the supervisor gives up."""

    @property
    def pid(self) -> int | None:
        """Process id while running."""

    def poll(self) -> int | None:
        """Reap the child if it died: its exit status once, else None."""

    def start(self) -> object:
        """Start again in place; servers block until ready and raise if they cannot."""


@dataclass(frozen=True)
class RestartPolicy:
    """When to stop restarting: more than ``max_restarts`` deaths within ``window_s``."""

    max_restarts: int = 5
    window_s: float = 60.0


@dataclass
class RestartBudget:
    """Restarts of one child in a sliding window (pure: the caller passes the time)."""

    policy: RestartPolicy
    _times: deque[float] = field(default_factory=deque)

    def spend(self, now: float) -> bool:
        """Record one restart at ``now``; False when the budget is used up."""
        while self._times and self._times[0] <= now - self.policy.window_s:
            self._times.popleft()
        if len(self._times) >= self.policy.max_restarts:
            return False
        self._times.append(now)
        return True

    @property
    def used(self) -> int:
        """Restarts counted in the current window."""
        return len(self._times)


class GaveUp(RuntimeError):
    """A child kept dying; the message says which, how often, how, and where its log is."""

    def __init__(self, child: Supervised, policy: RestartPolicy, last_exit: str) -> None:
        self.child_name = child.name
        super().__init__(
            f"giving up on {child.name}: it died {policy.max_restarts + 1} times within "
            f"{policy.window_s:.0f} s (last: {last_exit}); see its log {child.log_path}"
        )


def describe_exit(status: int) -> str:
    """``killed by SIGKILL`` / ``exited with code 1`` from a Popen return code."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exited with code {status}"


class Supervisor:
    """Restart dead children in place and report it; raise GaveUp on a crash loop.

    ``children`` is called on every check, so a child added later (``add_runner``) is
    supervised too. Restarts run in the calling thread: a server restart blocks the
    loop until the server is ready (or its startup times out, which counts as one
    more death), which keeps restarts of dependent children in order.
    """

    def __init__(
        self,
        children: Callable[[], Iterable[Supervised]],
        report: Callable[[str], None],
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._children = children
        self._report = report
        self.policy = policy or RestartPolicy()
        self._clock = clock
        self._budgets: dict[str, RestartBudget] = {}

    def check(self) -> list[str]:
        """Reap and restart every child that died since the last check (returns their names).

        Raises:
            GaveUp: a child died more than the policy allows.
        """
        restarted = []
        for child in list(self._children()):
            status = child.poll()
            if status is not None:
                self._restart(child, describe_exit(status))
                restarted.append(child.name)
        return restarted

    def run(self, stop_requested: Callable[[float], bool], tick_s: float = 0.25) -> None:
        """Check every ``tick_s`` until ``stop_requested(tick_s)`` (which waits) is True."""
        while not stop_requested(tick_s):
            self.check()

    def _restart(self, child: Supervised, last_exit: str) -> None:
        budget = self._budgets.setdefault(child.name, RestartBudget(self.policy))
        while True:
            if not budget.spend(self._clock()):
                raise GaveUp(child, self.policy, last_exit)
            self._report(
                f"{child.name} {last_exit}; restarting it ({child.where}), "
                f"restart {budget.used} of at most {self.policy.max_restarts} "
                f"within {self.policy.window_s:.0f} s"
            )
            try:
                child.start()
            except Exception as exc:  # noqa: BLE001 - any failed start is one more death
                first_line = (str(exc).splitlines() or [repr(exc)])[0]
                last_exit = f"failed to restart: {first_line}"
                self._report(f"{child.name} {last_exit}")
                continue
            self._report(f"{child.name} restarted (pid {child.pid})")
            return
