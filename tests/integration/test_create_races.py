"""Services starting at once on a fresh server each create what JetStream lacks.

Two services both find a bucket (or stream) missing and both create it; when their
settings differ (the runner's lease TTL is its ack wait, the submitter's is its own)
the slower create is refused with "stream name already in use with a different
configuration". That refusal once stopped a runner at start. The one who looked
second must use what the first created.

Each case is made certain rather than left to timing: the JetStream context under test
answers its first look "missing" right after another connection to the same real
nats-server has created the thing with other settings, as happens when the other
service's create lands between the look and the create.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError

from schemas.subjects import Topology
from services.common.adapters.jetstream import ensure_streams, kv_config, stream_configs
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.adapters.nats_objects import BucketSettings, NatsObjectStore
from services.common.adapters.nats_registry import NatsRunnerRegistry

pytestmark = pytest.mark.integration


@dataclass
class CreatedMeanwhile:
    """A real JetStream context whose first look (``look``) at ``name`` answers
    "missing" (``missing``) just after ``create_first`` has created it over another
    connection."""

    js: JetStreamContext
    look: str
    name: str
    create_first: Callable[[], Awaitable[Any]]
    missing: type[Exception]
    fired: bool = False

    def __getattr__(self, attr: str) -> Any:
        real = getattr(self.js, attr)
        if attr != self.look or self.fired:
            return real

        async def look(name: str, *args: Any, **kwargs: Any) -> Any:
            if name != self.name:
                return await real(name, *args, **kwargs)
            self.fired = True
            await self.create_first()
            raise self.missing()

        return look


@pytest.fixture
async def theirs(nats_url: str) -> AsyncIterator[JetStreamContext]:
    """JetStream over the other service's connection."""
    client = await nats.connect(nats_url)
    try:
        yield client.jetstream()
    finally:
        await client.close()


def kv_created_meanwhile(
    nc: NatsClient, theirs: JetStreamContext, bucket: str, *, ttl_s: float
) -> CreatedMeanwhile:
    """Our JetStream, on which ``bucket`` turns up created by ``theirs`` with ``ttl_s``."""
    config = kv_config(bucket, ttl_s=ttl_s, replicas=1)
    return CreatedMeanwhile(
        nc.jetstream(),
        "key_value",
        bucket,
        lambda: theirs.create_key_value(config),
        BucketNotFoundError,
    )


async def test_a_bucket_another_service_created_meanwhile_is_used_as_it_is(
    nc: NatsClient, theirs: JetStreamContext, topology: Topology
) -> None:
    bucket = topology.leases_bucket
    js = kv_created_meanwhile(nc, theirs, bucket, ttl_s=60.0)  # as the submitter does
    coordinator = await NatsCoordinator.open(js, topology, lease_ttl_s=4.0)  # type: ignore[arg-type]
    assert js.fired
    # The first creator's settings hold; the coordinator works on that bucket.
    assert (await coordinator.leases.status()).ttl == 60.0
    assert coordinator.lease_ttl_s == 60.0  # what the runner's heartbeat is held to
    assert await coordinator.acquire("exp-1", 1, "runner-0") is not None
    # The control: what the services meet, without their handling of it.
    with pytest.raises(BadRequestError) as refused:
        await nc.jetstream().create_key_value(kv_config(bucket, ttl_s=4.0, replicas=1))
    assert refused.value.err_code == 10058


async def test_the_runner_registry_uses_a_bucket_created_meanwhile(
    nc: NatsClient, theirs: JetStreamContext, topology: Topology
) -> None:
    js = kv_created_meanwhile(nc, theirs, topology.runners_bucket, ttl_s=30.0)
    registry = await NatsRunnerRegistry.open(js, topology, create_ttl_s=9.0)  # type: ignore[arg-type]
    assert (js.fired, registry.ttl_s) == (True, 30.0)


async def test_a_stream_created_meanwhile_is_left_as_it_is(
    nc: NatsClient, theirs: JetStreamContext, topology: Topology
) -> None:
    first = stream_configs(topology, 1)[0]
    assert first.name is not None
    another = first.evolve(max_msgs=1234)
    js = CreatedMeanwhile(
        nc.jetstream(), "stream_info", first.name, lambda: theirs.add_stream(another), NotFoundError
    )
    await ensure_streams(js, topology)  # type: ignore[arg-type]
    assert js.fired
    assert (await nc.jetstream().stream_info(first.name)).config.max_msgs == 1234
    for config in stream_configs(topology, 1):  # and the rest were created
        assert config.name is not None
        await nc.jetstream().stream_info(config.name)


async def test_an_object_store_created_meanwhile_is_used(
    nc: NatsClient, theirs: JetStreamContext, topology: Topology
) -> None:
    bucket = topology.results_bucket
    another = ObjectStoreConfig(storage=StorageType.FILE, description="the other's")
    js = CreatedMeanwhile(
        nc.jetstream(),
        "object_store",
        bucket,
        lambda: theirs.create_object_store(bucket, another),
        BucketNotFoundError,
    )
    ours = BucketSettings(description="ours")
    store = await NatsObjectStore.open(js, bucket, create=ours)  # type: ignore[arg-type]
    assert js.fired
    assert await store.get(await store.put("a", b"kept")) == b"kept"


async def test_services_opening_the_buckets_at_once_all_start(
    nats_url: str, topology: Topology
) -> None:
    """Left to timing: six services with three lease TTLs open the buckets together."""
    clients = [await nats.connect(nats_url) for _ in range(6)]
    try:
        opened = await asyncio.gather(
            *(
                NatsCoordinator.open(c.jetstream(), topology, lease_ttl_s=4.0 + (i % 3))
                for i, c in enumerate(clients)
            )
        )
        ttls = {(await c.leases.status()).ttl for c in opened}
        assert len(ttls) == 1 and ttls <= {4.0, 5.0, 6.0}
    finally:
        for c in clients:
            await c.close()
