"""``trialbus up`` keeps every child alive: nats-server, the ledger and the services.

The stack runs in its own process exactly as ``trialbus up`` runs it (``infra.stack.serve``),
only with free ports, a data folder under ``tmp_path`` and the instant executor (so
trials take a known time without Harbor). The test SIGKILLs one child at a time, the
way the bug was reproduced, and waits on what the system shows: the supervisor's
console lines, the process table and the ledger's records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymongo
import pymongo.errors
import pytest

from benchmarks.instant_executor import EXECUTOR_SPEC
from infra.embedded import LedgerServer
from infra.stack import LEDGER_ARGS
from tests.support.manifests import nop_manifest
from tests.support.stack_console import StackConsole, launched

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

N_TRIALS = 80

# What identifies each child in the process table (its command line).
CHILDREN: dict[str, Callable[[list[str]], bool]] = {
    "nats-server": lambda argv: argv[0].endswith("nats-server"),
    "ledger": lambda argv: any(a.endswith("secantusd-py") for a in argv[:2]),
    "runner-0": lambda argv: argv[1:3] == ["-m", "services.runner"],
    "importer": lambda argv: argv[1:3] == ["-m", "services.importer"],
}


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of ``pid``, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0]


def children_of(parent: int) -> dict[int, tuple[list[str], str]]:
    """Direct children of ``parent``: pid -> (command line, state letter)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        st = _stat(pid)
        if st is None or st[0] != parent:
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        except (FileNotFoundError, ProcessLookupError):
            continue
        found[pid] = (argv, st[1])
    return found


def eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Wait until ``check()`` holds (re-checked every 0.1 s), else fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)  # re-check interval of an observed condition


class Up(StackConsole):
    """The supervised stack's process, its console, and its children by name."""

    def pid_of(self, name: str) -> int:
        """Pid of the live child ``name`` (exactly one must exist)."""
        pids = [p for p, (argv, st) in children_of(self.proc.pid).items() if CHILDREN[name](argv)]
        assert len(pids) == 1, f"expected one {name}, found {pids}"
        return pids[0]

    def zombies(self) -> list[str]:
        return [" ".join(a) for a, st in children_of(self.proc.pid).values() if st == "Z"]


RUNNER_ENV = {
    "TRIALBUS_EXECUTOR": EXECUTOR_SPEC,
    "TRIALBUS_INSTANT_DELAY_S": "1.5",  # 80 trials: about 30 s of work, time for 4 kills
    "TRIALBUS_ACK_WAIT_S": "4",
    "TRIALBUS_HEARTBEAT_S": "1",
}


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """The stack, up and supervised, with the instant executor."""
    with launched(tmp_path, RUNNER_ENV, Up) as handle:
        handle.wait_line("trialbus is up", timeout=120)
        yield handle


def write_manifest(folder: Path) -> Path:
    retry = {"max_attempts": 3, "backoff_seconds": 0.2}
    return nop_manifest(
        folder, "supervision", agents=2, repetitions=N_TRIALS // 2, concurrency=1000, retry=retry
    )


def submit(up: Up, manifest: Path) -> str:
    """`trialbus submit --json` against the running stack (found through its stack file)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TRIALBUS_") and k not in {"NATS_URL", "LEDGER_URL"}
    }
    env["TRIALBUS_STACK_FILE"] = str(up.stack_file)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "trialbus"), "submit", str(manifest), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    experiment_id: str = json.loads(done.stdout)["experiment_id"]
    return experiment_id


@dataclass
class LedgerView:
    """The experiment's records as the ledger holds them (None while it is down)."""

    url: str
    experiment_id: str

    def records(self) -> list[dict[str, Any]] | None:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            self.url, serverSelectionTimeoutMS=1000, connectTimeoutMS=1000
        )
        try:
            return list(
                client["trialbus"]["trials"].find(
                    {"experiment_id": self.experiment_id},
                    {"trial_id": 1, "evaluation.reward_valid": 1},
                )
            )
        except pymongo.errors.PyMongoError:
            return None
        finally:
            client.close()

    def count(self) -> int:
        return len(self.records() or [])


def progressed(ledger: LedgerView, target: int) -> Callable[[], bool]:
    """A check that holds once the ledger has ``target`` of the experiment's records."""
    return lambda: ledger.count() >= target


