"""A ledger in front of another: every call goes through, except those the wrapper
answers itself. The counting one shows what a kept (derived) value saves, and that a
read served from it read no record: the ledger benchmark times stored reads behind it,
the derived-store contract test counts with it; those tests' pinned-version and
failing wrappers (their negative controls) build on the same base."""

from __future__ import annotations

from typing import Any, cast

from schemas.record import TrialRecord
from services.common.ports import Ledger


class WrappedLedger:
    """Delegates every call to ``inner``; a subclass overrides the ones it changes."""

    def __init__(self, inner: Ledger) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class RecordReads(WrappedLedger):
    """Counts the calls to ``records_for``."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner)
        self.record_reads = 0

    async def records_for(self, experiment_id: str) -> list[TrialRecord]:
        """Counted, then delegated."""
        self.record_reads += 1
        return await self._inner.records_for(experiment_id)


def counting_reads[L: Ledger](inner: L) -> tuple[L, RecordReads]:
    """``inner`` behind a :class:`RecordReads`, typed as ``inner`` (every other call goes
    through to it), and the counter."""
    wrapper = RecordReads(inner)
    return cast(L, wrapper), wrapper
