"""JetStreamBus.publish_many on a real nats-server: pipelined, acknowledged, deduplicated.

The submitter publishes a whole experiment's work through ``publish_many`` (nats-py's
``publish_async``, one reply subscription, at most ``window`` unacknowledged). Each
test checks what a submitter depends on: every message acknowledged once, copies
dropped by their msg id, a missing stream reported as transient after its retries,
and a refusal raised at once.
"""

from __future__ import annotations

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import StreamConfig
from nats.js.errors import APIError

from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus, ensure_streams
from services.common.errors import TransientError

pytestmark = pytest.mark.integration

N = 1_000


def _items(topology: Topology, n: int, tag: str) -> list[tuple[str, bytes, str]]:
    subject = f"{topology.prefix}.events.trial_started.exp-1"
    return [(subject, f'{{"i":{i}}}'.encode(), f"{tag}-{i}") for i in range(n)]


async def _messages(js: object, stream: str) -> int:
    info = await js.stream_info(stream)  # type: ignore[attr-defined]
    return int(info.state.messages)


async def test_each_message_is_acknowledged_once_and_copies_are_dropped(
    nc: NatsClient, topology: Topology
) -> None:
    js = nc.jetstream()
    await ensure_streams(js, topology)
    bus = JetStreamBus(js, topology)
    # A window far below N: the pipeline refills as acknowledgements come back.
    assert await bus.publish_many_raw(_items(topology, N, "a"), window=64) == [True] * N
    assert await _messages(js, topology.events_stream) == N
    # The same msg ids again (a CI retry of the submission): all dropped, none stored.
    again = _items(topology, N, "a")
    assert await bus.publish_many_raw(again, window=64) == [False] * N
    # Negative control: half new ids among old ones; exactly the new half is stored.
    mixed = again[: N // 2] + _items(topology, N, "b")[N // 2 :]
    flags = await bus.publish_many_raw(mixed, window=64)
    assert flags == [False] * (N // 2) + [True] * (N - N // 2)
    assert await _messages(js, topology.events_stream) == N + N - N // 2


async def test_no_stream_for_the_subject_is_transient_after_the_retries(
    nc: NatsClient, topology: Topology
) -> None:
    bus = JetStreamBus(nc.jetstream(), topology, timeout_s=1.0, attempts=2)
    # No ensure_streams: no stream listens on the subject, nothing answers.
    with pytest.raises(TransientError, match="did not acknowledge 10 of 10 messages"):
        await bus.publish_many_raw(_items(topology, 10, "c"))


async def test_a_refused_message_is_raised_at_once_not_retried(
    nc: NatsClient, topology: Topology
) -> None:
    js = nc.jetstream()
    subject = f"{topology.prefix}.small.x"
    await js.add_stream(
        StreamConfig(name=f"{topology.prefix}_SMALL", subjects=[subject], max_msg_size=64)
    )
    bus = JetStreamBus(js, topology, timeout_s=1.0, attempts=6)
    items = [(subject, b"x" * 32, "fits"), (subject, b"x" * 200, "too-big")]
    with pytest.raises(APIError, match="maximum"):
        await bus.publish_many_raw(items)
    # Negative control: the message that fits was stored; the refused one was not.
    assert await _messages(js, f"{topology.prefix}_SMALL") == 1
