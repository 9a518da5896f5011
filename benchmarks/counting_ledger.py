"""A ledger that counts its reads of records: what a kept (derived) value saves, and
the proof that a read served from it read none. The ledger benchmark times stored reads
behind it; the derived-store contract test counts with it."""

from __future__ import annotations

from typing import Any, cast

from schemas.record import TrialRecord
from services.common.ports import Ledger


class RecordReads:
    """Delegates every call to ``inner`` and counts those to ``records_for``."""

    def __init__(self, inner: Ledger) -> None:
        self._inner = inner
        self.record_reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def records_for(self, experiment_id: str) -> list[TrialRecord]:
        """Counted, then delegated."""
        self.record_reads += 1
        return await self._inner.records_for(experiment_id)


def counting_reads[L: Ledger](inner: L) -> tuple[L, RecordReads]:
    """``inner`` behind a :class:`RecordReads`, typed as ``inner`` (every other call goes
    through to it), and the counter."""
    wrapper = RecordReads(inner)
    return cast(L, wrapper), wrapper
