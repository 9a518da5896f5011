"""The ports: what service logic depends on. Adapters live in services.common.adapters.

One file on purpose (over 350 lines, nearly all Protocol signatures and their
contracts): every adapter and every fake is written against this one page.

    EventBus     publish typed events (one, or many at once), each with a dedup id
    Ledger       TrialRecords and experiment metadata, keyed by trial_id
    Coordinator  what runners share: concurrency leases, attempt counters, cancel/pause flags,
                 agent stops, budgets and spend
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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any, Literal, Protocol

from schemas.events import Envelope, TrialRequested
from schemas.objects import ObjectRef
from schemas.record import TrialRecord
from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.fair_share import TeamShare
from services.common.quotas import Quotas

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
    """What one batch of upserts did, per trial_id.

    ``conflicts`` maps a trial_id to the experiment its stored record belongs to when
    the write named another experiment: a record never changes experiment, so such a
    write is refused (not applied) and reported here, neither changed nor unchanged.
    """

    inserted: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: dict[str, str] = field(default_factory=dict)

    def changed(self, trial_id: str) -> bool:
        """Whether the write changed the stored record of ``trial_id``."""
        return trial_id in self.inserted or trial_id in self.updated

    def merge(self, other: UpsertOutcome) -> None:
        """Add ``other``'s trial ids to this outcome."""
        self.inserted += other.inserted
        self.updated += other.updated
        self.unchanged += other.unchanged
        self.conflicts.update(other.conflicts)


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
    document. A record never replaces one that ranks above it (``record_order``): a
    ``partial`` record never replaces a ``complete`` one, so a late or replayed failure
    cannot erase a real result, and an older complete result never replaces a newer
    one; such a write is reported ``unchanged`` too (``keeps_stored``).
    A record never changes experiment: a write whose trial_id is stored under another
    experiment (a forged or misrouted event, a copied job folder) is not applied and is
    reported in ``UpsertOutcome.conflicts`` with the stored experiment.
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

    async def recorded_among(self, experiment_id: str, trial_ids: Iterable[str]) -> set[str]:
        """The ids among ``trial_ids`` that have a record in the experiment (by the
        unique index: no record is read)."""

    async def scored_trial_ids(self, experiment_id: str) -> set[str]:
        """trial_ids whose record carries a valid reward (resume skips these)."""

    async def upsert_experiment(self, info: ExperimentInfo) -> None:
        """Record (or refresh) an experiment's submission metadata."""

    async def get_experiment(self, experiment_id: str) -> ExperimentInfo | None:
        """An experiment's submission metadata, or None."""

    async def experiment_ids(self) -> list[str]:
        """Ids of all experiments with metadata or records, newest first.

        Every experiment with records is listed, whether or not it has submission
        metadata (an imported Harbor job has none): the ledger keeps a listing entry
        for each experiment it stores records of.
        """

    async def experiment_tally(self, experiment_id: str) -> dict[str, float]:
        """The sums of ``services.reports.tally.record_tally`` over the experiment's
        stored records (empty when it has none): what ``status`` shows, without
        reading every record. A replaced record counts once, as its replacement.
        """

    async def experiment_version(self, experiment_id: str) -> str | None:
        """A token that changes whenever a record or the submission metadata of the
        experiment changes (what a report cache is keyed by: services/reports/report_cache.py).

        Read it *before* the records: a cache entry built from records read after a
        given token can only be as new as or newer than that token. None when nothing
        derived from the experiment may be kept: a write to it is in progress, or the
        ledger knows no experiment by that id. Tokens of different ledgers (or of an
        experiment deleted and written again) never repeat.
        """

    async def stored_derived(self, experiment_id: str, kind: str, version: str) -> bytes | None:
        """The blob ``keep_derived`` kept for (experiment, ``kind``) under exactly
        ``version``, or None (nothing kept, or kept under another version).

        What the report cache computes, kept in the ledger so a new process and the
        one-shot CLI read one document instead of every record (services/reports/stored.py
        encodes and decodes; the ledger only keeps bytes). ``version`` includes
        ``experiment_version``, so a value kept before a write is never found after it.
        """

    async def keep_derived(self, experiment_id: str, kind: str, version: str, blob: bytes) -> None:
        """Keep ``blob`` as (experiment, ``kind``)'s value under ``version``, replacing
        the value kept under any other version: one per (experiment, kind), so what is
        kept stays bounded. A blob over ``MAX_DERIVED_BYTES`` raises ValueError."""

    async def close(self) -> None:
        """Release connections."""


MAX_DERIVED_BYTES = 15 * 2**20
"""Largest blob ``Ledger.keep_derived`` takes: MongoDB's documents stop at 16 MiB,
and the key and bookkeeping share the document."""


