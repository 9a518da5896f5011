"""MongoLedger: the Ledger port over MongoDB (or SecantusDB) with PyMongo's async client.

About 430 lines: one adapter for one port, each method a query and its error
translation; splitting it would split the document shape and the write protocol
described below (the experiments collection is mongo_experiments's, the derived
values' mongo_derived's).

Document shape (collection ``trials``): the record's JSON-mode dump (datetimes as
ISO-8601 strings, so a record reads back exactly as written, microseconds included;
BSON dates would truncate them to milliseconds and change the content hash) plus

- ``content_hash``: sha256 of the record's canonical JSON (see
  ``services.common.ports.record_content_hash``);
- ``order_key``: the record's rank among the records of its trial
  (``services.common.ports.record_order``), a string the update filter compares;
- ``tally``: what the record adds to its experiment's tally
  (``services.reports.tally.record_tally``), subtracted when it is replaced;
- ``imported_at``: BSON date of the last write that changed the document;
- ``first_imported_at``: BSON date of the insert.

A batch marks its experiments (mongo_experiments: ``begin``), then is inserted as it
is (unordered ``insert_many``): new trials, the usual case, are stored by the
cheapest write. Items whose trial_id is stored already fail on the unique index; their
stored versions (experiment, hash, order key, tally) are read, and each item is a
conflict (stored under another experiment: a forged or misrouted event, a copied job
folder imported under another name; never moved, reported in
``UpsertOutcome.conflicts``), ``unchanged`` (``keeps_stored``: same content, or the
stored one ranks above), or a replacement: ``UpdateOne({trial_id, experiment_id,
content_hash: <the hash read>}, {$set: doc}, upsert=True)``. A replacement whose
stored version changed since the read (a concurrent writer) matches nothing, its
insert hits the unique index (11000), and it is read and decided again: so the tally
subtracted is always the replaced version's. Finally the batch adds its tally
differences to each experiment (``commit``). A document written before order keys
existed has none: it ranks by its status alone (``ports.status_order``), as the ledger
ranked records then; one written before tallies is read whole once to compute its own.

Connection problems surface as ``LedgerUnavailable``; anything else propagates.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Final

from pymongo import ASCENDING, AsyncMongoClient, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import BulkWriteError, ConnectionFailure

from schemas.record import TrialRecord
from services.common.adapters.mongo_derived import DerivedStore
from services.common.adapters.mongo_experiments import ExperimentStore
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
from services.reports.tally import Tally, difference, record_tally

DUPLICATE_KEY: Final = 11000
_MAX_ROUNDS: Final = 3
_IDS_PER_QUERY: Final = 1000
"""Trial ids in one ``$in`` of ``recorded_among`` (a query document stays small)."""
# Stored next to the record's own fields; stripped when reading a record back.
_BOOKKEEPING: Final = (
    "_id",
    "content_hash",
    "order_key",
    "imported_at",
    "first_imported_at",
    "tally",
)

Doc = dict[str, Any]
Deltas = dict[str, Tally]


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
        raise LedgerUnavailable(f"ledger unreachable during {action}: {_cause(exc)}") from exc


def _cause(exc: ConnectionFailure) -> str:
    """The failure without pymongo's topology dump: a server selection timeout's text
    is each server's error, then the timeout and a description of every server (about
    800 characters for one server), then the configured socket timeouts per server."""
    text = str(exc).split(", Timeout: ", 1)[0]
    return re.sub(r" \(configured timeouts: [^)]*\)", "", text)


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
        self._store = ExperimentStore(db["experiments"], db["ledger_meta"])
        self._derived = DerivedStore(db["derived"])

    async def ensure_indexes(self) -> None:
        """Create the unique index on trial_id and the query indexes. Idempotent.

        One index per read of the reports (services.reports.queries), so MongoDB answers
        each from an index: ``records_for`` filters on experiment_id and sorts by
        trial_id (no in-memory sort of an experiment's records); ``scored_trial_ids``
        is covered by (experiment_id, evaluation.reward_valid, trial_id) (no document
        fetched); ``count_records`` counts keys of either; the experiments list
        reads the experiments collection by (created_at, experiment_id). On a ledger
        written before experiments were listed from that collection, the first call
        also creates their documents (``ExperimentStore.backfill_listing``). The single-field
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
            await self._store.ensure_indexes()
            # Once per ledger: listing documents for experiments written before them.
            await self._store.backfill_listing(self._trials)

    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        """Insert or replace records by trial_id; identical content is ``unchanged``.

        A trial_id repeated inside the batch is written once (see ``collapse_batch``)
        and reported once. Each experiment's tally follows the records written
        (mongo_experiments). Raises LedgerUnavailable when the server cannot be
        reached; the whole batch may then be retried safely.
        """
        outcome = UpsertOutcome()
        pending = [(r, record_content_hash(r)) for r in collapse_batch(records)]
        if not pending:
            return outcome
        items = pending
        experiments = {r.experiment_id for r, _ in items}
        deltas: dict[str, Tally] = {}
        async with _translate_errors("upsert_records"):
            batch, created = await self._store.begin(experiments)
            pending = await self._insert_new(pending, outcome, deltas)
            for _ in range(_MAX_ROUNDS):
                if not pending:
                    break
                pending = await self._replace_stored(pending, outcome, deltas)
            used = {r.experiment_id for r, _ in items if r.trial_id not in outcome.conflicts}
            await self._store.commit(batch, experiments, deltas, unused=created - used)
        if pending:
            ids = ", ".join(r.trial_id for r, _ in pending)
            raise LedgerConflict(f"records kept changing under concurrent writers: {ids}")
        return outcome

    async def _insert_new(
        self, items: list[tuple[TrialRecord, str]], outcome: UpsertOutcome, deltas: Deltas
    ) -> list[tuple[TrialRecord, str]]:
        """Insert the items no document exists for yet; return the others.

        Most batches are new trials (a fresh import, finished runs), and a plain
        insert is the cheapest write: 3-4x the rate of the conditional upsert on
        SecantusDB (benchmarks/, docs/performance.md). An item whose trial_id is
        stored already fails on the unique index and goes the replacement way.
        """
        now = datetime.now(UTC)
        docs = [_document(record, h, now) | {"first_imported_at": now} for record, h in items]
        try:
            await self._trials.insert_many(docs, ordered=False)
            stored: set[int] = set()
        except BulkWriteError as exc:
            stored = _duplicate_key_indexes(exc)
        for i, (record, _h) in enumerate(items):
            if i not in stored:
                outcome.inserted.append(record.trial_id)
                _add(deltas, record.experiment_id, record_tally(record))
        return [items[i] for i in sorted(stored)]

    async def _replace_stored(
        self, items: list[tuple[TrialRecord, str]], outcome: UpsertOutcome, deltas: Deltas
    ) -> list[tuple[TrialRecord, str]]:
        """Replace the stored records these items outrank; return those to retry.

        The stored version is read first: an item naming another experiment is a
        conflict, one that ``keeps_stored`` is ``unchanged``; the others replace the
        version read, and only it (the update's filter pins its content hash), so the
        tally subtracted is the replaced record's. An item whose version changed in
        between (a concurrent writer) hits the unique index and is retried.
        """
        stored = await self._stored(r.trial_id for r, _ in items)
        now = datetime.now(UTC)
        ops: list[UpdateOne] = []
        written: list[tuple[TrialRecord, str, Doc | None]] = []
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
                ops.append(_upsert_op(record, h, now, doc))
                written.append((record, h, doc))
        if not ops:
            return []
        upserted, duplicates = await self._bulk(ops)
        retry: list[tuple[TrialRecord, str]] = []
        for index, (record, h, doc) in enumerate(written):
            if index in duplicates:
                retry.append((record, h))
                continue
            (outcome.inserted if index in upserted else outcome.updated).append(record.trial_id)
            old = doc["tally"] if doc is not None and index not in upserted else {}
            _add(deltas, record.experiment_id, difference(record_tally(record), old))
        return retry

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

    async def _stored(self, trial_ids: Iterable[str]) -> dict[str, Doc]:
        """The stored version of each trial: experiment, hash, order key and tally.

        A document written before per-record tallies existed is read whole once to
        compute its tally.
        """
        ids = list(trial_ids)
        stored: dict[str, Doc] = {}
        fields = ("trial_id", "experiment_id", "content_hash", "status", "order_key", "tally")
        cursor = self._trials.find(
            {"trial_id": {"$in": ids}}, {"_id": 0, **dict.fromkeys(fields, 1)}
        )
        async for found in cursor:
            stored[found["trial_id"]] = found
        untallied = [t for t, doc in stored.items() if "tally" not in doc]
        if untallied:
            async for full in self._trials.find({"trial_id": {"$in": untallied}}):
                if full.get("content_hash") == stored[full["trial_id"]].get("content_hash"):
                    stored[full["trial_id"]]["tally"] = record_tally(_to_record(full))
                else:
                    # Changed since the first read: retried by the pinned update.
                    stored[full["trial_id"]]["tally"] = {}
        return stored

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

    async def recorded_among(self, experiment_id: str, trial_ids: Iterable[str]) -> set[str]:
        """The ids among ``trial_ids`` that have a record in the experiment (the unique
        trial_id index; ids only, in chunks that keep each query small)."""
        ids, found = sorted(set(trial_ids)), set()
        async with _translate_errors("recorded_among"):
            for i in range(0, len(ids), _IDS_PER_QUERY):
                chunk = ids[i : i + _IDS_PER_QUERY]
                cursor = self._trials.find(
                    {"trial_id": {"$in": chunk}, "experiment_id": experiment_id},
                    {"_id": 0, "trial_id": 1},
                )
                found.update([doc["trial_id"] async for doc in cursor])
        return found

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
        async with _translate_errors("upsert_experiment"):
            await self._store.upsert(info)

    async def get_experiment(self, experiment_id: str) -> ExperimentInfo | None:
        """An experiment's submission metadata, or None."""
        async with _translate_errors("get_experiment"):
            return await self._store.get(experiment_id)

    async def experiment_ids(self) -> list[str]:
        """Ids of all experiments with metadata or records, newest (first seen) first.

        Reads the experiments collection alone: every write of records keeps a
        document for its experiment (mongo_experiments).
        """
        async with _translate_errors("experiment_ids"):
            return await self._store.ids()

    async def experiment_tally(self, experiment_id: str) -> Tally:
        """The experiment's tally as its writes kept it (rebuilt from the records when
        a writer died mid-batch or the ledger predates tallies)."""
        async with _translate_errors("experiment_tally"):
            return await self._store.tally(experiment_id, lambda: self.records_for(experiment_id))

    async def experiment_version(self, experiment_id: str) -> str | None:
        """The experiment document's ``_id`` and ``tally_version`` (mongo_experiments:
        bumped before and after every write batch, and by a metadata upsert); None
        while a batch is writing its records, or for an experiment without a document."""
        async with _translate_errors("experiment_version"):
            return await self._store.version(experiment_id)

    async def stored_derived(self, experiment_id: str, kind: str, version: str) -> bytes | None:
        """The blob kept for (experiment, kind) under exactly ``version`` (mongo_derived)."""
        async with _translate_errors("stored_derived"):
            return await self._derived.get(experiment_id, kind, version)

    async def keep_derived(self, experiment_id: str, kind: str, version: str, blob: bytes) -> None:
        """Keep ``blob`` under ``version``, replacing any other version's (mongo_derived)."""
        async with _translate_errors("keep_derived"):
            await self._derived.keep(experiment_id, kind, version, blob)

    async def close(self) -> None:
        """Release connections."""
        await self._client.close()


def _document(record: TrialRecord, content_hash: str, now: datetime) -> Doc:
    doc = record.model_dump(mode="json")
    doc["content_hash"] = content_hash
    doc["order_key"] = record_order(record)
    doc["imported_at"] = now
    doc["tally"] = record_tally(record)
    return doc


def _add(deltas: Deltas, experiment_id: str, tally: Tally) -> None:
    into = deltas.setdefault(experiment_id, {})
    for name, value in tally.items():
        into[name] = into.get(name, 0) + value


def _stored_order(doc: Doc) -> str:
    """A stored document's order key; one written before order keys ranks by status."""
    key = doc.get("order_key")
    return key if isinstance(key, str) else status_order(str(doc.get("status")))


def _upsert_op(
    record: TrialRecord, content_hash: str, now: datetime, stored: Doc | None
) -> UpdateOne:
    """Replace ``stored`` (the version read, by its content hash) with ``record``.

    Without a stored version read, the filter says which documents ``record`` may
    replace (keeps_stored): those ranking at or below it by their order key, or,
    written before order keys, by their status. Either way a document not matching
    makes the upsert hit the unique index (retried), never a second document.
    """
    order = record_order(record)
    query: Doc = {
        "trial_id": record.trial_id,
        # A record never changes experiment: a write for another one cannot match.
        "experiment_id": record.experiment_id,
    }
    if stored is not None:
        query["content_hash"] = stored.get("content_hash")
    else:
        older: list[Doc] = [{"order_key": {"$lte": order}}, {"order_key": {"$exists": False}}]
        if record.status != "complete":
            older[1]["status"] = {"$ne": "complete"}
        query |= {"content_hash": {"$ne": content_hash}, "$or": older}
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
