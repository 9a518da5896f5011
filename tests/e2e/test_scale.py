"""1,000 slow trials in flight across two runner processes on this 2-core machine."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from schemas.events import Event, TrialStarted
from tests.e2e.conftest import Stacks
from tests.e2e.faultkit import instant_runner_env, judge, submit, write_manifest

pytestmark = pytest.mark.e2e

N = 1000
# Generous: every trial is held in flight until the test releases it, so this bounds
# only how long starting 1,000 may take on a loaded machine, never what is measured
# (the timing is the orchestration benchmark's job, benchmarks/).
START_DEADLINE_S = 300.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_thousand_trials_in_flight_across_two_runners(stacks: Stacks, tmp_path: Path) -> None:
    release = tmp_path / "release"
    env = instant_runner_env(0.0, TRIALBUS_INSTANT_HOLD_UNTIL=str(release))
    # The default ack_wait: 1,000 slow trials must not need the fault tests' short one.
    for key in ("TRIALBUS_ACK_WAIT_S", "TRIALBUS_HEARTBEAT_S"):
        env.pop(key)
    stack = await stacks.start(n_runners=2, concurrency=N // 2, runner_env=env)
    tap = await stacks.tap(stack)
    runners = [stack.services[f"runner-{i}"] for i in range(2)]
    pids = [r.proc.pid for r in runners if r.proc is not None]
    base = [rss_kib(p) for p in pids]
    t0 = time.monotonic()
    sub = await submit(stacks.cli(stack), write_manifest(tmp_path, N, concurrency=N))

    def all_started(events: Sequence[Event]) -> list[TrialStarted]:
        started = [e for e in events if isinstance(e, TrialStarted)]
        return started if len(started) >= N else []

    # Every trial must be running at once: none can end before the test releases them.
    started = await tap.eventually(all_started, f"{N} trials started", START_DEADLINE_S)
    all_started_s = time.monotonic() - t0
    peak = [rss_kib(p) for p in pids]
    per_trial_kib = (sum(peak) - sum(base)) / N
    by_runner = {r: sum(1 for e in started if e.runner_id == r) for r in ("runner-0", "runner-1")}
    release.touch()
    took = await tap.all_imported(sub.experiment_id, set(sub.trial_ids), 180)
    check = await judge("1000 in flight, 2 runners", stack, sub, recovery_s=took)
    print(
        f"scale: in_flight={N} all_started_s={all_started_s:.1f} "
        f"rss_per_in_flight_trial_kib={per_trial_kib:.0f} split={by_runner}"
    )
    assert check.ok, check.explain()
    assert check.reruns == 0
    assert min(by_runner.values()) > 0