def test_every_child_killed_in_turn_is_restarted_and_no_trial_is_lost(
    up: Up, tmp_path: Path
) -> None:
    ledger = LedgerView(up.stack["ledger_url"], submit(up, write_manifest(tmp_path)))
    seen = ledger.count()
    for name in ("nats-server", "ledger", "runner-0", "importer"):
        # The fault lands while the pipeline demonstrably works: records arrived since
        # the previous restart, and the experiment is not finished.
        eventually(progressed(ledger, seen + 4), 120, f"progress before killing {name}")
        assert ledger.count() < N_TRIALS, f"the experiment ended before {name} was killed"
        mark = len(up.lines)
        victim = up.pid_of(name)
        os.kill(victim, signal.SIGKILL)
        up.wait_line(f"{name} killed by SIGKILL; restarting it", timeout=30, after=mark)
        up.wait_line(f"{name} restarted (pid", timeout=60, after=mark)
        assert up.pid_of(name) != victim
        assert up.zombies() == [], f"unreaped children after restarting {name}"
        seen = ledger.count()

    eventually(lambda: ledger.count() == N_TRIALS, 240, f"all {N_TRIALS} trials recorded")
    records = ledger.records() or []
    assert len({r["trial_id"] for r in records}) == N_TRIALS
    unscored = [r["trial_id"] for r in records if not r["evaluation"]["reward_valid"]]
    assert unscored == []
    assert not any("giving up" in line for line in up.lines)


def test_a_child_that_keeps_dying_stops_the_stack_with_a_clear_message(up: Up) -> None:
    others = [up.pid_of(n) for n in ("ledger", "runner-0", "importer")]
    for i in range(5):  # the default policy: 5 restarts within 60 s ...
        mark = len(up.lines)
        os.kill(up.pid_of("nats-server"), signal.SIGKILL)
        up.wait_line(f"restart {i + 1} of at most 5 within 60 s", timeout=30, after=mark)
        up.wait_line("nats-server restarted (pid", timeout=60, after=mark)
    assert up.proc.poll() is None  # negative control: five deaths are still restarted

    os.kill(up.pid_of("nats-server"), signal.SIGKILL)  # ... and the sixth is one too many
    line = up.wait_line("giving up on nats-server", timeout=30)
    assert "it died 6 times within 60 s (last: killed by SIGKILL)" in up.lines[line]
    assert "nats-server.log" in up.lines[line]
    assert up.proc.wait(timeout=90) == 3  # EXIT_UNAVAILABLE, and no hang
    assert not up.stack_file.exists()
    assert [p for p in others if _stat(p) is not None] == []  # nothing left behind


def test_a_stack_killed_outright_takes_every_child_along(up: Up) -> None:
    pids = {name: up.pid_of(name) for name in CHILDREN}
    assert all(_alive(p) for p in pids.values())  # negative control of the check below
    up.proc.kill()  # SIGKILL: no chance to stop anything in order
    up.proc.wait()
    eventually(
        lambda: not [n for n, p in pids.items() if _alive(p)],
        30,
        f"children of a killed stack to exit: {pids}",
    )


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for init to reap it counts as gone)."""
    st = _stat(pid)
    return st is not None and st[1] != "Z"


def test_the_stack_ledger_keeps_acknowledged_writes_across_a_sigkill(tmp_path: Path) -> None:
    # A restart on the same data folder is only worth it if what the ledger
    # acknowledged is still there: the importer acks its events once the ledger
    # answered, so a lost record would never be imported again.
    server = LedgerServer(tmp_path / "ledger", extra_args=LEDGER_ARGS).start()
    try:
        client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(server.url)
        trials = client["durability"]["trials"]
        # Small commits, as fast as they are acknowledged (a large one would flush the
        # log buffer by filling it, and hide the loss).
        for i in range(200):
            trials.insert_one({"trial_id": f"t{i}"})
        client.close()
        server.kill()
        server.start()
        client = pymongo.MongoClient(server.url)
        assert client["durability"]["trials"].count_documents({}) == 200
        client.close()
    finally:
        server.stop()


def test_a_stack_that_cannot_start_says_why_and_exits_3(tmp_path: Path) -> None:
    broken = {**RUNNER_ENV, "TRIALBUS_EXECUTOR": "no_such_module:factory"}
    with launched(tmp_path, broken, Up) as handle:
        assert handle.proc.wait(timeout=120) == 3
        line = handle.wait_line("trialbus could not start", timeout=10)
        assert "runner-0" in handle.lines[line]
        assert not any("trialbus is up" in x for x in handle.lines)
