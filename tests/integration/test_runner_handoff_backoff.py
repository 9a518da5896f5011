"""A runner that can run none of what it fetches backs off its fetching
(services/runner/consumer.py ``HANDOFF_BACKOFF_S``), on the session's real nats-server.

Its handler hands every trial off to a peer (``nak``, no delay, reason ``handoff``),
as a runner without the key the queued trials need does. With the back-off (here a
fixed second) it handles a few messages in three seconds; the control, the same
verdicts as plain hand-backs (a pause, a full lease: no back-off), cycles through the
queue without pause. The benchmark ``handoff`` (docs/performance.md) measures what the
back-off spares the runner that has the key.
"""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient

from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import ensure_streams
from services.common.errors import Settle, nak
from services.common.priority import PriorityClasses
from services.runner import consumer as consumer_module
from services.runner.attempt import KeepAlive
from services.runner.consumer import WorkConsumer, ensure_runner_consumers

pytestmark = pytest.mark.integration

CLASSES = PriorityClasses.parse("normal=1")
WINDOW_S = 3.0
BACKOFF_S = 1.0


class GivesAway:
    """Hands every message back with ``reason`` and counts the messages it was given."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.calls = 0

    async def __call__(self, data: bytes, keep_alive: KeepAlive, *, subject: str = "") -> Settle:
        self.calls += 1
        return nak(0.0, "handoff" if self.reason == "handoff" else "handback")


@pytest.mark.parametrize("reason", ["handoff", "handback"], ids=["handoff", "control-handback"])
async def test_a_runner_handing_off_everything_stops_cycling_the_queue(
    nc: NatsClient, topology: Topology, monkeypatch: pytest.MonkeyPatch, reason: str
) -> None:
    monkeypatch.setattr(consumer_module, "HANDOFF_BACKOFF_S", (BACKOFF_S, BACKOFF_S))
    js = nc.jetstream()
    await ensure_streams(js, topology)
    await ensure_runner_consumers(js, topology, 30, DEFAULT_POOL, CLASSES)
    subject = topology.work_subject("exp-keyed", DEFAULT_POOL, "normal")
    for i in range(8):
        await js.publish(subject, f"trial-{i}".encode())
    handler = GivesAway(reason)
    runner = WorkConsumer(js, topology, handler, concurrency=1, classes=CLASSES, runner_id="r")
    loop = asyncio.create_task(runner.run())
    try:
        await asyncio.sleep(WINDOW_S)  # the window the calls are counted in
    finally:
        runner.stop()
        await loop
        await runner.drain(5)
    print(f"{reason}: {handler.calls} messages handled in {WINDOW_S:.0f} s")
    if reason == "handoff":
        # One fetch, then one per second at most (load only makes it fewer).
        assert 1 <= handler.calls <= WINDOW_S / BACKOFF_S + 1
    else:
        assert handler.calls > 3 * (WINDOW_S / BACKOFF_S + 1)
