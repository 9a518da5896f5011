"""Faults against real processes: every submitted trial ends with exactly one record.

Trials run on the instant (benchmark) executor with a delay, so each test controls
timing without Harbor's cost; the services, nats-server and the ledger are real
processes, and runners/importers are killed with SIGKILL where it says so.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.embedded import LedgerServer, NatsCluster, NatsServer
from infra.stack import EmbeddedStack
from schemas.events import TrialStarted
from schemas.subjects import Topology
from tests.e2e.faultkit import events_of, figures, submit, wait_recorded, write_manifest

pytestmark = pytest.mark.e2e

INSTANT = "benchmarks.instant_executor:from_settings"


def runner_env(delay_s: float, **extra: str) -> dict[str, str]:
    return {
        "TRIALBUS_EXECUTOR": INSTANT,
        "TRIALBUS_INSTANT_DELAY_S": str(delay_s),
        "TRIALBUS_ACK_WAIT_S": "4",
        "TRIALBUS_HEARTBEAT_S": "1",
        **extra,
    }


@pytest.fixture
def make_stack(tmp_path: Path, topology: Topology, ledger_db: str) -> Iterator[list[EmbeddedStack]]:
    stacks: list[EmbeddedStack] = []
    yield stacks
    for s in stacks:
        s.stop()


async def new_stack(
    stacks: list[EmbeddedStack], tmp_path: Path, topology: Topology, ledger_db: str, **kw: object
) -> EmbeddedStack:
    s = EmbeddedStack(
        tmp_path / f"stack{len(stacks)}",
        prefix=topology.prefix,
        ledger_db=ledger_db,
        **kw,  # type: ignore[arg-type]
    )
    stacks.append(s)
    await asyncio.to_thread(s.start)  # start() waits for readiness with its own loop
    return s


async def _started_on(nats_url: str, topo: Topology, runner_id: str) -> bool:
    return any(
        isinstance(e, TrialStarted) and e.runner_id == runner_id
        for e in await events_of(nats_url, topo)
    )


async def test_runner_killed_mid_trial_is_redelivered(
    make_stack: list[EmbeddedStack],
    tmp_path: Path,
    nats_url: str,
    ledger_url: str,
    topology: Topology,
    ledger_db: str,
) -> None:
    stack = await new_stack(
        make_stack,
        tmp_path,
        topology,
        ledger_db,
        nats_url=nats_url,
        ledger_url=ledger_url,
        n_runners=2,
        concurrency=4,
        runner_env=runner_env(3.0),
    )
    manifest = write_manifest(tmp_path, 12, concurrency=8)
    result = await submit(nats_url, ledger_url, ledger_db, topology, manifest)
    deadline = time.monotonic() + 20
    while not await _started_on(nats_url, topology, "runner-0"):
        assert time.monotonic() < deadline, "runner-0 never started a trial"
        await asyncio.sleep(0.1)
    killed_at = time.monotonic()
    stack.services["runner-0"].kill()
    recs, _ = await wait_recorded(ledger_url, ledger_db, result.experiment_id, 12, 90)
    fig = await figures(
        "runner SIGKILL mid-trial", result, recs, nats_url, topology, time.monotonic() - killed_at
    )
    assert (fig.ledgered, fig.duplicates, fig.missing) == (12, 0, 0)
    assert fig.rerun >= 1  # the killed runner's trials ran again elsewhere
    assert all(r.evaluation.reward_valid for r in recs)


async def test_importer_killed_mid_batch_imports_exactly_once(
    make_stack: list[EmbeddedStack],
    tmp_path: Path,
    nats_url: str,
    ledger_url: str,
    topology: Topology,
    ledger_db: str,
) -> None:
    stack = await new_stack(
        make_stack,
        tmp_path,
        topology,
        ledger_db,
        nats_url=nats_url,
        ledger_url=ledger_url,
        n_runners=1,
        concurrency=50,
        runner_env=runner_env(0.0),
        extra_env={"TRIALBUS_BATCH_SIZE": "20"},
    )
    manifest = write_manifest(tmp_path, 300)
    result = await submit(nats_url, ledger_url, ledger_db, topology, manifest)
    importer = stack.services["importer"]
    for _ in range(3):  # kill it three times while it works, restart each time
        await asyncio.sleep(0.4)
        importer.kill()
        importer.start()
    recs, took = await wait_recorded(ledger_url, ledger_db, result.experiment_id, 300, 120)
    fig = await figures("importer SIGKILL x3 mid-batch", result, recs, nats_url, topology, took)
    assert (fig.ledgered, fig.duplicates, fig.missing) == (300, 0, 0)


async def test_nats_restart_keeps_everything(
    make_stack: list[EmbeddedStack],
    tmp_path: Path,
    ledger_url: str,
    topology: Topology,
    ledger_db: str,
) -> None:
    with NatsServer(tmp_path / "own-nats") as nats_server:
        stack = await new_stack(
            make_stack,
            tmp_path,
            topology,
            ledger_db,
            nats_url=nats_server.url,
            ledger_url=ledger_url,
            n_runners=1,
            concurrency=10,
            runner_env=runner_env(0.5),
        )
        manifest = write_manifest(tmp_path, 60, concurrency=10)
        result = await submit(nats_server.url, ledger_url, ledger_db, topology, manifest)
        await asyncio.sleep(1.0)
        nats_server.stop()  # SIGTERM; file storage kept
        restarted_at = time.monotonic()
        nats_server.start()
        recs, _ = await wait_recorded(ledger_url, ledger_db, result.experiment_id, 60, 120)
        fig = await figures(
            "nats-server restart mid-run",
            result,
            recs,
            nats_server.url,
            topology,
            time.monotonic() - restarted_at,
        )
        assert (fig.ledgered, fig.duplicates, fig.missing) == (60, 0, 0)
        assert all(s.alive for s in stack.services.values())


async def test_ledger_outage_is_waited_out(
    make_stack: list[EmbeddedStack],
    tmp_path: Path,
    nats_url: str,
    topology: Topology,
    ledger_db: str,
) -> None:
    ledger = LedgerServer(tmp_path / "own-ledger").start()
    try:
        stack = await new_stack(
            make_stack,
            tmp_path,
            topology,
            ledger_db,
            nats_url=nats_url,
            ledger_url=ledger.url,
            n_runners=1,
            concurrency=20,
            runner_env=runner_env(0.2),
        )
        manifest = write_manifest(tmp_path, 100, concurrency=20)
        result = await submit(nats_url, ledger.url, ledger_db, topology, manifest)
        await asyncio.sleep(0.5)
        ledger.stop()
        await asyncio.sleep(5)  # the outage: trials keep finishing, nothing can be written
        back_at = time.monotonic()
        ledger.start()
        recs, _ = await wait_recorded(ledger.url, ledger_db, result.experiment_id, 100, 120)
        fig = await figures(
            "ledger down 5 s mid-run", result, recs, nats_url, topology, time.monotonic() - back_at
        )
        assert (fig.ledgered, fig.duplicates, fig.missing) == (100, 0, 0)
        assert stack.services["importer"].alive
    finally:
        ledger.stop()


async def test_cluster_node_killed_mid_experiment(
    make_stack: list[EmbeddedStack],
    tmp_path: Path,
    ledger_url: str,
    topology: Topology,
    ledger_db: str,
) -> None:
    with NatsCluster(tmp_path / "cluster") as cluster:
        urls = ",".join(cluster.urls)
        await new_stack(
            make_stack,
            tmp_path,
            topology,
            ledger_db,
            nats_url=urls,
            ledger_url=ledger_url,
            n_runners=1,
            concurrency=10,
            runner_env=runner_env(0.3),
            extra_env={"TRIALBUS_STREAM_REPLICAS": "3"},
        )
        manifest = write_manifest(tmp_path, 60, concurrency=10)
        result = await submit(cluster.urls[1], ledger_url, ledger_db, topology, manifest)
        await asyncio.sleep(1.0)
        cluster.kill(0)
        killed_at = time.monotonic()
        recs, _ = await wait_recorded(ledger_url, ledger_db, result.experiment_id, 60, 120)
        fig = await figures(
            "NATS cluster node SIGKILL",
            result,
            recs,
            cluster.urls[1],
            topology,
            time.monotonic() - killed_at,
        )
        assert (fig.ledgered, fig.duplicates, fig.missing) == (60, 0, 0)


async def test_concurrency_limit_holds_across_runners_and_cancel(
    make_stack: list[EmbeddedStack],
    tmp_path: Path,
    nats_url: str,
    ledger_url: str,
    topology: Topology,
    ledger_db: str,
) -> None:
    await new_stack(
        make_stack,
        tmp_path,
        topology,
        ledger_db,
        nats_url=nats_url,
        ledger_url=ledger_url,
        n_runners=2,
        concurrency=8,
        runner_env=runner_env(1.0),
    )
    limited = await submit(
        nats_url,
        ledger_url,
        ledger_db,
        topology,
        write_manifest(tmp_path, 12, name="limited", concurrency=3),
    )
    other = await submit(
        nats_url,
        ledger_url,
        ledger_db,
        topology,
        write_manifest(tmp_path, 10, name="other", concurrency=10),
    )
    # The other experiment is not held up by the limited one.
    _, other_took = await wait_recorded(ledger_url, ledger_db, other.experiment_id, 10, 60)
    recs, _ = await wait_recorded(ledger_url, ledger_db, limited.experiment_id, 12, 90)
    spans = sorted((r.timing.started_at, r.timing.finished_at) for r in recs if r.timing.started_at)
    peak = max(
        sum(1 for s, f in spans if s is not None and f is not None and s <= t < f)
        for t, _ in spans
        if t is not None
    )
    assert peak <= 3, f"{peak} trials of the limited experiment ran at once"
    assert other_took < 10
    await figures("concurrency limit 3 across 2 runners", limited, recs, nats_url, topology)


async def test_retry_exhaustion_becomes_a_partial_record(
    make_stack: list[EmbeddedStack],
    tmp_path: Path,
    nats_url: str,
    ledger_url: str,
    topology: Topology,
    ledger_db: str,
) -> None:
    await new_stack(
        make_stack,
        tmp_path,
        topology,
        ledger_db,
        nats_url=nats_url,
        ledger_url=ledger_url,
        n_runners=1,
        concurrency=4,
        runner_env=runner_env(0.0, TRIALBUS_INSTANT_FAIL_WITH="EnvironmentStartTimeoutError"),
    )
    result = await submit(
        nats_url,
        ledger_url,
        ledger_db,
        topology,
        write_manifest(tmp_path, 4, max_attempts=3, backoff_s=0.1),
    )
    recs, _ = await wait_recorded(ledger_url, ledger_db, result.experiment_id, 4, 60)
    for rec in recs:
        assert rec.status == "partial"
        assert rec.evaluation.failure_class == "infrastructure"
        assert not rec.evaluation.reward_valid
        assert rec.attempts == 3
        assert any("EnvironmentStartTimeoutError" in e for e in rec.errors)
    starts = [e for e in await events_of(nats_url, topology) if isinstance(e, TrialStarted)]
    assert len(starts) == 12  # 4 trials x 3 attempts, then the dead-letter record


async def test_cancel_drops_queued_and_stops_running(
    make_stack: list[EmbeddedStack],
    tmp_path: Path,
    nats_url: str,
    ledger_url: str,
    topology: Topology,
    ledger_db: str,
) -> None:
    from services.common.settings import CommonSettings
    from services.submitter.commands import cancel_experiment

    await new_stack(
        make_stack,
        tmp_path,
        topology,
        ledger_db,
        nats_url=nats_url,
        ledger_url=ledger_url,
        n_runners=1,
        concurrency=4,
        runner_env=runner_env(30.0),
    )
    result = await submit(
        nats_url, ledger_url, ledger_db, topology, write_manifest(tmp_path, 20, concurrency=2)
    )
    deadline = time.monotonic() + 20
    while not await _started_on(nats_url, topology, "runner-0"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    settings = CommonSettings(
        nats_url=nats_url, ledger_url=ledger_url, ledger_db=ledger_db, prefix=topology.prefix
    )
    await cancel_experiment(settings, result.experiment_id)
    recs, took = await wait_recorded(ledger_url, ledger_db, result.experiment_id, 20, 30)
    assert took < 15  # nobody waited for the 30 s trials
    assert {r.evaluation.failure_class for r in recs} == {"cancelled"}
    assert not any(r.evaluation.reward_valid for r in recs)
    await figures("cancel 20 trials (2 running)", result, recs, nats_url, topology, took)


async def test_runner_drains_on_sigterm(
    make_stack: list[EmbeddedStack],
    tmp_path: Path,
    nats_url: str,
    ledger_url: str,
    topology: Topology,
    ledger_db: str,
) -> None:
    stack = await new_stack(
        make_stack,
        tmp_path,
        topology,
        ledger_db,
        nats_url=nats_url,
        ledger_url=ledger_url,
        n_runners=1,
        concurrency=3,
        runner_env=runner_env(2.0),
    )
    result = await submit(
        nats_url, ledger_url, ledger_db, topology, write_manifest(tmp_path, 9, concurrency=9)
    )
    deadline = time.monotonic() + 20
    while not await _started_on(nats_url, topology, "runner-0"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    runner = stack.services["runner-0"]
    runner.signal(signal.SIGTERM)
    assert runner.proc is not None
    assert await asyncio.to_thread(runner.proc.wait, 30) == 0  # drained and exited cleanly
    await asyncio.to_thread(stack.add_runner)
    recs, _ = await wait_recorded(ledger_url, ledger_db, result.experiment_id, 9, 60)
    fig = await figures("runner SIGTERM drain", result, recs, nats_url, topology)
    assert (fig.ledgered, fig.duplicates, fig.missing, fig.rerun) == (9, 0, 0, 0)
