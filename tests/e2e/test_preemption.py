"""Preemption and the spot-style stop notice with real processes (docs/scheduling.md).

Each test runs a stack (real nats-server, ledger, importer, watcher, runner
processes) whose runners use tests/support/class_hold_executor.py: trials of the
``batch`` class are held in flight until a file exists (no known time limit); every
other trial completes after a short delay, which it declares as its time limit.
Verdicts come from the events stream and the ledger (tests/e2e/ledger_check.py).

- **preemption**: one runner of two slots runs a preemptible batch trial and a
  non-preemptible one, both held; an urgent experiment of two trials arrives. The
  preemptible trial is handed back (``Preempted``), the urgent trials run and are
  recorded while the hold still stands, and the handed-back trial later completes
  as attempt 1. Negative control in the same run: the non-preemptible trial, which
  the rule would otherwise have taken too (two urgent trials wait), is never
  preempted and starts once.
- **stop notice**: a runner of four slots runs two held batch trials and two quick
  ones, then gets SIGTERM with a 10 s notice. The held trials (they cannot finish)
  are handed back at once (``StopNotice``), the quick ones finish on that runner
  (negative control: not handed back), the runner exits before the deadline, and a
  second runner runs the handed-back trials: every trial is recorded once, as
  attempt 1, nothing lost.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas.events import (
    Event,
    ExperimentSubmitted,
    TrialCompleted,
    TrialFailed,
    TrialStarted,
)
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import Submitted, judge, ledger_records, submit
from tests.support.class_hold_executor import EXECUTOR_SPEC
from tests.support.manifests import nop_manifest

pytestmark = pytest.mark.e2e

QUICK_S = 0.3
NOTICE_S = 10.0
HANDBACK_BOUND_S = 5.0
"""The held trials must be handed back this soon after SIGTERM: at once, well inside
the notice, with room for a loaded machine (measured: see docs/scheduling.md)."""


def runner_env(hold: Path, **extra: str) -> dict[str, str]:
    return {
        "TRIALBUS_EXECUTOR": EXECUTOR_SPEC,
        "TRIALBUS_INSTANT_DELAY_S": str(QUICK_S),
        "TRIALBUS_INSTANT_HOLD_UNTIL": str(hold),
        "TRIALBUS_TEST_HOLD_CLASSES": "batch",
        "TRIALBUS_ACK_WAIT_S": "4",
        "TRIALBUS_HEARTBEAT_S": "1",
        **extra,
    }


def manifest(folder: Path, name: str, n: int, cls: str, *, preemptible: bool = False) -> Path:
    compute: dict[str, object] = {
        "environment": "local",
        "n_concurrent_trials": 1000,
        "priority_class": cls,
    }
    if preemptible:
        compute["preemptible"] = True
    return nop_manifest(folder, name, agents=1, repetitions=n, concurrency=1000, compute=compute)


def of[E: Event](events: Sequence[Event], kind: type[E], sub: Submitted) -> list[E]:
    """The events of one kind of one experiment, in the stream's order."""
    return [e for e in events if isinstance(e, kind) and e.experiment_id == sub.experiment_id]


def handed_back(events: Sequence[Event], sub: Submitted, error_type: str) -> list[TrialFailed]:
    return [e for e in of(events, TrialFailed, sub) if e.error_type == error_type and not e.final]


