"""The experiment list and the experiment tally, against every Ledger adapter.

``experiment_tally`` must always equal the tally summed from the stored records
(``tally_of(records_for)``): after replays, replacements, refused writes and
concurrent writers. ``status`` reads it, so its numbers must equal the ones computed
from the records. MongoLedger keeps the tally at write time; the checks below that
reach into its documents simulate a ledger written before (no listing document, no
tally) and a writer that died between its records and its tally.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from schemas.record import TrialRecord
from services.common.adapters.mongo_experiments import BACKFILL_ID
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.ports import ExperimentInfo, Ledger
from services.reports import queries
from services.reports.budget import spent_line
from services.reports.leaderboard import status_counts
from services.reports.tally import tally_of
from tests.integration.test_ledger_contract import (  # noqa: F401 (fixtures)
    ledger,
    ledger_factory,
    make_record,
)
from tests.support.ledger_documents import age_pending_marks, write_then_die

pytestmark = pytest.mark.integration

Documents = AsyncDatabase[dict[str, Any]]


@pytest.fixture
async def mongo(ledger_url: str, ledger_db: str) -> AsyncIterator[MongoLedger]:
    """A MongoLedger on the test's database, indexes made; closed at teardown."""
    store = MongoLedger(ledger_url, ledger_db)
    await store.ensure_indexes()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def db(ledger_url: str, ledger_db: str) -> AsyncIterator[Documents]:
    """The test's database read directly (timezone-aware, as the adapter reads it), to
    plant what an older or interrupted writer would have left."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(ledger_url, tz_aware=True)
    try:
        yield client[ledger_db]
    finally:
        await client.close()


def priced(record: TrialRecord, cost: float | None, tokens: int) -> TrialRecord:
    """``record`` with usage (``cost`` None: tokens without a price)."""
    usage = record.usage.model_copy(
        update={"cost_usd": cost, "n_input_tokens": tokens, "n_output_tokens": 1}
    )
    return record.model_copy(update={"usage": usage})


async def assert_tally_is_the_records(store: Ledger, experiment_id: str = "exp-a") -> None:
    assert await store.experiment_tally(experiment_id) == tally_of(
        await store.records_for(experiment_id)
    )


async def test_a_replaced_record_counts_once(ledger: Ledger) -> None:  # noqa: F811
    await ledger.upsert_records([make_record("t1", status="partial", reward=None)])
    await ledger.upsert_records([make_record("t1", status="partial", reward=None)])  # replay
    await ledger.upsert_records([make_record("t1", reward=1.0), make_record("t2", reward=0.0)])
    # A late partial after a complete: unchanged, so nothing to count.
    await ledger.upsert_records([make_record("t1", status="partial", reward=None)])

    tally = await ledger.experiment_tally("exp-a")
    # Negative control: four writes of t1 were applied or offered; it counts once,
    # as the complete record that replaced the partial one.
    assert tally["recorded"] == 2 and tally["complete"] == 2 and tally["scored"] == 2
    assert "partial" not in tally and "unscored_infrastructure" not in tally
    await assert_tally_is_the_records(ledger)


async def test_a_refused_write_for_another_experiment_counts_nowhere(
    ledger: Ledger,  # noqa: F811
) -> None:
    await ledger.upsert_records([make_record("t1")])
    moved = make_record("t1", experiment_id="exp-b", status="partial", reward=None)
    assert (await ledger.upsert_records([moved])).conflicts == {"t1": "exp-a"}

    assert (await ledger.experiment_tally("exp-a"))["recorded"] == 1
    assert await ledger.experiment_tally("exp-b") == {}
    assert await ledger.experiment_tally("exp-none") == {}
    # Refused, so it lists no experiment either (exp-a, listed, is the control).
    assert await ledger.experiment_ids() == ["exp-a"]


async def test_concurrent_writers_keep_the_tally_of_what_is_stored(
    ledger_factory: Callable[[], Ledger],  # noqa: F811
) -> None:
    first, second = ledger_factory(), ledger_factory()
    await first.ensure_indexes()
    ids = [f"t{i:03d}" for i in range(60)]
    await first.upsert_records([make_record(i, status="partial", reward=None) for i in ids[::2]])

    await asyncio.gather(
        first.upsert_records([priced(make_record(i, reward=0.0), 0.25, 10) for i in ids]),
        second.upsert_records([priced(make_record(i, reward=1.0), None, 7) for i in ids]),
    )

    tally = await first.experiment_tally("exp-a")
    assert tally["recorded"] == 60 and tally["complete"] == 60
    await assert_tally_is_the_records(first)
    await first.close()
    await second.close()


async def test_status_reads_the_same_numbers_as_the_records_give(
    ledger: Ledger,  # noqa: F811
) -> None:
    manifest = {"name": "a", "budget": {"max_cost_usd": 5.0, "max_tokens": 10_000}}
    info = ExperimentInfo("exp-a", "a", 6, manifest)
    await ledger.upsert_experiment(info)
    await ledger.upsert_records(
        [
            priced(make_record("t1"), 0.1, 100),
            priced(make_record("t2", reward=0.0), None, 50),  # tokens without a price
            make_record("t3", status="partial", reward=None),
            make_record("t4", reward=None),  # complete, no reward: unscored
        ]
    )
    await ledger.upsert_records([priced(make_record("t2", reward=1.0), 0.2, 60)])  # replaced

    status = await queries.experiment_status(ledger, "exp-a")
    records = await ledger.records_for("exp-a")
    assert status == {**status_counts(records, info), "budget": spent_line(records, info)}
    assert status["recorded"] == 4 and status["pending"] == 2 and status["scored"] == 2
    assert status["budget"] == "$0.3000 of $5 USD; 162 of 10000 tokens"


async def test_status_of_an_unknown_experiment_is_not_found(ledger: Ledger) -> None:  # noqa: F811
    with pytest.raises(Exception, match="no experiment 'nope'"):
        await queries.experiment_status(ledger, "nope")


async def test_an_experiment_known_only_by_records_is_listed_without_metadata(
    ledger: Ledger,  # noqa: F811
) -> None:
    await ledger.upsert_records([make_record("r1", experiment_id="exp-imported")])
    await ledger.upsert_experiment(ExperimentInfo("exp-meta", "m", 1, {}))

    assert sorted(await ledger.experiment_ids()) == ["exp-imported", "exp-meta"]
    # Listed, yet still an experiment nobody submitted (the watcher waits for none).
    assert await ledger.get_experiment("exp-imported") is None


# -- MongoLedger only ----------------------------------------------------------------


async def test_mongo_list_is_newest_first_from_the_experiments_collection(
    mongo: MongoLedger, db: Documents
) -> None:
    await mongo.upsert_records([make_record("r1", experiment_id="exp-b")])
    await mongo.upsert_experiment(ExperimentInfo("exp-c", "c", 1, {}))
    await mongo.upsert_records([make_record("r2", experiment_id="exp-a")])
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for i, exp in enumerate(["exp-b", "exp-c", "exp-a"]):
        await db["experiments"].update_one(
            {"experiment_id": exp}, {"$set": {"created_at": base + timedelta(hours=i)}}
        )
    assert await mongo.experiment_ids() == ["exp-a", "exp-c", "exp-b"]
    # Same instant: ties break by id.
    await db["experiments"].update_many({}, {"$set": {"created_at": base}})
    assert await mongo.experiment_ids() == ["exp-a", "exp-b", "exp-c"]


async def test_mongo_backfill_lists_experiments_written_before_the_listing(
    mongo: MongoLedger, db: Documents
) -> None:
    await mongo.upsert_records([make_record("r1", experiment_id="exp-old")])
    await mongo.upsert_experiment(ExperimentInfo("exp-new", "n", 1, {}))
    # A mongo of before: records, no listing document, backfill never run.
    await db["experiments"].delete_one({"experiment_id": "exp-old"})
    await db["ledger_meta"].delete_one({"_id": BACKFILL_ID})
    assert await mongo.experiment_ids() == ["exp-new"]  # negative control

    await mongo.ensure_indexes()
    assert sorted(await mongo.experiment_ids()) == ["exp-new", "exp-old"]
    assert await mongo.get_experiment("exp-old") is None
    doc = await db["experiments"].find_one({"experiment_id": "exp-old"})
    first = await db["trials"].find_one({"trial_id": "r1"})
    assert doc is not None and first is not None
    assert doc["created_at"] == first["first_imported_at"]
    # Its tally is rebuilt from the records on first read, then kept.
    await assert_tally_is_the_records(mongo, "exp-old")
    doc = await db["experiments"].find_one({"experiment_id": "exp-old"})
    assert doc is not None and doc["tally_ok"] is True

    # Once per mongo: the marker stops a second scan.
    await db["experiments"].delete_one({"experiment_id": "exp-old"})
    await mongo.ensure_indexes()
    assert await mongo.experiment_ids() == ["exp-new"]


async def test_mongo_a_writer_that_died_mid_batch_leaves_a_tally_that_is_rebuilt(
    mongo: MongoLedger, db: Documents
) -> None:
    await mongo.upsert_records([make_record("t1")])
    await write_then_die(mongo, [make_record("t2"), make_record("t1", reward=0.0)])
    # The redelivered batch changes no record, so it adds nothing either.
    assert (await mongo.upsert_records([make_record("t2")])).unchanged == ["t2"]
    # While the dead batch's mark is fresh the kept tally is read (it may be a
    # live writer): one record short. Negative control for the rebuild below.
    assert (await mongo.experiment_tally("exp-a"))["recorded"] == 1

    await age_pending_marks(db, "exp-a")
    await assert_tally_is_the_records(mongo)
    assert (await mongo.experiment_tally("exp-a"))["recorded"] == 2
    doc = await db["experiments"].find_one({"experiment_id": "exp-a"})
    assert doc is not None and not doc["tally_pending"]  # stored: no rebuild next time


async def test_mongo_a_rebuild_is_not_stored_over_a_live_write(
    mongo: MongoLedger, db: Documents
) -> None:
    experiments = db["experiments"]
    await mongo.upsert_records([make_record("t1")])
    # A mongo of before (no kept tally) while a writer has a batch in flight.
    await experiments.update_one(
        {"experiment_id": "exp-a"},
        {"$unset": {"tally_ok": ""}, "$set": {"tally_pending.live": datetime.now(UTC)}},
    )
    assert (await mongo.experiment_tally("exp-a"))["recorded"] == 1
    doc = await experiments.find_one({"experiment_id": "exp-a"})
    # Not stored: the live writer's commit would then count its records twice.
    assert doc is not None and "tally_ok" not in doc
