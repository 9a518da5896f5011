"""The supervisor's restart policy, on fake children and a fake clock (pure logic).

The real processes (nats-server, the ledger, the services) are killed in
tests/integration/test_supervision.py.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra.supervise import GaveUp, RestartBudget, RestartPolicy, Supervisor, describe_exit


@dataclass
class FakeChild:
    """Dies when told to; its next start fails ``failing_starts`` times."""

    name: str
    failing_starts: int = 0
    status: int | None = None
    starts: int = 0
    pid: int | None = 100
    log_path: Path = Path("/logs/child.log")
    where: str = "same port 1"

    def die(self, status: int = -signal.SIGKILL) -> None:
        self.status = status

    def poll(self) -> int | None:
        status, self.status = self.status, None
        return status

    def start(self) -> None:
        self.starts += 1
        if self.failing_starts:
            self.failing_starts -= 1
            raise RuntimeError("port 1 in use\nlog tail ...")
        self.pid = (self.pid or 0) + 1


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    children: list[FakeChild]
    clock: Clock = field(default_factory=Clock)
    lines: list[str] = field(default_factory=list)

    def supervisor(self, policy: RestartPolicy | None = None) -> Supervisor:
        return Supervisor(lambda: self.children, self.lines.append, policy, self.clock)


def test_a_dead_child_is_restarted_and_the_console_says_so() -> None:
    nats, importer = FakeChild("nats-server"), FakeChild("importer")
    h = Harness([nats, importer])
    sup = h.supervisor()
    assert sup.check() == []  # negative control: nothing died, nothing restarted
    assert (nats.starts, h.lines) == (0, [])

    nats.die()
    assert sup.check() == ["nats-server"]
    assert (nats.starts, importer.starts) == (1, 0)
    assert h.lines[0].startswith("nats-server killed by SIGKILL; restarting it (same port 1)")
    assert h.lines[1] == "nats-server restarted (pid 101)"


def test_more_deaths_than_the_policy_allows_give_up_with_name_exit_and_log() -> None:
    runner = FakeChild("runner-0")
    h = Harness([runner])
    sup = h.supervisor(RestartPolicy(max_restarts=5, window_s=60))
    for i in range(5):
        h.clock.now = i * 10.0  # five deaths within 40 s: all restarted
        runner.die(1)
        assert sup.check() == ["runner-0"]
    h.clock.now = 50.0
    runner.die(1)
    with pytest.raises(GaveUp) as caught:
        sup.check()
    msg = str(caught.value)
    assert "giving up on runner-0: it died 6 times within 60 s" in msg
    assert "exited with code 1" in msg and "/logs/child.log" in msg
    assert runner.starts == 5


def test_deaths_spread_beyond_the_window_are_restarted_forever() -> None:
    # Negative control of the give-up: the same number of deaths, spaced out.
    runner = FakeChild("runner-0")
    h = Harness([runner])
    sup = h.supervisor(RestartPolicy(max_restarts=5, window_s=60))
    for i in range(20):
        h.clock.now = i * 13.0  # at most 5 deaths fall in any 60 s window
        runner.die()
        sup.check()
    assert runner.starts == 20


def test_a_failed_restart_counts_as_a_death_and_cannot_loop_forever() -> None:
    ledger = FakeChild("ledger", failing_starts=1)
    h = Harness([ledger])
    sup = h.supervisor(RestartPolicy(max_restarts=3, window_s=60))
    ledger.die()
    assert sup.check() == ["ledger"]
    assert ledger.starts == 2
    assert "ledger failed to restart: port 1 in use" in h.lines

    stuck = FakeChild("nats-server", failing_starts=10**6)
    h2 = Harness([stuck])
    stuck.die()
    with pytest.raises(GaveUp, match="last: failed to restart: port 1 in use"):
        h2.supervisor(RestartPolicy(max_restarts=3, window_s=60)).check()
    assert stuck.starts == 3


def test_children_added_later_are_supervised() -> None:
    h = Harness([])
    sup = h.supervisor()
    late = FakeChild("runner-1")
    h.children.append(late)
    late.die()
    assert sup.check() == ["runner-1"]


def test_run_checks_until_stop_is_requested() -> None:
    child = FakeChild("watcher")
    h = Harness([child])
    asked: list[float] = []

    def stop_requested(tick: float) -> bool:
        asked.append(tick)
        if len(asked) == 2:
            child.die()
        return len(asked) > 3

    h.supervisor().run(stop_requested, tick_s=0.1)
    assert asked == [0.1] * 4 and child.starts == 1


def test_budget_window_slides() -> None:
    budget = RestartBudget(RestartPolicy(max_restarts=2, window_s=10))
    assert budget.spend(0) and budget.spend(1)
    assert not budget.spend(2)
    assert budget.spend(10.5)  # the restart at 0 left the window


def test_exit_descriptions() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(0) == "exited with code 0"
