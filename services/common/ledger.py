"""The Ledger port: where TrialRecords live. Adapters: MongoLedger, InMemoryLedger.

Writes are idempotent by design: a record is keyed by trial_id (unique index), and
re-writing the same content is reported as ``unchanged`` without touching the
document. A ``partial`` record never replaces a ``complete`` one, so a late or
replayed failure cannot erase a real result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from schemas.record import TrialRecord


@dataclass(slots=True)
class UpsertOutcome:
    """What one batch of upserts did, per trial_id."""

    inserted: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def changed(self, trial_id: str) -> bool:
        return trial_id in self.inserted or trial_id in self.updated


@dataclass(frozen=True, slots=True)
class ExperimentInfo:
    """What the ledger knows of an experiment's submission."""

    experiment_id: str
    name: str
    n_trials: int
    manifest: dict[str, Any]


class LedgerUnavailable(RuntimeError):
    """The ledger could not be reached; the caller should retry later (transient)."""


class Ledger(Protocol):
    """Storage of TrialRecords and experiment metadata."""

    async def ensure_indexes(self) -> None:
        """Create the unique index on trial_id (and query indexes). Idempotent."""

    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        """Insert or replace records by trial_id; identical content is ``unchanged``."""

    async def get_record(self, trial_id: str) -> TrialRecord | None:
        """One record, or None."""

    async def records_for(self, experiment_id: str) -> list[TrialRecord]:
        """All records of an experiment."""

    async def count_records(self, experiment_id: str) -> int:
        """Number of records of an experiment."""

    async def scored_trial_ids(self, experiment_id: str) -> set[str]:
        """trial_ids whose record carries a valid reward (resume skips these)."""

    async def upsert_experiment(self, info: ExperimentInfo) -> None:
        """Record (or refresh) an experiment's submission metadata."""

    async def get_experiment(self, experiment_id: str) -> ExperimentInfo | None:
        """An experiment's submission metadata, or None."""

    async def experiment_ids(self) -> list[str]:
        """Ids of all experiments with metadata or records, newest first if known."""

    async def close(self) -> None:
        """Release connections."""
