"""The ``derived`` collection of MongoLedger: computed report values, one per
(experiment, kind), under the version they were computed for.

Document: ``_id`` = {experiment_id, kind}, ``version`` (the token the caller gives:
services/reports/stored.py puts the experiment's content version in it), ``blob``
(the encoded value, BSON binary) and ``kept_at``. Keeping a value replaces the
document of its (experiment, kind) whatever version it held, so the collection holds
at most one document per experiment and kind: old versions are deleted by the write
that supersedes them, with no TTL to tune. A read asks for the version it wants
(``find_one`` by ``_id`` and ``version``): a value kept under any other version is
not returned, so a value computed before a write is never served after it.

Two writers keeping the same key at once: the later replace wins (each is a value
of some version; a reader asking for another version recomputes), and the loser of
a racing upsert's insert (duplicate key) gives up; keeping is best effort anyway.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

from bson import Binary
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from services.common.ports import MAX_DERIVED_BYTES

Doc = dict[str, Any]


class DerivedStore:
    """The derived collection (see the module docstring)."""

    def __init__(self, collection: AsyncCollection[Doc]) -> None:
        self._derived = collection

    async def get(self, experiment_id: str, kind: str, version: str) -> bytes | None:
        """The blob kept for (experiment, kind) under exactly ``version``, or None."""
        found = await self._derived.find_one(
            {"_id": _key(experiment_id, kind), "version": version}, {"blob": 1}
        )
        return bytes(found["blob"]) if found is not None else None

    async def keep(self, experiment_id: str, kind: str, version: str, blob: bytes) -> None:
        """Replace (experiment, kind)'s document with ``blob`` under ``version``."""
        if len(blob) > MAX_DERIVED_BYTES:
            raise ValueError(f"derived value of {len(blob):,} bytes: over {MAX_DERIVED_BYTES:,}")
        doc = {"version": version, "blob": Binary(blob), "kept_at": datetime.now(UTC)}
        # A concurrent keep of the same key inserted first: its value stands.
        with contextlib.suppress(DuplicateKeyError):
            await self._derived.replace_one({"_id": _key(experiment_id, kind)}, doc, upsert=True)


def _key(experiment_id: str, kind: str) -> Doc:
    # Field order matters in an embedded _id: always built here, in this order.
    return {"experiment_id": experiment_id, "kind": kind}
