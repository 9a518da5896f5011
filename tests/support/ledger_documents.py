"""The MongoDB-wire ledger seen twice: through its adapter, and as the documents it
stores, for the tests that check what the adapter wrote or plant a state the port
cannot make (a ledger of before, a writer that died between two writes)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from schemas.record import TrialRecord
from services.common.adapters.mongo_experiments import STALE_PENDING, ExperimentStore
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


async def write_then_die(ledger: MongoLedger, records: Sequence[TrialRecord]) -> None:
    """Write ``records`` as a writer killed between its records and its experiment
    commit: the records are stored, the batch's pending mark stays on the experiment
    (to a reader, a writer still at work)."""

    async def die(*_args: object, **_kwargs: object) -> None:
        raise ConnectionError("the writer stopped between its records and its commit")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ExperimentStore, "commit", die)
        with pytest.raises(ConnectionError):
            await ledger.upsert_records(list(records))


async def age_pending_marks(db: AsyncDatabase[dict[str, Any]], experiment_id: str) -> None:
    """Date every pending batch mark of ``experiment_id`` past STALE_PENDING, as if its
    writer died that long ago (the ledger then takes its records as settled)."""
    experiments = db["experiments"]
    doc = await experiments.find_one({"experiment_id": experiment_id})
    assert doc is not None, f"no experiment document for {experiment_id}"
    old = datetime.now(UTC) - STALE_PENDING - timedelta(seconds=1)
    stale = {f"tally_pending.{batch}": old for batch in doc["tally_pending"]}
    await experiments.update_one({"experiment_id": experiment_id}, {"$set": stale})
