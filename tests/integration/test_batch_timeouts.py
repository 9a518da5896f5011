"""A batch the importer and watcher fetched is handled, whatever timeout ends its window.

FastStream 0.7.8's batched pull fills a batch with several fetches and stops at
``nats.errors.TimeoutError`` only; nats-py 2.16 raises the builtin ``TimeoutError`` when
the window runs out before its lingering pull is sent. Unhandled, that drops the batch
fetched so far, and its messages come back only after ack_wait (the importer's 10 s
stalls). ``subscribe_batches`` keeps the batch (``keep_batches_on_timeout``).

The fault is planted where nats-py raises it: every follow-up fetch of a batch window
(one asking for fewer messages than the batch size) raises the builtin error, against a
real nats-server. ack_wait is long, so a redelivery cannot stand in for the first
delivery. The control is FastStream's own subscriber with the same options: it loses
the batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from faststream.middlewares import AckPolicy
from faststream.nats import ConsumerConfig, JStream, NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from infra.nats_auth import broker_auth
from schemas.subjects import Topology
from services.common.adapters.faststream_consumer import BatchDurable, subscribe_batches
from services.common.adapters.jetstream import ensure_streams
from services.common.errors import ACK, Settle

BATCH = 50
EVENTS = 5
ACK_WAIT_S = 120.0
"""Far beyond every wait below: a message seen here was delivered once, not again."""
CONTROL_WAIT_S = 5.0
"""How long the control waits for a batch that must not come (it would in < 1 s)."""

Seen = list[tuple[int, int]]
"""(stream sequence, delivery count) of every message a handler got."""


@pytest.fixture
def follow_up_fetches_time_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fetch asking for fewer than BATCH messages raises the builtin TimeoutError,
    as nats-py's ``_fetch_n`` does when the window ends before its lingering pull."""
    real = JetStreamContext.PullSubscription.fetch

    async def fetch(
        self: JetStreamContext.PullSubscription,
        batch: int = 1,
        timeout: float | None = 5,  # noqa: ASYNC109 - nats-py's own signature
        heartbeat: float | None = None,
    ) -> list[Msg]:
        if batch < BATCH:
            raise TimeoutError
        return await real(self, batch, timeout, heartbeat)

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", fetch)


async def _deliveries(
    nats_url: str,
    nc: NatsClient,
    topology: Topology,
    subscribe: Callable[[NatsBroker, Callable[[list[Msg]], Awaitable[Sequence[Settle]]]], None],
    until: Callable[[Seen], bool],
    wait_s: float,
) -> Seen:
    """Publish EVENTS events once the subscriber runs; what it got within ``wait_s``."""
    js = nc.jetstream()
    await ensure_streams(js, topology)
    seen: Seen = []
    changed = asyncio.Event()

    async def handle(raws: list[Msg]) -> list[Settle]:
        seen.extend((r.metadata.sequence.stream, r.metadata.num_delivered) for r in raws)
        changed.set()
        return [ACK] * len(raws)

    broker = NatsBroker([nats_url], logger=None)
    subscribe(broker, handle)
    await broker.start()
    try:
        for i in range(EVENTS):
            subject = topology.event_subject("trial_completed", f"exp{i}")
            await js.publish(subject, b"{}")
        async with asyncio.timeout(wait_s):
            while not until(seen):
                changed.clear()
                await changed.wait()
    except TimeoutError:
        pass
    finally:
        await broker.stop()
    return seen


def _ours(topology: Topology) -> Callable[[NatsBroker, Any], None]:
    def subscribe(broker: NatsBroker, handle: Any) -> None:
        subscribe_batches(
            broker,
            broker_auth(None, "importer"),
            handle,
            subject=topology.event_filter(),
            stream=topology.events_stream,
            durable=BatchDurable(
                topology.importer_durable,
                batch_size=BATCH,
                batch_timeout_s=1.0,
                ack_wait_s=ACK_WAIT_S,
            ),
        )

    return subscribe


def _faststreams_own(topology: Topology) -> Callable[[NatsBroker, Any], None]:
    def subscribe(broker: NatsBroker, handle: Any) -> None:
        async def on_batch(msg: NatsMessage) -> None:
            raws: list[Msg] = list(msg.raw_message)  # type: ignore[call-overload]  # a batch
            await handle(raws)
            await asyncio.gather(*(r.ack() for r in raws))

        broker.subscriber(
            topology.event_filter(),
            stream=JStream(topology.events_stream, declare=False),
            durable=topology.importer_durable,
            pull_sub=PullSub(batch_size=BATCH, timeout=1.0, batch=True),
            ack_policy=AckPolicy.MANUAL,
            config=ConsumerConfig(ack_wait=ACK_WAIT_S, max_deliver=-1),
        )(on_batch)

    return subscribe


@pytest.mark.usefixtures("follow_up_fetches_time_out")
async def test_a_batch_is_handled_when_its_window_ends_in_the_builtin_timeout(
    nats_url: str, nc: NatsClient, topology: Topology
) -> None:
    seen = await _deliveries(
        nats_url, nc, topology, _ours(topology), lambda s: len(s) >= EVENTS, wait_s=60
    )
    assert len(seen) == EVENTS, f"{len(seen)} of {EVENTS} events handled: {seen}"
    assert [n for _, n in seen] == [1] * EVENTS, f"redelivered, not kept: {seen}"


@pytest.mark.usefixtures("follow_up_fetches_time_out")
async def test_control_faststreams_own_loop_drops_the_batch(
    nats_url: str, nc: NatsClient, topology: Topology
) -> None:
    seen = await _deliveries(
        nats_url, nc, topology, _faststreams_own(topology), bool, wait_s=CONTROL_WAIT_S
    )
    assert seen == [], f"FastStream's loop kept the batch: {seen} (is the wrap still needed?)"


@pytest.mark.parametrize("loop", ["ours", "faststreams_own"])
async def test_without_the_fault_both_loops_handle_every_event(
    nats_url: str, nc: NatsClient, topology: Topology, loop: str
) -> None:
    """The control's loss is the fault's doing, not a difference in the set-ups."""
    subscribe = _ours(topology) if loop == "ours" else _faststreams_own(topology)
    seen = await _deliveries(
        nats_url, nc, topology, subscribe, lambda s: len(s) >= EVENTS, wait_s=60
    )
    assert [n for _, n in seen] == [1] * EVENTS, seen
