"""The runner's fetch loop over priority classes (services/runner/consumer.py), on the
session's real nats-server, with a recording handler in place of the trial handler.

Concurrency 1 makes every start a decision of the loop; the order is the handler's
call order, never the clock:

- work queued in two classes is taken by weight (urgent 8, batch 1), batch is never
  starved, and a class alone is taken to the end;
- an urgent message handed back (nak with a delay, as a full experiment lease or a
  retry's backoff do) is taken again while batch work still waits: a hand-back sits
  among the unacknowledged messages, which a class's "pending" count leaves out;
- a class this runner preempted (``reserve(urgent, instead_of=batch)``) yields: no
  batch start while urgent work waits, then batch again (control: no preemption, the
  weighted share gives batch its pick among the urgent ones).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from nats.aio.client import Client as NatsClient

from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import ensure_streams
from services.common.errors import ACK, Settle, nak
from services.common.priority import PriorityClasses
from services.runner.attempt import KeepAlive
from services.runner.consumer import WorkConsumer, ensure_runner_consumers

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("class_consumers")]

CLASSES = PriorityClasses.parse("urgent=8,normal=3,batch=1")
WAIT_S = 60.0


@pytest.fixture
async def class_consumers(nc: NatsClient, topology: Topology) -> None:
    """The work streams and the default pool's consumer per class, as a runner makes
    them at start: every test here queues work into them before the loop runs."""
    js = nc.jetstream()
    await ensure_streams(js, topology)
    await ensure_runner_consumers(js, topology, 30, DEFAULT_POOL, CLASSES)


class Recorder:
    """Handles each message as ``verdict`` says; records (class, body) per call."""

    def __init__(self, verdict: Callable[[str, bytes, int], Settle], hold_s: float) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self._verdict = verdict
        self._hold_s = hold_s
        self.changed = asyncio.Event()

    async def __call__(self, data: bytes, keep_alive: KeepAlive, *, subject: str = "") -> Settle:
        cls = subject.split(".")[3] if subject.count(".") == 4 else "normal"
        seen = sum(1 for c in self.calls if c == (cls, data))
        self.calls.append((cls, data))
        self.changed.set()
        await asyncio.sleep(self._hold_s)  # a trial's run: the one slot is busy
        return self._verdict(cls, data, seen)


async def _run_until(
    nc: NatsClient,
    topo: Topology,
    recorder: Recorder,
    done: Callable[[], bool],
    preempted: str | None = None,
) -> None:
    consumer = WorkConsumer(
        nc.jetstream(), topo, recorder, concurrency=1, pool=DEFAULT_POOL, classes=CLASSES
    )
    if preempted is not None:  # as the preemption watch does for a batch victim
        consumer.reserve("urgent", instead_of=preempted)
    loop = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(WAIT_S):
            while not done():
                recorder.changed.clear()
                await recorder.changed.wait()
    finally:
        consumer.stop()
        await loop
        await consumer.drain(5)


async def _queue(nc: NatsClient, topo: Topology, cls: str | None, n: int, tag: str) -> None:
    js = nc.jetstream()
    for i in range(n):
        await js.publish(topo.work_subject(f"exp-{tag}", DEFAULT_POOL, cls), f"{tag}{i}".encode())


async def test_queued_classes_are_taken_by_weight(nc: NatsClient, topology: Topology) -> None:
    await _queue(nc, topology, "batch", 20, "b")
    await _queue(nc, topology, "urgent", 12, "u")
    await _queue(nc, topology, None, 2, "n")  # unclassed: the default class
    recorder = Recorder(lambda *_: ACK, hold_s=0.0)
    await _run_until(nc, topology, recorder, lambda: len(recorder.calls) == 34)
    order = "".join(c[0][0].upper() for c in recorder.calls)
    print(f"classes: order={order}")
    last_u = order.rindex("U")
    # Urgent first, by weight (batch gets 1 pick in 12 while all three wait, and the
    # picks start afresh when normal runs out); first-in first-out would run 20 batch.
    assert order[:last_u].count("B") <= 3, order
    assert "B" in order[order.index("U") : last_u], order  # batch not starved
    assert order.count("N") == 2 and order.index("N") < last_u, order  # normal too
    assert sorted(recorder.calls) == sorted(set(recorder.calls))  # each once


async def test_a_handed_back_urgent_message_comes_back_while_batch_waits(
    nc: NatsClient, topology: Topology
) -> None:
    await _queue(nc, topology, "batch", 200, "b")
    await _queue(nc, topology, "urgent", 1, "u")

    def verdict(cls: str, _data: bytes, seen: int) -> Settle:
        # The urgent message is handed back once, as a full lease would.
        return nak(0.3, "handback") if cls == "urgent" and seen == 0 else ACK

    recorder = Recorder(verdict, hold_s=0.02)

    def urgent_twice() -> bool:
        return sum(1 for c in recorder.calls if c[0] == "urgent") == 2

    await _run_until(nc, topology, recorder, urgent_twice)
    classes = [c[0] for c in recorder.calls]
    first = classes.index("urgent")
    between = classes[first + 1 :].count("batch")
    print(f"classes: handed-back urgent came back after {between} batch starts")
    assert classes[0] == "urgent"
    # Back after its 0.3 s delay plus at most one look (1 s) of 20 ms batch trials,
    # far from the 200 a loop blind to hand-backs would run first.
    assert between < 150, between


@pytest.mark.parametrize("preempted", ["batch", None])
async def test_a_preempted_class_yields_while_urgent_waits(
    nc: NatsClient, topology: Topology, preempted: str | None
) -> None:
    await _queue(nc, topology, "batch", 6, "b")
    await _queue(nc, topology, "urgent", 12, "u")
    recorder = Recorder(lambda *_: ACK, hold_s=0.0)
    await _run_until(nc, topology, recorder, lambda: len(recorder.calls) == 18, preempted)
    order = "".join(c[0][0].upper() for c in recorder.calls)
    print(f"classes: preempted={preempted} order={order}")
    if preempted:
        # Every urgent message first, then batch: it stopped yielding once none waited.
        assert order == "U" * 12 + "B" * 6, order
    else:
        # Negative control: nothing preempted, the weighted share (1 batch pick in 9).
        assert "B" in order[: order.rindex("U")], order
