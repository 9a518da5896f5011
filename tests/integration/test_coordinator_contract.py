"""The Coordinator contract (tests/unit/test_coordinator.py) against NatsCoordinator.

Two runners are two connections to the session's real nats-server, each with its own
NatsCoordinator over the same KV buckets (named by this test's unique topology). A
behaviour the in-memory fake has and the KV adapter lacks (or the reverse) fails here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from schemas.subjects import Topology
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.ports import Lease
from tests.unit.test_coordinator import CoordinatorContract, World

pytestmark = pytest.mark.integration

# Short enough for a quick test, long enough that a renew 1.2 s in is safely inside
# it on a loaded 2-core machine.
TTL_S = 2.0
EXPIRY_DEADLINE_S = 30.0


class TestNatsCoordinator(CoordinatorContract):
    """The contract against NATS KV on a real server."""

    @pytest.fixture
    async def world(self, nats_url: str, topology: Topology) -> AsyncIterator[World]:
        nc_a = await nats.connect(nats_url)
        nc_b = await nats.connect(nats_url)
        try:
            a = await NatsCoordinator.open(nc_a.jetstream(), topology, lease_ttl_s=TTL_S)
            b = await NatsCoordinator.open(nc_b.jetstream(), topology, lease_ttl_s=TTL_S)
            leases = await nc_a.jetstream().key_value(
                f"{topology.work_stream.removesuffix('_WORK')}_LEASES"
            )

            async def advance(seconds: float) -> None:
                # The server expires keys on its own clock: letting real time pass is
                # the only way to age a lease.
                await asyncio.sleep(seconds)

            async def expired(lease: Lease) -> None:
                deadline = time.monotonic() + EXPIRY_DEADLINE_S
                while True:
                    try:
                        await leases.get(lease.key)
                    except KeyNotFoundError:
                        return
                    assert time.monotonic() < deadline, f"lease {lease.key} never expired"
                    await asyncio.sleep(0.1)

            yield World(a, b, TTL_S, advance, expired)
        finally:
            await nc_a.close()
            await nc_b.close()


async def test_a_released_slot_leaves_no_marker_so_the_next_take_is_one_write(
    nc: NatsClient, topology: Topology
) -> None:
    """``release`` purges the key's subject: nothing stays for a conditional take to trip on."""
    js = nc.jetstream()
    coord = await NatsCoordinator.open(js, topology, lease_ttl_s=60.0)
    stream = f"KV_{topology.leases_bucket}"
    subject = f"$KV.{topology.leases_bucket}.exp-1.0"

    async def messages_on_slot() -> int:
        info = await js.stream_info(stream, subjects_filter=subject)
        return (info.state.subjects or {}).get(subject, 0)

    lease = await coord.acquire("exp-1", 1, "runner-a")
    assert lease is not None and await messages_on_slot() == 1
    await coord.release(lease)
    assert await messages_on_slot() == 0
    # The slot's next take is the conditional write alone (expected last sequence 0).
    leases = await js.key_value(topology.leases_bucket)
    await leases.update("exp-1.0", b"runner-b", last=0)
    # Negative control: a KV purge (how slots were released before) leaves a marker,
    # and the same write is refused.
    await leases.purge("exp-1.0")
    assert await messages_on_slot() == 1
    with pytest.raises(KeyWrongLastSequenceError):
        await leases.update("exp-1.0", b"runner-c", last=0)
