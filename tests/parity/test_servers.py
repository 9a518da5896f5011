"""The parity servers are what production runs, checked before anything relies on them:
a MongoDB replica set (transactions, change streams) and a NATS cluster of exactly three
JetStream nodes (streams replicated 3x)."""

from __future__ import annotations

import secrets
from typing import Any

import nats
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError
from pymongo import AsyncMongoClient

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.timeout(600)]


async def test_mongo_is_a_replica_set_with_transactions_and_change_streams(
    ledger_url: str, ledger_db: str
) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(ledger_url)
    try:
        hello = await client.admin.command("hello")
        assert hello["setName"] == "rs0" and hello["isWritablePrimary"], hello
        coll = client[ledger_db]["parity"]
        await coll.insert_one({"_id": "before"})  # the collection exists before the stream
        async with await coll.watch() as changes:
            async with client.start_session() as session:
                # Control: an aborted transaction leaves nothing behind.
                await session.start_transaction()
                await coll.insert_one({"_id": "aborted"}, session=session)
                await session.abort_transaction()
                await session.start_transaction()
                await coll.insert_one({"_id": "committed"}, session=session)
                await session.commit_transaction()
            change = await changes.next()
        assert change["operationType"] == "insert"
        assert change["documentKey"] == {"_id": "committed"}
        assert sorted([d["_id"] async for d in coll.find()]) == ["before", "committed"]
    finally:
        await client.close()


async def test_nats_is_three_routed_jetstream_nodes(nats_url: str) -> None:
    nc = await nats.connect(servers=nats_url.split(","))
    try:
        js = nc.jetstream()
        name = "parity_" + secrets.token_hex(4)
        info = await js.add_stream(StreamConfig(name=name, subjects=[name], num_replicas=3))
        assert info.cluster is not None and info.cluster.leader
        assert len(info.cluster.replicas or []) == 2, info.cluster
        # Control: a fourth replica has no node to live on, so the three above are all.
        four = StreamConfig(name=name + "x", subjects=[name + "x"], num_replicas=4)
        with pytest.raises(APIError, match="no suitable peers"):
            await js.add_stream(four)
        await js.delete_stream(name)
    finally:
        await nc.close()
