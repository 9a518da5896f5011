"""1,000 slow trials in flight across two runner processes on this 2-core machine."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from infra.stack import EmbeddedStack
from schemas.events import TrialStarted
from schemas.subjects import Topology
from tests.e2e.faultkit import events_of, figures, submit, wait_recorded, write_manifest

pytestmark = pytest.mark.e2e

N = 1000
DELAY_S = 60.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_thousand_trials_in_flight_across_two_runners(
    tmp_path: Path, nats_url: str, ledger_url: str, topology: Topology, ledger_db: str
) -> None:
    stack = EmbeddedStack(
        tmp_path / "stack",
        n_runners=2,
        concurrency=N // 2,
        prefix=topology.prefix,
        ledger_db=ledger_db,
        nats_url=nats_url,
        ledger_url=ledger_url,
        runner_env={
            "TRIALBUS_EXECUTOR": "benchmarks.instant_executor:from_settings",
            "TRIALBUS_INSTANT_DELAY_S": str(DELAY_S),
        },
    )
    await asyncio.to_thread(stack.start)
    try:
        runners = [stack.services[f"runner-{i}"] for i in range(2)]
        pids = [r.proc.pid for r in runners if r.proc is not None]
        base = [rss_kib(p) for p in pids]
        result = await submit(
            nats_url, ledger_url, ledger_db, topology, write_manifest(tmp_path, N, concurrency=N)
        )
        t0 = time.monotonic()
        while True:
            started = [
                e for e in await events_of(nats_url, topology) if isinstance(e, TrialStarted)
            ]
            if len(started) >= N:
                break
            assert time.monotonic() - t0 < DELAY_S - 5, f"only {len(started)} started"
            await asyncio.sleep(1.0)
        all_started_s = time.monotonic() - t0
        peak = [rss_kib(p) for p in pids]
        per_trial_kib = (sum(peak) - sum(base)) / N
        by_runner = {
            r: sum(1 for e in started if e.runner_id == r) for r in ("runner-0", "runner-1")
        }
        recs, took = await wait_recorded(ledger_url, ledger_db, result.experiment_id, N, 180)
        fig = await figures("1000 in flight, 2 runners", result, recs, nats_url, topology, took)
        print(
            f"scale: in_flight={N} all_started_s={all_started_s:.1f} "
            f"rss_per_in_flight_trial_kib={per_trial_kib:.0f} split={by_runner}"
        )
        assert (fig.ledgered, fig.duplicates, fig.missing, fig.rerun) == (N, 0, 0, 0)
        assert min(by_runner.values()) > 0
    finally:
        await asyncio.to_thread(stack.stop)
