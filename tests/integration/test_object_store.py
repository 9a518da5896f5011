"""One ObjectStore contract, run against the in-memory fake and NatsObjectStore.

The NATS run uses the session's real nats-server with a bucket unique to each test.
A behaviour the fake has and the adapter lacks (or the reverse) fails here; each
refusal has a negative control beside it (the same call succeeding when it should).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

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

    new_names = False
    """Open the stores as the results bucket is opened (``NatsObjectStore.new_names``)."""

    @pytest.fixture
    async def world(self, nats_url: str, topology: Topology) -> AsyncIterator[World]:
        clients: list[NatsClient] = []
        bucket = topology.tasks_bucket

        async def open_(max_bytes: int | None) -> ObjectStore:
            nc = await nats.connect(nats_url)
            clients.append(nc)
            return await NatsObjectStore.open(
                nc.jetstream(),
                bucket,
                create=BucketSettings(max_bytes=max_bytes, ttl_s=3600),
                new_names=self.new_names,
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
        self, world: World, nc: NatsClient, topology: Topology
    ) -> None:
        await world.open(1_000_000)
        status = await (await nc.jetstream().object_store(topology.tasks_bucket)).status()
        assert status.ttl == 3600 and status.stream_info.config.max_bytes == 1_000_000

    async def test_reads_leave_no_consumers(
        self, world: World, nc: NatsClient, topology: Topology
    ) -> None:
        # nats-py's own get leaves an ordered consumer per read; about 1000 of them in
        # their inactivity window and every further read fails. The adapter's reads
        # must leave none.
        store = await world.open(None)
        ref = await store.put("often-read", os.urandom(200_000))
        for _ in range(20):
            assert await store.get(ref) == await store.get(ref)
        js = nc.jetstream()
        stream = f"OBJ_{topology.tasks_bucket}"
        assert (await js.stream_info(stream)).state.consumer_count == 0
        await (await js.object_store(topology.tasks_bucket)).get("often-read")
        assert (await js.stream_info(stream)).state.consumer_count == 1  # the control

    async def test_put_and_get_round_trips_and_nats_py_format(
        self, world: World, nc: NatsClient, topology: Topology
    ) -> None:
        # Every trial's folder is a put by the runner and a get by the importer: each
        # JetStream API request is a round trip per trial (docs/performance.md). A put
        # makes one meta lookup, a get reads the meta by direct get (no API request
        # through STREAM.MSG.GET); what they store stays readable by nats-py's own client.
        await world.open(None)  # creates the bucket
        bucket = topology.tasks_bucket
        # The store sends over nc, which also sees the copies: one subscription, so they
        # arrive in the order sent, between two marks nc sends around each call (no
        # copy of an earlier call, nor another test's traffic, is counted).
        store = await NatsObjectStore.open(nc.jetstream(), bucket, new_names=self.new_names)
        mark = f"_MARK.{os.urandom(4).hex()}"
        seen: list[str] = []
        ended = asyncio.Event()

        async def count(msg: Msg) -> None:
            subject = msg.subject
            api = subject.startswith("$JS.API.") and f"OBJ_{bucket}" in subject
            if api or subject.startswith((f"$O.{bucket}.", mark)):
                seen.append(subject)
            if subject == f"{mark}.end":
                ended.set()

        await nc.subscribe(">", cb=count)
        await nc.flush()

        async def traffic(call: Awaitable[object]) -> list[str]:
            """What ``call`` sent: MSG.GET, DIRECT.GET, C (a chunk), M (a meta entry)."""
            seen.clear()
            ended.clear()
            await nc.publish(f"{mark}.begin")
            await call
            await nc.publish(f"{mark}.end")
            await asyncio.wait_for(ended.wait(), timeout=60)
            sent = seen[seen.index(f"{mark}.begin") + 1 : seen.index(f"{mark}.end")]
            kinds = {"$JS.API.STREAM.MSG.GET": "MSG.GET", "$JS.API.DIRECT.GET": "DIRECT.GET"}
            kinds |= {f"$O.{bucket}.C": "C", f"$O.{bucket}.M": "M"}
            return [next((k for p, k in kinds.items() if s.startswith(p)), s) for s in sent]

        data = os.urandom(300_000)  # three chunks
        put = await traffic(store.put("counted", data))
        lookups = 0 if self.new_names else 1  # STREAM.MSG.GET of the meta
        assert put.count("MSG.GET") == lookups, put
        assert put.count("C") == 3 and put.count("M") == 1 and len(put) == 4 + lookups, put
        ref = await store.info("counted")
        assert ref is not None
        got = await traffic(store.get(ref))
        assert got.count("MSG.GET") == 0 and got.count("DIRECT.GET") == 4, got
        js = nc.jetstream()
        assert (await (await js.object_store(bucket)).get("counted")).data == data
        # Control, the adapter's put before: its own lookup, then nats-py's put,
        # which looks again (the count tells them apart).
        their_store = await js.object_store(bucket)

        async def before() -> None:
            await store.info("theirs")
            await their_store.put("theirs", b"x")

        assert (await traffic(before())).count("MSG.GET") == 2
        assert (await store.get(await store.put("theirs", b"x"))) == b"x"

    async def test_replacing_put_purges_the_old_chunks(
        self, world: World, nc: NatsClient, topology: Topology
    ) -> None:
        store = await world.open(None)
        bucket = topology.tasks_bucket
        js = nc.jetstream()
        await store.put("replaced", b"first")
        old = await (await js.object_store(bucket)).get_info("replaced")
        chunks = f"$O.{bucket}.C.{old.nuid}"
        await js.get_msg(f"OBJ_{bucket}", seq=1, subject=chunks, next=True)  # control
        new = await store.put("replaced", b"second")
        assert await store.get(new) == b"second"
        with pytest.raises(NotFoundError):
            await js.get_msg(f"OBJ_{bucket}", seq=1, subject=chunks, next=True)

    async def test_missing_bucket_without_settings_is_transient(self, nc: NatsClient) -> None:
        with pytest.raises(TransientError, match="does not exist"):
            await NatsObjectStore.open(nc.jetstream(), "NO_SUCH_BUCKET_" + os.urandom(4).hex())


class TestNatsObjectStoreNewNames(TestNatsObjectStore):
    """The contract again for a bucket of new names (the results bucket: trial folders,
    one name per run and attempt): a put writes without a lookup, and one that finds
    its name taken must end as a looked-up put does."""

    new_names = True

    async def test_taken_name_is_looked_up_and_leaves_no_chunks(
        self, world: World, nc: NatsClient, topology: Topology
    ) -> None:
        store = await world.open(None)
        stream = f"OBJ_{topology.tasks_bucket}"
        js = nc.jetstream()

        async def messages() -> int:
            return (await js.stream_info(stream)).state.messages

        first = await store.put("taken", b"same bytes")
        before = await messages()
        # The same bytes again (an upload retried after an unconfirmed put): the
        # conditional meta entry is refused, the stored object is the answer, and
        # the chunks just written are purged.
        assert await store.put("taken", b"same bytes") == first
        assert await messages() == before
        # Other bytes: replaced, the old chunks purged (one meta, one chunk kept).
        second = await store.put("taken", b"other bytes")
        assert await store.get(second) == b"other bytes" and await messages() == before
        with pytest.raises(ObjectCorrupt):
            await store.get(first)
        # Control: a new name adds its chunk and its meta entry.
        await store.put("fresh", b"x")
        assert await messages() == before + 2
