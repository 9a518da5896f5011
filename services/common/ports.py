"""The ports: what service logic depends on. Adapters live in services.common.adapters.

    EventBus     publish typed events (one, or many at once), each with a dedup id
    Ledger       TrialRecords and experiment metadata, keyed by trial_id
    Coordinator  what runners share: concurrency leases, attempt counters, cancel flags
    Executor     runs one attempt of a trial
    ObjectStore  named blobs (task archives, trial folders) that any machine can fetch

Handlers are typed against these Protocols only; nats, pymongo and Harbor never appear
in a handler. The ledger's shared rules (content hash, which record wins, batch
collapse) live here too, so every Ledger adapter applies the same ones; the contract
suite in tests/integration/test_ledger_contract.py runs against each adapter.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from schemas.events import Envelope, TrialRequested
from schemas.objects import ObjectRef
from schemas.record import TrialRecord
from schemas.subjects import Topology

# -- EventBus ----------------------------------------------------------------------------


class EventBus(Protocol):
    """Publishes events durably; every publish carries a dedup id (JetStream Msg-Id)."""

    @property
    def topology(self) -> Topology:
        """Stream and subject names this bus publishes to."""

    async def publish(self, event: Envelope, *, msg_id: str | None = None) -> bool:
        """Publish ``event`` to its subject and wait for the server's acknowledgement.

        ``msg_id`` defaults to ``event.dedup_id()``. Returns False when the server
        dropped it as a duplicate. Raises TransientError when it cannot be confirmed.
        """

    async def publish_many(self, events: Sequence[Envelope]) -> list[bool]:
        """Publish many events concurrently, each acknowledged; per event, whether new."""


# -- Ledger ------------------------------------------------------------------------------


@dataclass(slots=True)
class UpsertOutcome:
    """What one batch of upserts did, per trial_id."""

    inserted: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def changed(self, trial_id: str) -> bool:
        """Whether the write changed the stored record of ``trial_id``."""
        return trial_id in self.inserted or trial_id in self.updated

    def merge(self, other: UpsertOutcome) -> None:
        """Add ``other``'s trial ids to this outcome."""
        self.inserted += other.inserted
        self.updated += other.updated
        self.unchanged += other.unchanged


@dataclass(frozen=True, slots=True)
class ExperimentInfo:
    """What the ledger knows of an experiment's submission."""

    experiment_id: str
    name: str
    n_trials: int
    manifest: dict[str, Any]


class Ledger(Protocol):
    """Storage of TrialRecords and experiment metadata.

    Writes are idempotent by design: a record is keyed by trial_id (unique index), and
    re-writing the same content is reported as ``unchanged`` without touching the
    document. A ``partial`` record never replaces a ``complete`` one, so a late or
    replayed failure cannot erase a real result (``keeps_stored``).
    Connection problems raise ``LedgerUnavailable`` (a TransientError).
    """

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


def record_content_hash(record: TrialRecord) -> str:
    """sha256 of the record's canonical JSON (sorted keys, no whitespace)."""
    blob = json.dumps(
        record.content_key(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def keeps_stored(stored_status: str, stored_hash: str, new_status: str, new_hash: str) -> bool:
    """Whether a write must leave the stored record alone (reported ``unchanged``).

    Same content is a replay; a partial record never replaces a complete one, so a
    late or replayed failure cannot erase a real result.
    """
    return stored_hash == new_hash or (new_status == "partial" and stored_status == "complete")


def collapse_batch(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """One record per trial_id: the one that applying the batch in order would leave.

    A later record wins, except that a partial one never displaces a complete one.
    Collapsing first means each trial_id is written (and reported) once per batch,
    and the outcome does not depend on the order a server applies an unordered bulk.
    """
    winners: dict[str, TrialRecord] = {}
    for record in records:
        previous = winners.get(record.trial_id)
        if previous is not None and record.status == "partial" and previous.status == "complete":
            continue
        winners[record.trial_id] = record
    return list(winners.values())


# -- Coordinator -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lease:
    """One concurrency slot of an experiment, held by one trial."""

    key: str
    revision: int


class Coordinator(Protocol):
    """State the runners share: concurrency leases, attempt counters, cancel flags.

    Leases make an experiment's ``compute.n_concurrent_trials`` a limit across all
    runners; a lease not renewed within its TTL expires, so a dead runner leaks none.
    """

    async def acquire(self, experiment_id: str, limit: int, holder: str) -> Lease | None:
        """Take a free slot of the experiment, or None when none is free."""

    async def renew(self, lease: Lease) -> Lease:
        """Refresh a lease's TTL (with each heartbeat)."""

    async def release(self, lease: Lease) -> None:
        """Give a slot back (a missing lease is not an error)."""

    async def cancel(self, experiment_id: str) -> None:
        """Flag the experiment cancelled."""

    async def uncancel(self, experiment_id: str) -> None:
        """Lift a cancellation (a new submission of the experiment does)."""

    async def is_cancelled(self, experiment_id: str, *, fresh: bool = False) -> bool:
        """Whether the experiment is cancelled (may be cached unless ``fresh``)."""

    async def next_attempt(self, run_id: str) -> int:
        """Count one more start of ``run_id`` and return the new count (1 first)."""


# -- Executor ----------------------------------------------------------------------------

LogSink = Callable[[str, str, str], Awaitable[None]]
"""(phase, stream, text) -> None: receives live output of a running trial."""


@dataclass(frozen=True, slots=True)
class ExecutionOutcome:
    """What became of one attempt.

    ``completed``: Harbor wrote result.json in ``trial_dir`` (it may record an error,
    named by ``exception_type``). ``failed``: no result could be produced.
    """

    kind: Literal["completed", "failed"]
    trial_dir: Path | None = None
    job_dir: Path | None = None
    exception_type: str | None = None
    message: str | None = None


class Executor(Protocol):
    """Runs trials. Implementations must be safe to call concurrently."""

    name: str
    version: str

    async def run(
        self, request: TrialRequested, attempt: int, on_log: LogSink | None
    ) -> ExecutionOutcome:
        """Run one attempt of a trial to the end (cancellation stops it)."""


# -- ObjectStore -------------------------------------------------------------------------


class ObjectStore(Protocol):
    """Named blobs in one bucket (a JetStream object store), verified by sha256.

    Task archives are named by the task's content checksum, trial folders by run; so a
    put of a name that exists with the same sha256 is a no-op, and readers verify what
    they fetch against the ObjectRef an event carried.
    """

    @property
    def bucket(self) -> str:
        """The bucket's name (as ObjectRef.bucket)."""

    async def put(self, name: str, data: bytes) -> ObjectRef:
        """Store ``data`` under ``name`` (replacing it) and return its reference."""

    async def get(self, ref: ObjectRef) -> bytes:
        """The object's bytes; raises ObjectMissing or ObjectCorrupt (sha256/size differ)."""

    async def info(self, name: str) -> ObjectRef | None:
        """The stored object's reference, or None when there is none."""

    async def delete(self, name: str) -> None:
        """Remove an object (a missing one is not an error)."""
