"""One ObjectStore contract, run against the in-memory fake and NatsObjectStore.

The NATS run uses the session's real nats-server with a bucket unique to each test.
A behaviour the fake has and the adapter lacks (or the reverse) fails here; each
refusal has a negative control beside it (the same call succeeding when it should).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import nats
import pytest

from schemas.objects import ObjectRef
from schemas.subjects import Topology
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.adapters.nats_objects import BucketSettings, NatsObjectStore
from services.common.errors import ObjectCorrupt, ObjectMissing, TransientError
from services.common.ports import ObjectStore

pytestmark = pytest.mark.integration


@dataclass
class World:
    """Opens stores over the same bucket; ``tamper`` damages a stored object's bytes."""

    open: Callable[[int | None], Awaitable[ObjectStore]]
    tamper: Callable[[str], Awaitable[None]]


class ObjectStoreContract:
    """What every ObjectStore adapter must do."""

    async def test_put_get_roundtrip_and_info(self, world: World) -> None:
        store = await world.open(None)
        data = os.urandom(300_000)  # three 128 KiB NATS chunks
        ref = await store.put("tasks/abc", data)
        assert ref == ObjectRef(
            bucket=store.bucket,
            name="tasks/abc",
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        assert await store.get(ref) == data
        assert await store.info("tasks/abc") == ref
        assert await store.info("tasks/other") is None  # negative control

    async def test_empty_object(self, world: World) -> None:
        store = await world.open(None)
        ref = await store.put("empty", b"")
        assert ref.size == 0 and await store.get(ref) == b""

    async def test_missing_object(self, world: World) -> None:
        store = await world.open(None)
        ghost = ObjectRef(bucket=store.bucket, name="ghost", size=1, sha256="0" * 64)
        with pytest.raises(ObjectMissing):
            await store.get(ghost)
        ref = await store.put("ghost", b"x")
        assert await store.get(ref) == b"x"  # negative control: now it exists

    async def test_replaced_object_is_not_what_the_old_reference_names(self, world: World) -> None:
        store = await world.open(None)
        old = await store.put("run-1", b"first")
        new = await store.put("run-1", b"second")
        assert new.sha256 != old.sha256
        with pytest.raises(ObjectCorrupt):
            await store.get(old)
        assert await store.get(new) == b"second"

    async def test_damaged_bytes_are_detected(self, world: World) -> None:
        store = await world.open(None)
        ref = await store.put("victim", os.urandom(200_000))
        untouched = await store.put("bystander", b"fine")
        await world.tamper("victim")
        with pytest.raises(ObjectCorrupt):
            await store.get(ref)
        assert await store.get(untouched) == b"fine"

    async def test_delete(self, world: World) -> None:
        store = await world.open(None)
        ref = await store.put("gone", b"bye")
        await store.delete("gone")
        await store.delete("gone")  # missing is not an error
        assert await store.info("gone") is None
        with pytest.raises(ObjectMissing):
            await store.get(ref)

    async def test_same_content_put_is_visible_to_another_client(self, world: World) -> None:
        a = await world.open(None)
        b = await world.open(None)
        ref = await a.put("shared", b"payload")
        assert await b.info("shared") == ref
        assert await b.put("shared", b"payload") == ref
        assert await b.get(ref) == b"payload"

    async def test_full_bucket_refuses_and_stores_nothing(self, world: World) -> None:
        store = await world.open(64 * 1024)
        with pytest.raises(TransientError, match="full"):
            await store.put("big", os.urandom(200_000))
        assert await store.info("big") is None
        small = await store.put("small", b"fits")  # negative control
        assert await store.get(small) == b"fits"


class TestInMemoryObjectStore(ObjectStoreContract):
    """The contract against the fake the unit tests use."""

    @pytest.fixture
    async def world(self) -> World:
        stores: dict[str, InMemoryObjectStore] = {}

        async def open_(max_bytes: int | None) -> ObjectStore:
            # Like one bucket seen by several clients: the first open creates it.
            if "b" not in stores:
                stores["b"] = InMemoryObjectStore("MEM", max_bytes=max_bytes)
            return stores["b"]

        async def tamper(name: str) -> None:
            stores["b"].tamper(name)

        return World(open_, tamper)


class TestNatsObjectStore(ObjectStoreContract):
    """The contract against a JetStream object store bucket on a real nats-server."""

    @pytest.fixture
    async def world(self, nats_url: str, topology: Topology) -> AsyncIterator[World]:
        clients: list[nats.NATS] = []
        bucket = topology.tasks_bucket

        async def open_(max_bytes: int | None) -> ObjectStore:
            nc = await nats.connect(nats_url)
            clients.append(nc)
            return await NatsObjectStore.open(
                nc.jetstream(), bucket, create=BucketSettings(max_bytes=max_bytes, ttl_s=3600)
            )

        async def tamper(name: str) -> None:
            # Damage what the server holds, as a corrupted store would: the first chunk
            # is replaced by garbage at the end; the metadata (digest) is unchanged.
            js = clients[0].jetstream()
            info = await (await js.object_store(bucket)).get_info(name)
            subject = f"$O.{bucket}.C.{info.nuid}"
            first = await js.get_msg(f"OBJ_{bucket}", seq=1, subject=subject, next=True)
            assert first.seq is not None
            await js.delete_msg(f"OBJ_{bucket}", first.seq)
            await js.publish(subject, b"garbage")

        yield World(open_, tamper)
        for nc in clients:
            await nc.close()

    async def test_bucket_is_created_with_its_settings(
        self, world: World, nats_url: str, topology: Topology
    ) -> None:
        await world.open(1_000_000)
        nc = await nats.connect(nats_url)
        try:
            status = await (await nc.jetstream().object_store(topology.tasks_bucket)).status()
            assert status.ttl == 3600 and status.stream_info.config.max_bytes == 1_000_000
        finally:
            await nc.close()

    async def test_reads_leave_no_consumers(
        self, world: World, nats_url: str, topology: Topology
    ) -> None:
        # nats-py's own get leaves an ordered consumer per read; about 1000 of them in
        # their inactivity window and every further read fails. The adapter's reads
        # must leave none.
        store = await world.open(None)
        ref = await store.put("often-read", os.urandom(200_000))
        for _ in range(20):
            assert await store.get(ref) == await store.get(ref)
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            stream = f"OBJ_{topology.tasks_bucket}"
            assert (await js.stream_info(stream)).state.consumer_count == 0
            await (await js.object_store(topology.tasks_bucket)).get("often-read")
            assert (await js.stream_info(stream)).state.consumer_count == 1  # the control
        finally:
            await nc.close()

    async def test_missing_bucket_without_settings_is_transient(self, nats_url: str) -> None:
        nc = await nats.connect(nats_url)
        try:
            with pytest.raises(TransientError, match="does not exist"):
                await NatsObjectStore.open(nc.jetstream(), "NO_SUCH_BUCKET_" + os.urandom(4).hex())
        finally:
            await nc.close()
