"""In-memory fakes of the ports, for unit tests of handlers and logic.

InMemoryLedger has MongoLedger's exact semantics: both apply the rules kept with the
port (``services.common.ports``: content hash, which record wins, batch collapse), and
the contract suite in tests/integration/test_ledger_contract.py runs against both.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from typing import Any

from schemas.record import TrialRecord
from services.common.ports import (
    ExperimentInfo,
    UpsertOutcome,
    collapse_batch,
    keeps_stored,
    record_content_hash,
)


class InMemoryLedger:
    """A Ledger held in dictionaries; stores JSON-mode dumps like the Mongo adapter."""

    def __init__(self) -> None:
        # trial_id -> (json-mode record, content hash)
        self._records: dict[str, tuple[dict[str, Any], str]] = {}
        self._experiments: dict[str, ExperimentInfo] = {}
        # First time an experiment was seen (metadata or a record), for newest-first
        # ordering; a counter rather than a clock so ties cannot happen.
        self._first_seen: dict[str, int] = {}
        self._clock = itertools.count()
        self.closed = False

    def _seen(self, experiment_id: str) -> None:
        self._first_seen.setdefault(experiment_id, next(self._clock))

    async def ensure_indexes(self) -> None:
        """Nothing to create; present for interface parity."""

    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        """Insert or replace records by trial_id; identical content is ``unchanged``."""
        outcome = UpsertOutcome()
        for record in collapse_batch(records):
            new_hash = record_content_hash(record)
            stored = self._records.get(record.trial_id)
            if stored is not None and keeps_stored(
                stored[0]["status"], stored[1], record.status, new_hash
            ):
                outcome.unchanged.append(record.trial_id)
                continue
            self._records[record.trial_id] = (record.model_dump(mode="json"), new_hash)
            self._seen(record.experiment_id)
            (outcome.updated if stored is not None else outcome.inserted).append(record.trial_id)
        return outcome

    async def get_record(self, trial_id: str) -> TrialRecord | None:
        """One record, or None."""
        stored = self._records.get(trial_id)
        return TrialRecord.model_validate(stored[0]) if stored else None

    async def records_for(self, experiment_id: str) -> list[TrialRecord]:
        """All records of an experiment, ordered by trial_id."""
        return [
            TrialRecord.model_validate(doc)
            for _, (doc, _h) in sorted(self._records.items())
            if doc["experiment_id"] == experiment_id
        ]

    async def count_records(self, experiment_id: str) -> int:
        """Number of records of an experiment."""
        return sum(1 for doc, _ in self._records.values() if doc["experiment_id"] == experiment_id)

    async def scored_trial_ids(self, experiment_id: str) -> set[str]:
        """trial_ids whose record carries a valid reward."""
        return {
            doc["trial_id"]
            for doc, _ in self._records.values()
            if doc["experiment_id"] == experiment_id and doc["evaluation"]["reward_valid"]
        }

    async def upsert_experiment(self, info: ExperimentInfo) -> None:
        """Record (or refresh) an experiment's submission metadata."""
        # Deep copy: the caller may mutate its manifest dict after the call.
        self._experiments[info.experiment_id] = copy.deepcopy(info)
        self._seen(info.experiment_id)

    async def get_experiment(self, experiment_id: str) -> ExperimentInfo | None:
        """An experiment's submission metadata, or None."""
        info = self._experiments.get(experiment_id)
        return copy.deepcopy(info) if info else None

    async def experiment_ids(self) -> list[str]:
        """Ids of all experiments with metadata or records, newest (first seen) first."""
        return sorted(self._first_seen, key=lambda e: (-self._first_seen[e], e))

    async def close(self) -> None:
        """Mark closed (tests may assert it); the data stays readable."""
        self.closed = True
