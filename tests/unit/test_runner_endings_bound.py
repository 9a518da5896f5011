"""Trials ending at once settle a few at a time, in turn (services/runner/handlers.py).

Forty trials of one runner end at the same moment, as a burst admitted together does
(the capacity benchmark: 2,000 trials of 30 s). Each ending stores the trial folder
(an object store put, a few loop turns here as round trips are) and publishes its
TrialCompleted. Unbounded, the puts are in flight together and advance in lockstep, so
no TrialCompleted goes out before (nearly) every folder is being stored; the importer
then gets the whole burst at its end. Bounded by ``endings``, at most that
many are stored at once and the first endings are published while later ones wait.
Control: a bound of 40 lets the puts overlap, as before (the folders are packed in
worker threads, so how many overlap varies, always well over 4).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from schemas.events import Envelope, TrialCompleted, encode_event
from schemas.objects import ObjectRef
from services.common.adapters.memory import InMemoryCoordinator, RecordingBus
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.errors import ACK
from services.common.trial_folders import TrialFolders
from services.runner.handlers import TrialHandler
from tests.unit.runner_support import held_completion, make_request

N = 40
ROUND_TRIP_S = 0.02  # a put's requests, simulated (the folders are packed in threads,
ROUND_TRIPS = 5  # so a put must outlast packing for the unbounded puts to overlap)


class CountingStore(InMemoryObjectStore):
    """Counts puts in flight; ``order`` logs each put's start and each publish."""

    def __init__(self, order: list[str]) -> None:
        super().__init__("RESULTS")
        self.in_flight = 0
        self.most = 0
        self.order = order

    async def put(self, name: str, data: bytes) -> ObjectRef:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.order.append("put")
        try:
            for _ in range(ROUND_TRIPS):
                await asyncio.sleep(ROUND_TRIP_S)
            return await super().put(name, data)
        finally:
            self.in_flight -= 1


class OrderBus(RecordingBus):
    """A RecordingBus that logs each TrialCompleted into the shared ``order``."""

    def __init__(self, order: list[str]) -> None:
        super().__init__()
        self.order = order

    async def publish(self, event: Envelope, *, msg_id: str | None = None) -> bool:
        if isinstance(event, TrialCompleted):
            self.order.append("completed")
        return await super().publish(event, msg_id=msg_id)


async def _no_op() -> None:
    return None


@pytest.mark.parametrize(("endings", "bounded"), [(4, True), (N, False)])
async def test_a_burst_of_endings_settles_a_few_at_a_time(
    tmp_path: Path, endings: int, bounded: bool
) -> None:
    order: list[str] = []
    store = CountingStore(order)
    executor = held_completion(tmp_path)
    handler = TrialHandler(
        OrderBus(order),
        executor,
        InMemoryCoordinator(lease_ttl_s=60.0),
        TrialFolders(store, cap_bytes=1 << 20, retry_delays_s=()),
        runner_id="runner-1",
        host="node-a",
        heartbeat_s=30.0,
        admission=N,
        endings=endings,
        rng=random.Random(7),
    )
    requests = [make_request(f"hello__{i:04d}", limit=N, experiment_trials=N) for i in range(N)]
    tasks = [
        asyncio.create_task(handler.handle(encode_event(r), _no_op, subject="p.work.exp-1"))
        for r in requests
    ]
    async with asyncio.timeout(30):
        while len(executor.calls) < N:  # every trial running
            executor.running.clear()
            await executor.running.wait()
    executor.release.set()  # all forty end at the same moment
    assert await asyncio.gather(*tasks) == [ACK] * N
    first_completed = order.index("completed")
    puts_before = order[:first_completed].count("put")
    print(f"endings={endings}: at most {store.most} puts at once, {puts_before} before the first")
    if bounded:
        assert store.most <= endings
        assert puts_before <= endings  # the first ending did not wait for the whole burst
    else:  # control: unbounded, the burst's puts overlap and the endings come at its end
        assert store.most > 4 and puts_before > 4, (store.most, puts_before)
