"""The MongoDB-wire ledger seen twice: through its adapter, and as the documents it
stores, for the tests that check what the adapter wrote or plant a state the port
cannot make (a ledger of before, a writer that died between two writes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from services.common.adapters.mongo_ledger import MongoLedger


@asynccontextmanager
async def ledger_and_documents(
    ledger_url: str, ledger_db: str
) -> AsyncIterator[tuple[MongoLedger, AsyncDatabase[dict[str, Any]]]]:
    """A MongoLedger on ``ledger_db`` with its indexes made, and the same database read
    directly (timezone-aware, as the adapter reads it); both closed on exit."""
    ledger = MongoLedger(ledger_url, ledger_db)
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(ledger_url, tz_aware=True)
    try:
        await ledger.ensure_indexes()
        yield ledger, client[ledger_db]
    finally:
        await client.close()
        await ledger.close()
