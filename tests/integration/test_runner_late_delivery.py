"""A work message delivered after its fetch gave up (services/runner/consumer.py), on
the session's real nats-server, with holding handlers in place of the trial handler.

Under load the server's replies to a batch pull arrive after the runner's fetch window;
they land in the runner's subscription buffer. Runner A here has its one slot busy
with a trial held until the test ends, and a pull request of its own still open on
the server (what a fetch leaves behind when it gives up early), which brings the next
message into A's buffer. Runner B, idle, must get that message at once:

- with the sweep (the fix), A hands it back and B runs it;
- control: with the sweep made too slow to act, the message is shown to sit in A's
  buffer, where it stayed for the length of A's trial before (30 s in the capacity
  benchmark), and B gets nothing.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.aio.client import Client as NatsClient

from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import ensure_streams
from services.common.errors import ACK, Settle
from services.common.priority import PriorityClasses
from services.runner import consumer as consumer_module
from services.runner.attempt import KeepAlive
from services.runner.consumer import WorkConsumer, ensure_runner_consumers

pytestmark = pytest.mark.integration

CLASSES = PriorityClasses.parse("urgent=8,normal=3,batch=1")
WAIT_S = 60.0


class Holder:
    """Records each message's body and holds its slot until ``release`` is set."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.changed = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, data: bytes, keep_alive: KeepAlive, *, subject: str = "") -> Settle:
        self.bodies.append(data)
        self.changed.set()
        await self.release.wait()
        return ACK

    async def wait_for(self, n: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.bodies) < n:
                self.changed.clear()
                await self.changed.wait()


@pytest.mark.parametrize("sweep", [True, False], ids=["sweep", "control-no-sweep"])
async def test_a_late_delivery_to_a_full_runner_goes_to_a_free_one(
    nc: NatsClient, topology: Topology, monkeypatch: pytest.MonkeyPatch, sweep: bool
) -> None:
    if not sweep:
        monkeypatch.setattr(consumer_module, "LATE_SWEEP_S", 3600.0)
    js = nc.jetstream()
    await ensure_streams(js, topology)
    await ensure_runner_consumers(js, topology, 30, DEFAULT_POOL, CLASSES)
    subject = topology.work_subject("exp-late", DEFAULT_POOL, "normal")
    durable = topology.runner_durable_for(DEFAULT_POOL, CLASSES.durable_class("normal"))

    a_trials, b_trials = Holder(), Holder()
    a = WorkConsumer(js, topology, a_trials, concurrency=1, classes=CLASSES, runner_id="a")
    b = WorkConsumer(js, topology, b_trials, concurrency=1, classes=CLASSES, runner_id="b")
    loops = [asyncio.create_task(a.run())]
    try:
        await js.publish(subject, b"first")
        await a_trials.wait_for(1)  # A's only slot is busy now
        # A pull request of A's left open on the server, as a fetch that gave up
        # before the server answered leaves it: the next message goes to A's buffer.
        psub = a._queues["normal"].psub
        await nc.publish(psub._nms, json.dumps({"batch": 1}).encode(), reply=psub._deliver)
        await nc.flush()
        await js.publish(subject, b"late")
        async with asyncio.timeout(WAIT_S):
            info = js.consumer_info
            # The server's counters have no event to wait on: polled, within WAIT_S.
            while (await info(topology.work_stream, durable)).delivered.stream_seq < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        if not sweep:
            # The premise: delivered, and waiting in a runner that has no slot for it.
            async with asyncio.timeout(WAIT_S):
                while not psub.pending_msgs:  # noqa: ASYNC110 - a buffer's size, polled
                    await asyncio.sleep(0.05)
            print("late delivery: waiting in the full runner's buffer (no sweep)")
            assert a_trials.bodies == [b"first"] and not b_trials.bodies
            return
        loops.append(asyncio.create_task(b.run()))
        await b_trials.wait_for(1)
        print("late delivery: handed back by the full runner, run by the free one")
        assert b_trials.bodies == [b"late"]
        assert a_trials.bodies == [b"first"]  # A never ran more than its one slot
    finally:
        a_trials.release.set()
        b_trials.release.set()
        for c in (a, b):
            c.stop()
        await asyncio.gather(*loops)
        for c in (a, b):
            await c.drain(5)
