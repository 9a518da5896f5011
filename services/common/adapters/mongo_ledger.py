"""MongoLedger: the Ledger port over MongoDB (or SecantusDB) with PyMongo's async client.

A little over 350 lines: one adapter for one port, each method a query and its
error translation; splitting it would split the document shape described below.

Document shape (collection ``trials``): the record's JSON-mode dump (datetimes as
ISO-8601 strings, so a record reads back exactly as written, microseconds included;
BSON dates would truncate them to milliseconds and change the content hash) plus

- ``content_hash``: sha256 of the record's canonical JSON (see
  ``services.common.ports.record_content_hash``);
- ``order_key``: the record's rank among the records of its trial
  (``services.common.ports.record_order``), a string the update filter compares;
- ``imported_at``: BSON date of the last write that changed the document;
- ``first_imported_at``: BSON date of the insert (orders ``experiment_ids``).

A batch is first inserted as it is (unordered ``insert_many``): new trials, the usual
case, are stored by the cheapest write. Items whose trial_id is stored already fail
on the unique index and are upserted instead.

An upsert is ``UpdateOne({trial_id, experiment_id, content_hash != h, order_key <= k},
{$set: doc}, upsert=True)``. When the filter matches nothing because the stored
document already has this content or ranks above the new record (a complete one
against a partial, a newer result against an older one), the upsert's insert hits the
unique index on trial_id: duplicate key (11000) means ``unchanged``. The stored
experiment_id is part of the filter, so a write naming another experiment (a forged
or misrouted event, a copied job folder imported under another name) can never match
and move the record: it too ends on the unique index, and is reported as a conflict
(``UpsertOutcome.conflicts``), not applied. That reading is verified: the stored
experiment, hash and order key of every duplicate-key item are fetched, and an item
that lost a race with a concurrent writer (same experiment, stored content neither
equal nor ranked above) is retried. A document written before order keys existed has
none: it ranks by its status alone (``ports.status_order``), as the ledger ranked
records then.

Connection problems surface as ``LedgerUnavailable``; anything else propagates.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Final

from pymongo import ASCENDING, AsyncMongoClient, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, ConnectionFailure

from schemas.record import TrialRecord
from services.common.errors import LedgerUnavailable
from services.common.ports import (
    ExperimentInfo,
    UpsertOutcome,
    collapse_batch,
    keeps_stored,
    record_content_hash,
    record_order,
    status_order,
)

DUPLICATE_KEY: Final = 11000
_MAX_ROUNDS: Final = 3
# Stored next to the record's own fields; stripped when reading a record back.
_BOOKKEEPING: Final = ("_id", "content_hash", "order_key", "imported_at", "first_imported_at")

Doc = dict[str, Any]


class LedgerConflict(RuntimeError):
    """Concurrent writers kept changing a record while this batch tried to store it."""


@asynccontextmanager
async def _translate_errors(action: str) -> AsyncIterator[None]:
    # ConnectionFailure is the base of ServerSelectionTimeoutError, AutoReconnect
    # (incl. NotPrimaryError), NetworkTimeout and WaitQueueTimeoutError: all mean
    # "try again later", never "your data is wrong".
    try:
        yield
    except ConnectionFailure as exc:
        raise LedgerUnavailable(f"ledger unreachable during {action}: {exc}") from exc


class MongoLedger:
    """Ledger adapter over a MongoDB-wire server. Nothing connects until first use."""

    def __init__(
        self,
        url: str,
        database: str,
        *,
        server_selection_timeout_ms: int = 5000,
        app_name: str = "trialbus",
    ) -> None:
        self._client: AsyncMongoClient[Doc] = AsyncMongoClient(
            url,
            tz_aware=True,
            serverSelectionTimeoutMS=server_selection_timeout_ms,
            appname=app_name,
        )
        db = self._client[database]
        self._trials: AsyncCollection[Doc] = db["trials"]
        self._experiments: AsyncCollection[Doc] = db["experiments"]

    async def ensure_indexes(self) -> None:
        """Create the unique index on trial_id and the query indexes. Idempotent.

        One index per read of the reports (services.reports.queries), so MongoDB answers
        each from an index: ``records_for`` filters on experiment_id and sorts by
        trial_id (no in-memory sort of an experiment's records); ``scored_trial_ids``
        is covered by (experiment_id, evaluation.reward_valid, trial_id) (no document
        fetched); ``count_records`` counts keys of either. The single-field
        experiment_id index of earlier versions is a prefix of these and is kept only
        because dropping it is not this method's business. docs/operations.md lists
        them; benchmarks/bench_ledger.py measures them.
        """
        async with _translate_errors("ensure_indexes"):
            await self._trials.create_index([("trial_id", ASCENDING)], unique=True)
            await self._trials.create_index([("experiment_id", ASCENDING)])
            await self._trials.create_index([("experiment_id", ASCENDING), ("trial_id", ASCENDING)])
            await self._trials.create_index(
                [
                    ("experiment_id", ASCENDING),
                    ("evaluation.reward_valid", ASCENDING),
                    ("trial_id", ASCENDING),
                ]
            )
            await self._experiments.create_index([("experiment_id", ASCENDING)], unique=True)

    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        """Insert or replace records by trial_id; identical content is ``unchanged``.

        A trial_id repeated inside the batch is written once (see ``collapse_batch``)
        and reported once. Raises LedgerUnavailable when the server cannot be reached;
        the whole batch may then be retried safely.
        """
        outcome = UpsertOutcome()
        pending = [(r, record_content_hash(r)) for r in collapse_batch(records)]
        async with _translate_errors("upsert_records"):
            pending = await self._insert_new(pending, outcome)
            for _ in range(_MAX_ROUNDS):
                if not pending:
                    return outcome
                now = datetime.now(UTC)
                ops = [_upsert_op(record, h, now) for record, h in pending]
                upserted, duplicates = await self._bulk(ops)
                for index, (record, _h) in enumerate(pending):
                    if index in upserted:
                        outcome.inserted.append(record.trial_id)
                    elif index not in duplicates:
                        # Matched the filter, hence content differed: an update.
                        outcome.updated.append(record.trial_id)
                pending = await self._unexplained([pending[i] for i in sorted(duplicates)], outcome)
        if pending:
            ids = ", ".join(r.trial_id for r, _ in pending)
            raise LedgerConflict(f"records kept changing under concurrent writers: {ids}")
        return outcome

    async def _insert_new(
        self, items: list[tuple[TrialRecord, str]], outcome: UpsertOutcome
    ) -> list[tuple[TrialRecord, str]]:
        """Insert the items no document exists for yet; return the others.

        Most batches are new trials (a fresh import, finished runs), and a plain
        insert is the cheapest write: 3-4x the rate of the conditional upsert on
        SecantusDB (benchmarks/, docs/performance.md). An item whose trial_id is
        stored already fails on the unique index and goes the upsert way.
        """
        if not items:
            return []
        now = datetime.now(UTC)
        docs = [_document(record, h, now) | {"first_imported_at": now} for record, h in items]
        try:
            await self._trials.insert_many(docs, ordered=False)
            stored: set[int] = set()
        except BulkWriteError as exc:
            stored = _duplicate_key_indexes(exc)
        outcome.inserted.extend(r.trial_id for i, (r, _h) in enumerate(items) if i not in stored)
        return [items[i] for i in sorted(stored)]

    async def _bulk(self, ops: list[UpdateOne]) -> tuple[set[int], set[int]]:
        """Run one unordered bulk; return (indexes upserted, indexes hitting 11000)."""
        try:
            result = await self._trials.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:
            return (
                {int(u["index"]) for u in exc.details.get("upserted", [])},
                _duplicate_key_indexes(exc),
            )
        return set(result.upserted_ids or {}), set()

    async def _unexplained(
        self, items: list[tuple[TrialRecord, str]], outcome: UpsertOutcome
    ) -> list[tuple[TrialRecord, str]]:
        """Sort duplicate-key items into ``unchanged`` or ``conflicts``; return those to retry."""
        if not items:
            return []
        stored: dict[str, Doc] = {}
        cursor = self._trials.find(
            {"trial_id": {"$in": [r.trial_id for r, _ in items]}},
            {
                "_id": 0,
                "trial_id": 1,
                "experiment_id": 1,
                "content_hash": 1,
                "status": 1,
                "order_key": 1,
            },
        )
        async for found in cursor:
            stored[found["trial_id"]] = found
        retry: list[tuple[TrialRecord, str]] = []
        for record, h in items:
            doc = stored.get(record.trial_id)
            if doc is not None and doc.get("experiment_id") != record.experiment_id:
                # Stored under another experiment: never moved, reported.
                outcome.conflicts[record.trial_id] = str(doc.get("experiment_id"))
            elif doc is not None and keeps_stored(
                _stored_order(doc), str(doc.get("content_hash")), record_order(record), h
            ):
                outcome.unchanged.append(record.trial_id)
            else:
                retry.append((record, h))
        return retry

    async def get_record(self, trial_id: str) -> TrialRecord | None:
        """One record, or None."""
        async with _translate_errors("get_record"):
            doc = await self._trials.find_one({"trial_id": trial_id})
        return _to_record(doc) if doc else None

    async def records_for(self, experiment_id: str) -> list[TrialRecord]:
        """All records of an experiment, ordered by trial_id."""
        async with _translate_errors("records_for"):
            cursor = self._trials.find({"experiment_id": experiment_id}).sort("trial_id", ASCENDING)
            return [_to_record(doc) async for doc in cursor]

    async def count_records(self, experiment_id: str) -> int:
        """Number of records of an experiment."""
        async with _translate_errors("count_records"):
            return await self._trials.count_documents({"experiment_id": experiment_id})

    async def scored_trial_ids(self, experiment_id: str) -> set[str]:
        """trial_ids whose record carries a valid reward (resume skips these)."""
        async with _translate_errors("scored_trial_ids"):
            cursor = self._trials.find(
                {"experiment_id": experiment_id, "evaluation.reward_valid": True},
                {"_id": 0, "trial_id": 1},
            )
            return {doc["trial_id"] async for doc in cursor}

    async def upsert_experiment(self, info: ExperimentInfo) -> None:
        """Record (or refresh) an experiment's submission metadata."""
        now = datetime.now(UTC)
        async with _translate_errors("upsert_experiment"):
            await self._experiments.update_one(
                {"experiment_id": info.experiment_id},
                {
                    "$set": {
                        "experiment_id": info.experiment_id,
                        "name": info.name,
                        "n_trials": info.n_trials,
                        "manifest": info.manifest,
                        "updated_at": now,
                    },
                    "$setOnInsert": {"created_at": now},
                },
                upsert=True,
            )

    async def get_experiment(self, experiment_id: str) -> ExperimentInfo | None:
        """An experiment's submission metadata, or None."""
        async with _translate_errors("get_experiment"):
            doc = await self._experiments.find_one({"experiment_id": experiment_id})
        if doc is None:
            return None
        return ExperimentInfo(
            experiment_id=doc["experiment_id"],
            name=doc["name"],
            n_trials=int(doc["n_trials"]),
            manifest=doc["manifest"],
        )

    async def experiment_ids(self) -> list[str]:
        """Ids of all experiments with metadata or records, newest (first seen) first."""
        first_seen: dict[str, datetime] = {}

        def see(experiment_id: str, when: datetime) -> None:
            if experiment_id not in first_seen or when < first_seen[experiment_id]:
                first_seen[experiment_id] = when

        async with _translate_errors("experiment_ids"):
            async for doc in self._experiments.find({}, {"experiment_id": 1, "created_at": 1}):
                see(doc["experiment_id"], doc["created_at"])
            cursor = await self._trials.aggregate(
                [{"$group": {"_id": "$experiment_id", "first": {"$min": "$first_imported_at"}}}]
            )
            async for doc in cursor:
                if doc["first"] is not None:
                    see(doc["_id"], doc["first"])
        # Ties (same millisecond) break by id so the order is stable.
        by_id = sorted(first_seen)
        return sorted(by_id, key=lambda e: first_seen[e], reverse=True)

    async def close(self) -> None:
        """Release connections."""
        await self._client.close()


def _document(record: TrialRecord, content_hash: str, now: datetime) -> Doc:
    doc = record.model_dump(mode="json")
    doc["content_hash"] = content_hash
    doc["order_key"] = record_order(record)
    doc["imported_at"] = now
    return doc


def _stored_order(doc: Doc) -> str:
    """A stored document's order key; one written before order keys ranks by status."""
    key = doc.get("order_key")
    return key if isinstance(key, str) else status_order(str(doc.get("status")))


def _upsert_op(record: TrialRecord, content_hash: str, now: datetime) -> UpdateOne:
    order = record_order(record)
    # The stored document may be replaced when it ranks at or below the new record
    # (keeps_stored): by its order key, or, written before order keys, by its status.
    older: list[Doc] = [{"order_key": {"$lte": order}}, {"order_key": {"$exists": False}}]
    if record.status != "complete":
        older[1]["status"] = {"$ne": "complete"}
    query: Doc = {
        "trial_id": record.trial_id,
        # A record never changes experiment: a write for another one cannot match.
        "experiment_id": record.experiment_id,
        "content_hash": {"$ne": content_hash},
        "$or": older,
    }
    doc = _document(record, content_hash, now)
    return UpdateOne(query, {"$set": doc, "$setOnInsert": {"first_imported_at": now}}, upsert=True)


def _duplicate_key_indexes(exc: BulkWriteError) -> set[int]:
    """Indexes of an unordered bulk's writes refused by the unique trial_id index.

    Any other failure (a write concern error, another write error) is not a
    duplicate to sort out: ``exc`` is raised again.
    """
    details = exc.details
    errors = details.get("writeErrors", [])
    if details.get("writeConcernErrors") or any(e.get("code") != DUPLICATE_KEY for e in errors):
        raise exc
    return {int(e["index"]) for e in errors}


def _to_record(doc: Doc) -> TrialRecord:
    return TrialRecord.model_validate({k: v for k, v in doc.items() if k not in _BOOKKEEPING})
