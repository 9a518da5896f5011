"""A team's concurrency quota across two runners, on the real nats-server.

Two runner handlers, each with its own connection and NatsCoordinator over the same
leases bucket (this test's unique topology), are fed the trials of two experiments of
one team. Each work message is delivered again after the delay its hand-back asked for,
as JetStream would. The executor counts the team's trials running at once: with
``max_concurrent_trials`` N the count never passes N; the negative control, the same
work with the quota off (no team on the messages), passes N.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from schemas.events import TeamRef, TrialRequested, encode_event
from schemas.subjects import Topology
from services.common.adapters.memory import RecordingBus
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.errors import Settle
from services.common.ports import ExecutionOutcome, LogSink
from services.runner.handlers import TrialHandler
from tests.unit.runner_support import completed, make_request, trial_folders

pytestmark = pytest.mark.integration

TEAM_LIMIT = 2
TRIALS_PER_EXPERIMENT = 6
# How long each trial "runs": long enough that both runners' trials overlap.
RUN_S = 0.3
DEADLINE_S = 120.0


class CountingExecutor:
    """Counts trials running at once (both runners share it: one process)."""

    name = "counting"
    version = "0.0.0"

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self.running = 0
        self.most = 0
        self.ran: list[str] = []

    async def run(
        self, request: TrialRequested, attempt: int, on_log: LogSink | None
    ) -> ExecutionOutcome:
        """Hold the trial for RUN_S, counting it while it runs."""
        self.running += 1
        self.most = max(self.most, self.running)
        self.ran.append(request.trial_id)
        try:
            await asyncio.sleep(RUN_S)
        finally:
            self.running -= 1
        return completed(self._tmp, request.trial_id)


@pytest.fixture
async def coordinators(nats_url: str, topology: Topology) -> AsyncIterator[list[NatsCoordinator]]:
    clients = [await nats.connect(nats_url) for _ in range(2)]
    try:
        yield [
            await NatsCoordinator.open(c.jetstream(), topology, lease_ttl_s=30.0) for c in clients
        ]
    finally:
        for c in clients:
            await c.close()


def work(team: TeamRef | None) -> list[TrialRequested]:
    """Two experiments of the team; neither's own limit binds (6 trials, limit 8)."""
    return [
        make_request(
            f"hello__{exp}{i:03d}", experiment_id=exp, limit=8, experiment_trials=6
        ).model_copy(update={"team": team})
        for exp in ("exp-a", "exp-b")
        for i in range(TRIALS_PER_EXPERIMENT)
    ]


async def run_fleet(
    coordinators: list[NatsCoordinator], requests: list[TrialRequested], tmp: Path
) -> tuple[CountingExecutor, int]:
    """Deliver every message to the two runners alternately until each is acked;
    returns the executor and how many hand-backs there were."""
    executor = CountingExecutor(tmp)
    handlers = [
        TrialHandler(
            RecordingBus(),
            executor,
            coord,
            trial_folders(),
            runner_id=f"runner-{i}",
            host=f"node-{i}",
            heartbeat_s=10.0,
        )
        for i, coord in enumerate(coordinators)
    ]
    handbacks = 0

    async def beat() -> None:
        return None

    async def deliver(i: int, request: TrialRequested) -> None:
        nonlocal handbacks
        data = encode_event(request)
        while True:
            # Redeliveries go to either runner, as a shared durable would.
            verdict: Settle = await handlers[i % 2].handle(data, beat)
            if verdict.action == "ack":
                return
            assert verdict.reason == "handback", verdict
            handbacks += 1
            i += 1
            await asyncio.sleep(verdict.delay_s)  # JetStream's redelivery after the nak

    await asyncio.wait_for(
        asyncio.gather(*(deliver(i, r) for i, r in enumerate(requests))), DEADLINE_S
    )
    return executor, handbacks


async def test_a_team_never_runs_more_than_its_quota_across_two_runners(
    coordinators: list[NatsCoordinator], tmp_path: Path
) -> None:
    team = TeamRef(name="red.team@x", max_concurrent_trials=TEAM_LIMIT)
    executor, handbacks = await run_fleet(coordinators, work(team), tmp_path)
    assert sorted(executor.ran) == sorted(r.trial_id for r in work(team))  # each once
    assert executor.most == TEAM_LIMIT, executor.most
    assert handbacks > 0
    # Every team slot was given back.
    for coord in coordinators:
        assert await coord.acquire_team(team.name, TEAM_LIMIT, "after") is not None


async def test_with_the_quota_off_the_team_runs_more_than_that(
    coordinators: list[NatsCoordinator], tmp_path: Path
) -> None:
    # Negative control: the same work without a team on the messages.
    executor, handbacks = await run_fleet(coordinators, work(None), tmp_path)
    assert len(executor.ran) == 2 * TRIALS_PER_EXPERIMENT
    assert executor.most > TEAM_LIMIT, executor.most
    assert handbacks == 0
