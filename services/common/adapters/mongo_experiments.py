"""The ``experiments`` collection of MongoLedger: metadata, the listing, the tallies.

One document per experiment, keyed by ``experiment_id`` (unique index):

- submission metadata (``name``, ``n_trials``, ``manifest``) once submitted; an
  experiment known only by its records (an imported Harbor job) has none, and
  ``get_experiment`` says None for it, as before;
- ``created_at``: when the ledger first heard of it (submission or first record);
  the experiment list reads this collection alone, newest first, through an index on
  (created_at desc, experiment_id) instead of grouping every record;
- ``tally``: sums of ``services.reports.tally.record_tally`` over its records, kept
  by each write (``begin`` / ``commit``): what ``status`` reads.

Why the tally can be trusted. A write batch first marks each of its experiments
(``tally_pending.<batch>``: now, which also creates the document of an experiment not
seen before), then writes the records, each replacement pinned to the stored version
whose tally it subtracts (mongo_ledger), then adds the differences and removes its mark
in one atomic update. So a replay adds nothing (the records are unchanged), a record
replaced by a better one counts once, and concurrent writers' ``$inc`` add up. A
writer that died between its records and its commit leaves its mark: a mark older
than ``STALE_PENDING`` makes the next read rebuild the tally from the records; so does
a document without ``tally_ok`` (written before tallies existed, or by the listing
backfill). A rebuild stores its sums only when no other write started or ended while
it read the records (``tally_version``, bumped by every mark and commit, compared
when storing) and no live mark is left.

The same ``tally_version`` is the experiment's content version (``version``, what the
report cache is keyed by): every write batch bumps it when it marks the experiment,
before any record changes, and again in the commit, after they all changed; a
metadata upsert bumps it in the same update that changes the metadata. While a live
mark is on the document ``version`` says None (records may be changing: nothing
derived from them may be kept). The document's ``_id`` is part of the token, so an
experiment deleted and written again never repeats an earlier token.

Ledgers written before the listing existed have records of experiments without a
document: ``backfill_listing`` (run once by ``ensure_indexes``, remembered in
``ledger_meta``) creates them, dated by their first record.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from schemas.record import TrialRecord
from services.common.ports import ExperimentInfo
from services.reports.tally import Tally, tally_of

Doc = dict[str, Any]

STALE_PENDING: Final = timedelta(minutes=10)
"""A write batch's mark older than this is a writer that died (batches take seconds)."""
BACKFILL_ID: Final = "experiments-listing-backfill"
"""``ledger_meta`` document saying the one-time listing backfill is done."""
LISTING_SORT: Final = [("created_at", DESCENDING), ("experiment_id", ASCENDING)]


