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
from nats.js.errors import KeyNotFoundError

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
