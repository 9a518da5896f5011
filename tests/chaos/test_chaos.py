"""Chaos: a few hundred trials while runners are SIGKILLed and the importer restarted.

Run with `make chaos` (not part of `make test`: it takes a few minutes). The last
line it prints is ``chaos: submitted=N ledgered=N duplicates=D missing=M``.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from infra.stack import EmbeddedStack
from schemas.subjects import Topology
from tests.e2e.faultkit import figures, submit, wait_recorded, write_manifest

pytestmark = pytest.mark.chaos

RESULT = Path(__file__).resolve().parents[2] / ".trialbus" / "chaos-result.txt"
N = 400
CHAOS_S = 60.0


async def test_chaos(
    tmp_path: Path, nats_url: str, ledger_url: str, topology: Topology, ledger_db: str
) -> None:
    rng = random.Random(20261125)
    stack = EmbeddedStack(
        tmp_path / "stack",
        n_runners=3,
        concurrency=16,
        prefix=topology.prefix,
        ledger_db=ledger_db,
        nats_url=nats_url,
        ledger_url=ledger_url,
        runner_env={
            "TRIALBUS_EXECUTOR": "benchmarks.instant_executor:from_settings",
            "TRIALBUS_INSTANT_DELAY_S": "1.0",
            "TRIALBUS_ACK_WAIT_S": "4",
            "TRIALBUS_HEARTBEAT_S": "1",
        },
        extra_env={"TRIALBUS_BATCH_SIZE": "25"},
    )
    await asyncio.to_thread(stack.start)
    kills = restarts = 0
    try:
        result = await submit(
            nats_url, ledger_url, ledger_db, topology, write_manifest(tmp_path, N, concurrency=40)
        )
        t0 = time.monotonic()
        while time.monotonic() - t0 < CHAOS_S:
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            victim = stack.services[f"runner-{rng.randrange(3)}"]
            victim.kill()
            kills += 1
            victim.start()
            if rng.random() < 0.5:
                importer = stack.services["importer"]
                importer.kill()
                importer.start()
                restarts += 1
        recs, took = await wait_recorded(ledger_url, ledger_db, result.experiment_id, N, 300)
        fig = await figures(
            f"chaos ({kills} runner kills, {restarts} importer kills)",
            result,
            recs,
            nats_url,
            topology,
            took,
        )
        line = (
            f"chaos: submitted={fig.submitted} ledgered={fig.ledgered} "
            f"duplicates={fig.duplicates} missing={fig.missing}"
        )
        print(line)
        # `make chaos` prints this file last, after pytest's own summary.
        RESULT.parent.mkdir(exist_ok=True)
        RESULT.write_text(line + "\n")
        assert (fig.ledgered, fig.duplicates, fig.missing) == (N, 0, 0)
    finally:
        await asyncio.to_thread(stack.stop)