class ExperimentStore:
    """The experiments collection (see the module docstring)."""

    def __init__(self, experiments: AsyncCollection[Doc], meta: AsyncCollection[Doc]) -> None:
        self._experiments = experiments
        self._meta = meta

    async def ensure_indexes(self) -> None:
        """The unique experiment_id index and the listing's (created_at, experiment_id)."""
        await self._experiments.create_index([("experiment_id", ASCENDING)], unique=True)
        await self._experiments.create_index(LISTING_SORT)

    async def backfill_listing(self, trials: AsyncCollection[Doc]) -> int:
        """Once per ledger: a document for each experiment that has records and none;
        ``created_at`` no later than its first record. Returns documents created.

        Scans every record (the old experiment list's ``$group``), so it runs once,
        then ``ledger_meta`` remembers it. Concurrent runs (several services starting)
        do the same idempotent writes.
        """
        if await self._meta.find_one({"_id": BACKFILL_ID}) is not None:
            return 0
        created = 0
        cursor = await trials.aggregate(
            [
                {
                    "$group": {
                        "_id": "$experiment_id",
                        "first": {"$min": "$first_imported_at"},
                        "imported": {"$min": "$imported_at"},
                    }
                }
            ]
        )
        now = datetime.now(UTC)
        async for group in cursor:
            first = group["first"] or group["imported"] or now
            result = await _upsert(
                self._experiments,
                {"experiment_id": group["_id"]},
                {"$min": {"created_at": first}},
            )
            created += 1 if result else 0
        await self._meta.update_one(
            {"_id": BACKFILL_ID}, {"$set": {"done_at": now, "created": created}}, upsert=True
        )
        return created

    async def upsert(self, info: ExperimentInfo) -> None:
        """Record (or refresh) an experiment's submission metadata."""
        now = datetime.now(UTC)
        await _upsert(
            self._experiments,
            {"experiment_id": info.experiment_id},
            {
                "$set": {
                    "name": info.name,
                    "n_trials": info.n_trials,
                    "manifest": info.manifest,
                    "updated_at": now,
                },
                # A new document: the backfill has run, so no record of it exists yet.
                "$setOnInsert": {"created_at": now, "tally": {}, "tally_ok": True},
                # The content version: the report shows the name and the trial count.
                "$inc": {"tally_version": 1},
            },
        )

    async def get(self, experiment_id: str) -> ExperimentInfo | None:
        """Submission metadata, or None (also for an experiment known only by records)."""
        doc = await self._experiments.find_one({"experiment_id": experiment_id})
        if doc is None or "manifest" not in doc:
            return None
        return ExperimentInfo(
            experiment_id=doc["experiment_id"],
            name=doc["name"],
            n_trials=int(doc["n_trials"]),
            manifest=doc["manifest"],
        )

    async def ids(self) -> list[str]:
        """Every experiment, newest first (ties by id), from this collection alone."""
        cursor = self._experiments.find({}, {"_id": 0, "experiment_id": 1}).sort(LISTING_SORT)
        return [doc["experiment_id"] async for doc in cursor]

    async def version(self, experiment_id: str) -> str | None:
        """The experiment's content version (see the module docstring): None when it
        has no document or a write batch's mark on it is live (not ``STALE_PENDING``)."""
        doc = await self._experiments.find_one(
            {"experiment_id": experiment_id}, {"_id": 1, "tally_version": 1, "tally_pending": 1}
        )
        if doc is None:
            return None
        pending: dict[str, datetime] = doc.get("tally_pending") or {}
        now = datetime.now(UTC)
        if any(now - at <= STALE_PENDING for at in pending.values()):
            return None
        return f"{doc['_id']}.{doc.get('tally_version', 0)}"

    async def begin(self, experiment_ids: Iterable[str]) -> tuple[str, set[str]]:
        """Mark a write batch on each experiment, creating unseen ones: (batch id,
        experiments whose document this created)."""
        batch = uuid.uuid4().hex
        now = datetime.now(UTC)
        created: set[str] = set()
        for experiment_id in sorted(set(experiment_ids)):
            if await _upsert(
                self._experiments,
                {"experiment_id": experiment_id},
                {
                    "$set": {f"tally_pending.{batch}": now},
                    "$inc": {"tally_version": 1},
                    "$setOnInsert": {"created_at": now, "tally": {}, "tally_ok": True},
                },
            ):
                created.add(experiment_id)
        return batch, created

    async def commit(
        self,
        batch: str,
        experiment_ids: Iterable[str],
        deltas: Mapping[str, Tally],
        unused: Iterable[str] = (),
    ) -> None:
        """Add each experiment's differences and remove the batch's mark, atomically.

        ``unused``: experiments whose document ``begin`` created but under which the
        batch stored nothing (every write was refused as naming another experiment's
        trial): their document is removed, so a misrouted write lists no experiment,
        unless another writer has marked it since or it has records or metadata.
        """
        for experiment_id in sorted(set(experiment_ids)):
            inc: dict[str, float] = {"tally_version": 1}
            for name, value in deltas.get(experiment_id, {}).items():
                inc[f"tally.{name}"] = value
            await self._experiments.update_one(
                {"experiment_id": experiment_id},
                {"$inc": inc, "$unset": {f"tally_pending.{batch}": ""}},
            )
        for experiment_id in sorted(set(unused)):
            await self._experiments.delete_one(
                {
                    "experiment_id": experiment_id,
                    "manifest": {"$exists": False},
                    "tally_pending": {},
                    "tally.recorded": {"$exists": False},
                }
            )

    async def tally(
        self, experiment_id: str, load: Callable[[], Awaitable[list[TrialRecord]]]
    ) -> Tally:
        """The kept tally, or one rebuilt from the records (``load``) when it cannot be
        trusted (see the module docstring); a rebuild is stored when safe."""
        doc = await self._experiments.find_one(
            {"experiment_id": experiment_id},
            {"_id": 0, "tally": 1, "tally_ok": 1, "tally_pending": 1, "tally_version": 1},
        )
        pending: dict[str, datetime] = (doc or {}).get("tally_pending") or {}
        now = datetime.now(UTC)
        stale = [batch for batch, at in pending.items() if now - at > STALE_PENDING]
        if doc is not None and doc.get("tally_ok") and not stale:
            return {k: v for k, v in (doc.get("tally") or {}).items() if v}
        rebuilt = tally_of(await load())
        if doc is not None and len(stale) == len(pending):
            update: Doc = {
                "$set": {"tally": rebuilt, "tally_ok": True},
                "$inc": {"tally_version": 1},
            }
            if stale:
                update["$unset"] = {f"tally_pending.{batch}": "" for batch in stale}
            # Stored only if no write marked or committed since the read (version).
            await self._experiments.update_one(
                {"experiment_id": experiment_id, "tally_version": doc.get("tally_version")},
                update,
            )
        return rebuilt


async def _upsert(collection: AsyncCollection[Doc], query: Doc, update: Doc) -> bool:
    """``update_one(upsert=True)``; whether it inserted. Two writers upserting one new
    document at once may both try the insert: the loser's duplicate key is retried
    (it then matches the winner's document)."""
    try:
        result = await collection.update_one(query, update, upsert=True)
    except DuplicateKeyError:
        result = await collection.update_one(query, update, upsert=True)
    return result.upserted_id is not None