def record_content_hash(record: TrialRecord) -> str:
    """sha256 of the record's canonical JSON (sorted keys, no whitespace)."""
    blob = json.dumps(
        record.content_key(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def status_order(status: str) -> str:
    """The order key of a record known only by its status: complete above partial.

    It is also the first character of every ``record_order`` key, so a ledger holding
    documents written before order keys existed can rank them by status alone.
    """
    return "1" if status == "complete" else "0"


def record_order(record: TrialRecord) -> str:
    """Where ``record`` ranks among the records of its trial: the ledger keeps the highest.

    The rule is "the last finished run wins", told from what a record carries:

    - a complete record ranks above a partial one, so a late or replayed failure
      cannot erase a real result;
    - complete records rank by ``timing.finished_at`` (Harbor's clock on the runner's
      host), then by ``attempts``: a redelivered result of attempt 1 cannot replace
      attempt 2's, and a resumed run (attempts restart at 1) still replaces the older
      run it re-ran, because it finished later. A complete record that does not say
      when it finished ranks below those that do;
    - partial records rank equal: most are runner failures, which carry no finish
      time, and a resumed run's failure must still replace the older run's.

    Records of equal rank: the later write wins. Keys compare as plain strings (the
    Mongo adapter filters on them), so the time is written at fixed width in UTC.
    """
    rank = status_order(record.status)
    finished = record.timing.finished_at
    if record.status != "complete" or finished is None:
        return rank
    utc = finished.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
    return f"{rank}|{utc}|{min(record.attempts, _MAX_ATTEMPTS):010d}"


_MAX_ATTEMPTS = 10**10 - 1  # keeps the attempts field of an order key fixed-width


def keeps_stored(stored_order: str, stored_hash: str, new_order: str, new_hash: str) -> bool:
    """Whether a write must leave the stored record alone (reported ``unchanged``).

    Same content is a replay; a record that ranks below the stored one
    (``record_order``: a partial after a complete, an older complete result after a
    newer one) must not replace it.
    """
    return stored_hash == new_hash or new_order < stored_order


def collapse_batch(records: Sequence[TrialRecord]) -> list[TrialRecord]:
    """One record per trial_id: the one that applying the batch in order would leave.

    A later record wins unless it ranks below the earlier one (``record_order``).
    Ranks are a total order with the later write winning ties, so collapsing first
    and then writing the winner leaves what writing each record in turn would.
    Collapsing means each trial_id is written (and reported) once per batch, and the
    outcome does not depend on the order a server applies an unordered bulk.
    """
    winners: dict[str, tuple[TrialRecord, str]] = {}
    for record in records:
        order = record_order(record)
        previous = winners.get(record.trial_id)
        if previous is not None and order < previous[1]:
            continue
        winners[record.trial_id] = (record, order)
    return [record for record, _ in winners.values()]


# -- Coordinator -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttemptStart:
    """One counted start of a run: the attempt number, and how many starts of the run
    were handed back (taken back, uncounted) before it."""

    attempt: int
    handed_back: int = 0


@dataclass(frozen=True, slots=True)
class Lease:
    """One concurrency slot of an experiment, held by one trial."""

    key: str
    revision: int


class Coordinator(Protocol):
    """State the runners share: concurrency leases, attempt counters, cancel and pause flags,
    endings,
    agent stops and budgets.

    Leases make an experiment's ``compute.n_concurrent_trials`` a limit across all
    runners; a lease not renewed within its TTL expires, so a dead runner leaks none.
    A run's ending (its final event, stored before it is published and the work
    message acknowledged) lets a redelivered work message of a run that already ended
    re-publish that ending instead of running the trial again. An agent stop (a provider
    refused the agent's key or quota) and an experiment's budget with its running
    spend end later trials before they start (services/runner/guards.py).
    """

    async def acquire(self, experiment_id: str, limit: int, holder: str) -> Lease | None:
        """Take a free slot of the experiment, or None when none is free."""

    async def acquire_team(self, team: str, limit: int, holder: str) -> Lease | None:
        """Take a free slot of the team's ``max_concurrent_trials``, or None when none is
        free (the same leases as an experiment's, keyed ``_team.<team>.<slot>``)."""

    async def add_tally(
        self, kind: str, team: str, amount: float, *, limit: float | None = None
    ) -> tuple[bool, float]:
        """Add ``amount`` to the team's rolling 24-h tally ``kind`` ("trials" or
        "spend") unless the total would pass ``limit``; (added, the total before).
        Atomic across processes (services.common.quotas)."""

    async def tally(self, kind: str, team: str, *, fresh: bool = False) -> float:
        """The team's tally ``kind`` over the last 24 h (may be cached unless ``fresh``)."""

    async def set_team_limits(self, limits: Quotas) -> None:
        """Publish the runner-enforced limits of the quotas file (the submitter, each
        time it loads the file; services.common.quotas.LIMITS_KEY)."""

    async def team_limits(self, *, fresh: bool = False) -> Quotas | None:
        """The published team limits, or None when none are (or they cannot be read):
        runners then keep the message's copy (may be cached unless ``fresh``)."""

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

    async def pause(self, experiment_id: str) -> None:
        """Flag the experiment paused: runners hand its queued work back unstarted."""

    async def resume(self, experiment_id: str) -> None:
        """Lift a pause (a missing flag is not an error)."""

    async def is_paused(
        self, experiment_id: str, *, trial_id: str | None = None, fresh: bool = False
    ) -> bool:
        """Whether the experiment is paused, or with ``trial_id`` whether the experiment
        or that one trial of it is (may be cached unless ``fresh``)."""

    async def pause_trial(self, experiment_id: str, trial_id: str) -> None:
        """Flag one trial of the experiment paused: runners hand its work back unstarted."""

    async def resume_trial(self, experiment_id: str, trial_id: str) -> bool:
        """Lift one trial's pause; whether it was paused (a missing flag is not an error)."""

    async def paused_trials(self, experiment_id: str, *, fresh: bool = False) -> frozenset[str]:
        """The experiment's trials paused one by one (may be cached unless ``fresh``)."""

    async def next_attempt(self, run_id: str) -> int:
        """Count one more start of ``run_id`` and return the new count (1 first)."""

    async def begin_attempt(self, run_id: str) -> AttemptStart:
        """Count one more start of ``run_id``: the attempt (starts taken back are not
        counted) and how many starts were taken back before it."""

    async def take_back_attempt(self, run_id: str) -> int:
        """Uncount the last start of ``run_id`` (it was handed back: preempted, or a
        stop notice), so it does not use up ``max_attempts``; the starts taken back so
        far."""

    async def record_ending(self, run_id: str, event: bytes) -> bytes:
        """Store ``event`` (the encoded final event) as how ``run_id`` ended; first wins.

        Returns the stored ending: ``event`` itself, or the ending another runner
        recorded first (a run ends once, whoever finishes it).
        """

    async def ending(self, run_id: str) -> bytes | None:
        """The encoded final event of ``run_id`` if the run has ended, else None."""

    async def stop_agent(self, experiment_id: str, agent_key: str, reason: bytes) -> bytes:
        """Stop the experiment's remaining trials of one agent configuration; first wins.

        ``reason`` says why (services/runner/guards.py encodes it). Returns the stored
        reason: ``reason`` itself, or the one another runner stored first.
        """

    async def agent_stop(
        self, experiment_id: str, agent_key: str, *, fresh: bool = False
    ) -> bytes | None:
        """Why the agent's trials in the experiment are stopped, or None (cached unless
        ``fresh``)."""

    async def clear_agent_stops(self, experiment_id: str, agent_keys: Sequence[str]) -> None:
        """Lift these agents' stops (a new submission of the experiment does)."""

    async def set_budget(self, experiment_id: str, budget: bytes | None) -> None:
        """Store the experiment's budget (the manifest's, encoded); None removes it."""

    async def budget(self, experiment_id: str, *, fresh: bool = False) -> bytes | None:
        """The experiment's stored budget, or None (cached unless ``fresh``)."""

    async def add_spend(self, experiment_id: str, spend: Spend) -> Spend:
        """Add one finished attempt's usage to the experiment's running total; the new total."""

    async def spent(self, experiment_id: str, *, fresh: bool = False) -> Spend:
        """The experiment's running total so far (cached unless ``fresh``)."""

    async def set_share(self, experiment_id: str, share: TeamShare | None) -> None:
        """Store the team an experiment's trials count for and its fair share (None:
        no team; the key is removed). Written at submit (services/common/fair_share.py)."""

    async def share_of(self, experiment_id: str, *, fresh: bool = False) -> TeamShare | None:
        """The experiment's team and share, or None (may be cached unless ``fresh``)."""

    async def mark_running(self, key: str, holder: str) -> Lease:
        """Write the lease key ``key`` (a running trial's share mark, counted by fair
        share); renewed and released like any lease, expiring with the TTL."""


@dataclass(frozen=True, slots=True)
class Spend:
    """What an experiment's attempts used, as far as their result.json files say.

    ``unpriced``: attempts that used tokens but reported no cost (no price known):
    their tokens count, their cost cannot.
    """

    cost_usd: float = 0.0
    tokens: int = 0
    attempts: int = 0
    unpriced: int = 0

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            self.cost_usd + other.cost_usd,
            self.tokens + other.tokens,
            self.attempts + other.attempts,
            self.unpriced + other.unpriced,
        )

    def encode(self) -> bytes:
        """The stored form (JSON)."""
        return json.dumps(
            {
                "cost_usd": self.cost_usd,
                "tokens": self.tokens,
                "attempts": self.attempts,
                "unpriced": self.unpriced,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> Spend:
        """The stored form back (nothing stored: nothing spent)."""
        if not data:
            return cls()
        raw = json.loads(data)
        return cls(
            float(raw["cost_usd"]), int(raw["tokens"]), int(raw["attempts"]), int(raw["unpriced"])
        )


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


# -- RunnerRegistry ----------------------------------------------------------------------


class RunnerRegistry(Protocol):
    """Where runners announce themselves and the submitter finds the live ones."""

    async def announce(self, info: RunnerInfo) -> None:
        """Write (or rewrite) the runner's record; it lives one TTL from now."""

    async def withdraw(self, info: RunnerInfo) -> None:
        """Remove the runner's record (a clean stop)."""

    async def live_runners(self) -> list[RunnerInfo]:
        """Records of every runner heard from within the TTL, sorted by pool and id."""
