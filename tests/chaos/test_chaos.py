"""Chaos: a few hundred trials while runners are SIGKILLed and the importer restarted.

Run with `make chaos` (not part of `make test`: it takes a few minutes). The last
line it prints is ``chaos: submitted=N ledgered=N duplicates=D missing=M``, where
``duplicates`` is the fault checker's count (tests/e2e/ledger_check.py: results
accepted more than once), not a count of ledger rows (which the unique index fixes).

Kills come at random points of the work, not of the clock: between two kills the
test waits for a random number of new events, and the runner killed is one with a
trial in flight, so every kill lands on work.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas.events import Event, TrialCompleted, TrialFailed, TrialStarted
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import instant_runner_env, judge, submit, write_manifest

pytestmark = pytest.mark.chaos

RESULT = Path(__file__).resolve().parents[2] / ".trialbus" / "chaos-result.txt"
N = 400
CHAOS_S = 60.0
RUNNERS = 3


def busy_runners(events: Sequence[Event]) -> list[str]:
    """Runners with a trial started and not yet ended (sorted, for a seeded choice)."""
    ended = {
        e.run_id or e.trial_id
        for e in events
        if isinstance(e, TrialCompleted) or (isinstance(e, TrialFailed) and e.final)
    }
    return sorted(
        {
            e.runner_id
            for e in events
            if isinstance(e, TrialStarted) and (e.run_id or e.trial_id) not in ended
        }
    )


def grown_by(mark: int, n: int, done: Callable[[], bool]) -> Callable[[Sequence[Event]], bool]:
    """Condition: ``n`` events arrived after position ``mark`` (or the work is done)."""
    return lambda events: len(events) - mark >= n or done()


async def test_chaos(stacks: Stacks, tmp_path: Path) -> None:
    rng = random.Random(20261125)
    stack = await stacks.start(
        n_runners=RUNNERS,
        concurrency=16,
        runner_env=instant_runner_env(1.0),
        extra_env={"TRIALBUS_BATCH_SIZE": "25"},
    )
    tap = await stacks.tap(stack)
    sub = await submit(stacks.cli(stack), write_manifest(tmp_path, N, concurrency=40))
    kills = restarts = 0
    kill_log: list[str] = []  # to place a failure's events among the kills
    t0 = time.monotonic()

    def done() -> bool:
        return len(tap.imported(sub.experiment_id)) >= N

    while time.monotonic() - t0 < CHAOS_S and not done():
        mark, gap = tap.mark(), rng.randint(10, 80)
        await tap.eventually(grown_by(mark, gap, done), f"{gap} more events", 60)
        if done():
            break
        busy = busy_runners(tap.events)
        if busy:
            victim = stack.services[rng.choice(busy)]
            victim.kill()
            kill_log.append(f"{datetime.now(UTC):%H:%M:%S.%f} SIGKILL {victim.name}")
            kills += 1
            victim.start()
        if rng.random() < 0.5:
            importer = stack.services["importer"]
            importer.kill()
            kill_log.append(f"{datetime.now(UTC):%H:%M:%S.%f} SIGKILL importer")
            importer.start()
            restarts += 1
    took = await tap.all_imported(sub.experiment_id, set(sub.trial_ids), 300)
    check = await judge(
        f"chaos ({kills} runner kills, {restarts} importer kills)", stack, sub, recovery_s=took
    )
    line = (
        f"chaos: submitted={check.submitted} ledgered={check.ledgered} "
        f"duplicates={check.duplicates} missing={check.missing}"
    )
    print(line)
    # `make chaos` prints this file last, after pytest's own summary.
    RESULT.parent.mkdir(exist_ok=True)
    RESULT.write_text(line + "\n")
    assert kills >= 10, f"only {kills} runner kills: the chaos did not reach the work"
    assert check.ok, check.explain() + "\nkills:\n" + "\n".join(kill_log)