async def test_a_preemptible_batch_trial_gives_its_slot_to_urgent_work(
    stacks: Stacks, tmp_path: Path
) -> None:
    hold = tmp_path / "release"
    stack, tap, cli = await stacks.started(concurrency=2, runner_env=runner_env(hold))
    yielding = await submit(cli, manifest(tmp_path, "yielding", 1, "batch", preemptible=True))
    fixed = await submit(cli, manifest(tmp_path, "fixed", 1, "batch"))
    await tap.eventually(
        lambda ev: of(ev, TrialStarted, yielding) and of(ev, TrialStarted, fixed),
        "both batch trials running",
        60,
    )
    urgent = await submit(cli, manifest(tmp_path, "urgent", 2, "urgent"))
    await tap.eventually(lambda ev: handed_back(ev, yielding, "Preempted"), "the preemption", 60)
    # The urgent trials run and are recorded while both batch trials are still held.
    await tap.all_imported(urgent.experiment_id, set(urgent.trial_ids), 60)
    # From the events' own timestamps (one machine, one clock): the urgent submission,
    # the first preemption, the first urgent start.
    (submitted,) = of(tap.events, ExperimentSubmitted, urgent)
    preempted_s = (
        handed_back(tap.events, yielding, "Preempted")[0].occurred_at - submitted.occurred_at
    ).total_seconds()
    urgent_started_s = (
        of(tap.events, TrialStarted, urgent)[0].occurred_at - submitted.occurred_at
    ).total_seconds()
    assert not of(tap.events, TrialCompleted, yielding) and not of(
        tap.events, TrialCompleted, fixed
    )
    # Negative control: the non-preemptible trial was never handed back nor restarted.
    assert not [e for e in of(tap.events, TrialFailed, fixed)]
    assert len(of(tap.events, TrialStarted, fixed)) == 1

    hold.touch()
    await tap.all_imported(yielding.experiment_id, set(yielding.trial_ids), 60)
    await tap.all_imported(fixed.experiment_id, set(fixed.trial_ids), 60)

    preemptions = handed_back(tap.events, yielding, "Preempted")
    assert all(e.failure_class == "cancelled" for e in preemptions)
    starts = of(tap.events, TrialStarted, yielding)
    # Every start was attempt 1: the preempted ones were taken back, each told apart.
    assert [(s.attempt, s.handed_back) for s in starts] == [
        (1, i) for i in range(len(preemptions) + 1)
    ]
    (record,) = await ledger_records(stack, yielding.experiment_id)
    assert record.attempts == 1 and record.evaluation.reward_valid
    print(
        f"preemption: urgent submitted, a batch trial preempted after {preempted_s:.2f} s, "
        f"the first urgent trial started after {urgent_started_s:.2f} s, "
        f"preemptions={len(preemptions)}"
    )
    for name, sub in (("preempted", yielding), ("fixed", fixed), ("urgent", urgent)):
        check = await judge(f"preemption: {name}", stack, sub)
        assert check.ok, check.explain()
    assert (await judge("preemption: fixed", stack, fixed)).reruns == 0


async def test_a_stop_notice_hands_back_what_cannot_finish_and_loses_nothing(
    stacks: Stacks, tmp_path: Path
) -> None:
    hold = tmp_path / "release"
    env = runner_env(hold, TRIALBUS_STOP_NOTICE_S=str(NOTICE_S))
    # Quick trials of 3 s: they may finish within the 10 s notice, the held ones cannot.
    env["TRIALBUS_INSTANT_DELAY_S"] = "3"
    stack, tap, cli = await stacks.started(concurrency=4, runner_env=env)
    long = await submit(cli, manifest(tmp_path, "long", 2, "batch"))
    quick = await submit(cli, manifest(tmp_path, "quick", 2, "normal"))
    await tap.eventually(
        lambda ev: len(of(ev, TrialStarted, long)) == 2 and len(of(ev, TrialStarted, quick)) == 2,
        "four trials running",
        60,
    )
    runner = stack.services["runner-0"]
    noticed, sent = time.monotonic(), datetime.now(UTC)
    runner.signal(signal.SIGTERM)

    def both_back(events: Sequence[Event]) -> list[TrialFailed] | None:
        backs = handed_back(events, long, "StopNotice")
        return backs if len(backs) == 2 else None

    backs = await tap.eventually(both_back, "the hand-back", 30)
    seen_s = time.monotonic() - noticed
    # When the runner published them (its clock is this machine's): the hand-back latency.
    handback_s = max((b.occurred_at - sent).total_seconds() for b in backs)
    assert runner.proc is not None
    exit_code = await asyncio.to_thread(runner.proc.wait, 60)
    exited_s = time.monotonic() - noticed
    assert exit_code == 0
    # The quick trials finished on the runner that got the notice (negative control).
    await tap.eventually(
        lambda ev: len(of(ev, TrialCompleted, quick)) == 2, "the quick trials' ends", 30
    )
    assert not of(tap.events, TrialFailed, quick)
    assert 0 < handback_s <= seen_s < HANDBACK_BOUND_S, (handback_s, seen_s)
    assert exited_s < NOTICE_S + 5, f"exited {exited_s:.1f} s after the notice"

    hold.touch()
    stack.add_runner()
    await tap.all_imported(long.experiment_id, set(long.trial_ids), 90)
    await tap.all_imported(quick.experiment_id, set(quick.trial_ids), 90)
    starts = of(tap.events, TrialStarted, long)
    assert sorted((s.runner_id, s.attempt, s.handed_back) for s in starts) == [
        ("runner-0", 1, 0),
        ("runner-0", 1, 0),
        ("runner-1", 1, 1),
        ("runner-1", 1, 1),
    ]
    for rec in await ledger_records(stack, long.experiment_id):
        assert rec.attempts == 1 and rec.evaluation.reward_valid
    print(
        f"stop notice: notice={NOTICE_S:.0f} s, handed back {handback_s * 1000:.0f} ms after "
        f"SIGTERM (seen by the test after {seen_s * 1000:.0f} ms), runner exited after "
        f"{exited_s:.2f} s"
    )
    for name, sub in (("long", long), ("quick", quick)):
        check = await judge(f"stop notice: {name}", stack, sub)
        assert check.ok, check.explain()
