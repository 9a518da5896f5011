"""Raw ceilings: what the broker and the ledger do with no trialbus code in the way.

- JetStream publish: plain nats-py ``publish_async`` of real encoded TrialRequested
  payloads, each with a Nats-Msg-Id, into a stream configured like trialbus's work
  stream, every publish acknowledged;
- JetStream consume: plain nats-py pull consumer, ``fetch`` in batches, each message
  acknowledged;
- ledger bulk upsert: plain PyMongo ``bulk_write`` of ``UpdateOne(upsert=True)`` by
  trial_id (unique index), the documents being real trial records, in batches of the
  importer's batch size; beside it the same records through trialbus's MongoLedger.

Each runs against servers started fresh for it (nothing cached from earlier runs).
"""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections.abc import Sequence
from typing import Any

import nats
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from pymongo import ASCENDING, AsyncMongoClient, UpdateOne

from schemas.record import TrialRecord
from services.common.adapters.jetstream import WORK_DUPLICATE_WINDOW_S
from services.common.adapters.mongo_ledger import MongoLedger


async def jetstream_publish_rate(
    nats_url: str, payloads: Sequence[bytes], stream: str = "CEILING"
) -> float:
    """Acknowledged JetStream publishes per second (async publish, plain nats-py)."""
    nc = await nats.connect(nats_url, name="ceiling-publish")
    try:
        js = nc.jetstream(publish_async_max_pending=4000)
        await js.add_stream(
            StreamConfig(
                name=stream,
                subjects=[f"{stream.lower()}.>"],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                duplicate_window=WORK_DUPLICATE_WINDOW_S,
            )
        )
        run = secrets.token_hex(4)
        subject = f"{stream.lower()}.work"
        t0 = time.perf_counter()
        futures = [
            await js.publish_async(subject, data, headers={"Nats-Msg-Id": f"{run}-{i}"})
            for i, data in enumerate(payloads)
        ]
        acks = await asyncio.gather(*futures)
        elapsed = time.perf_counter() - t0
        if any(a.duplicate for a in acks):
            raise AssertionError("a ceiling publish was deduplicated")
        return len(payloads) / elapsed
    finally:
        await nc.close()


async def jetstream_consume_rate(
    nats_url: str, n: int, batch: int = 200, stream: str = "CEILING"
) -> float:
    """Messages per second through a pull consumer (fetch + ack), plain nats-py.

    Consumes the ``n`` messages ``jetstream_publish_rate`` left in ``stream``.
    """
    nc = await nats.connect(nats_url, name="ceiling-consume")
    try:
        js = nc.jetstream()
        durable = "ceiling-" + secrets.token_hex(4)
        await js.add_consumer(
            stream,
            ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=30),
        )
        psub = await js.pull_subscribe_bind(durable, stream=stream)
        got = 0
        t0 = time.perf_counter()
        while got < n:
            msgs = await psub.fetch(batch=min(batch, n - got), timeout=5)
            for msg in msgs:
                await msg.ack()
            got += len(msgs)
        await nc.flush()
        return n / (time.perf_counter() - t0)
    finally:
        await nc.close()


def _docs(records: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in records]


async def ledger_raw_upsert_rate(
    ledger_url: str, database: str, records: Sequence[TrialRecord], batch: int
) -> float:
    """Documents per second through plain PyMongo unordered bulk upserts by trial_id.

    The documents are dumped before the clock starts: this is the server and the
    driver, not record serialization.
    """
    docs = _docs(records)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(ledger_url)
    try:
        coll = client[database]["raw_upsert"]
        await coll.create_index([("trial_id", ASCENDING)], unique=True)
        t0 = time.perf_counter()
        for start in range(0, len(docs), batch):
            chunk = docs[start : start + batch]
            await coll.bulk_write(
                [UpdateOne({"trial_id": d["trial_id"]}, {"$set": d}, upsert=True) for d in chunk],
                ordered=False,
            )
        elapsed = time.perf_counter() - t0
        if await coll.count_documents({}) != len(docs):
            raise AssertionError("raw upsert lost documents")
        return len(docs) / elapsed
    finally:
        await client.close()


async def ledger_adapter_upsert_rate(
    ledger_url: str, database: str, records: Sequence[TrialRecord], batch: int
) -> float:
    """Records per second through trialbus's MongoLedger.upsert_records (content hash,
    duplicate-key check), in batches of ``batch``."""
    ledger = MongoLedger(ledger_url, database)
    try:
        await ledger.ensure_indexes()
        t0 = time.perf_counter()
        for start in range(0, len(records), batch):
            outcome = await ledger.upsert_records(records[start : start + batch])
            if len(outcome.inserted) != len(records[start : start + batch]):
                raise AssertionError("adapter upsert did not insert every record")
        return len(records) / (time.perf_counter() - t0)
    finally:
        await ledger.close()


def replicate_record(template: TrialRecord, n: int, experiment_id: str) -> list[TrialRecord]:
    """``n`` copies of a real record, each under its own trial_id."""
    return [
        template.model_copy(
            update={"trial_id": f"{experiment_id}-{i:06d}", "experiment_id": experiment_id}
        )
        for i in range(n)
    ]


def database_name() -> str:
    """A database name no earlier run used."""
    return "ceiling_" + secrets.token_hex(4)


async def round_trips_ms(nats_url: str, n: int) -> dict[str, float]:
    """Median milliseconds of one acknowledged JetStream publish, one KV create and one
    KV get (the runner makes one publish and three KV calls before TrialStarted)."""
    nc = await nats.connect(nats_url, name="ceiling-rtt")
    try:
        js = nc.jetstream()
        stream = "RTT" + secrets.token_hex(3).upper()
        await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream.lower()}.>"]))
        kv = await js.create_key_value(KeyValueConfig(bucket=stream + "_KV", history=1))
        samples: dict[str, list[float]] = {"publish": [], "kv_create": [], "kv_get": []}
        for i in range(n):
            t0 = time.perf_counter()
            await js.publish(f"{stream.lower()}.x", b"x" * 512)
            t1 = time.perf_counter()
            await kv.create(f"k{i}", b"1")
            t2 = time.perf_counter()
            await kv.get(f"k{i}")
            t3 = time.perf_counter()
            samples["publish"].append(t1 - t0)
            samples["kv_create"].append(t2 - t1)
            samples["kv_get"].append(t3 - t2)
        return {k: 1000 * statistics.median(v) for k, v in samples.items()}
    finally:
        await nc.close()
