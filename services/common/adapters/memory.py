"""In-memory fakes of the ports, for unit tests of handlers and logic.

Longer than 350 lines because it holds the fakes of three ports (Ledger, Coordinator,
EventBus) with the real adapters' exact semantics, so the contract suites run on both.

InMemoryLedger has MongoLedger's exact semantics: both apply the rules kept with the
port (``services.common.ports``: content hash, which record wins, batch collapse), and
the contract suite in tests/integration/test_ledger_contract.py runs against both.
InMemoryCoordinator has NatsCoordinator's (tests/integration/test_coordinator_contract.py);
RecordingBus dedups by msg id like JetStream.
"""

from __future__ import annotations

import copy
import itertools
import random
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from schemas.events import Envelope, encode_event, parse_event
from schemas.record import TrialRecord
from schemas.subjects import Topology
from services.common import quotas
from services.common.fair_share import TeamShare
from services.common.ports import (
    MAX_DERIVED_BYTES,
    AttemptStart,
    ExperimentInfo,
    Lease,
    Spend,
    UpsertOutcome,
    collapse_batch,
    keeps_stored,
    record_content_hash,
    record_order,
)
from services.reports.tally import tally_of

E = TypeVar("E", bound=Envelope)

# NatsCoordinator.MAX_PROBES (services.common.adapters.nats_kv); a unit test keeps
# them equal without this module importing nats.
MAX_PROBES = 64


def _put_or_purge[K, V](values: dict[K, V], key: K, value: V | None) -> None:
    """As a KV put of ``value``, or with None a purge of ``key``."""
    if value is None:
        values.pop(key, None)
    else:
        values[key] = value


class InMemoryLedger:
    """A Ledger held in dictionaries; stores JSON-mode dumps like the Mongo adapter."""

    def __init__(self) -> None:
        # trial_id -> (json-mode record, content hash, order key)
        self._records: dict[str, tuple[dict[str, Any], str, str]] = {}
        self._experiments: dict[str, ExperimentInfo] = {}
        # First time an experiment was seen (metadata or a record), for newest-first
        # ordering; a counter rather than a clock so ties cannot happen.
        self._first_seen: dict[str, int] = {}
        self._clock = itertools.count()
        # Content versions (experiment_version): bumped by each write that changes an
        # experiment; the nonce keeps two fakes' tokens apart in one process.
        self._versions: dict[str, int] = {}
        self._nonce = uuid.uuid4().hex
        # (experiment, kind) -> (version, blob): keep_derived's values, one per key.
        self._derived: dict[tuple[str, str], tuple[str, bytes]] = {}
        self.closed = False

    def _seen(self, experiment_id: str) -> None:
        self._first_seen.setdefault(experiment_id, next(self._clock))

    async def ensure_indexes(self) -> None:
        """Nothing to create; present for interface parity."""

    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        """Insert or replace records by trial_id; identical content is ``unchanged``.

        A trial_id stored under another experiment is a conflict: left alone, reported.
        """
        outcome = UpsertOutcome()
        for record in collapse_batch(records):
            new_hash, new_order = record_content_hash(record), record_order(record)
            stored = self._records.get(record.trial_id)
            if stored is not None and stored[0]["experiment_id"] != record.experiment_id:
                outcome.conflicts[record.trial_id] = stored[0]["experiment_id"]
                continue
            if stored is not None and keeps_stored(stored[2], stored[1], new_order, new_hash):
                outcome.unchanged.append(record.trial_id)
                continue
            self._records[record.trial_id] = (record.model_dump(mode="json"), new_hash, new_order)
            self._seen(record.experiment_id)
            self._bump(record.experiment_id)
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
            for _, (doc, _h, _o) in sorted(self._records.items())
            if doc["experiment_id"] == experiment_id
        ]

    async def count_records(self, experiment_id: str) -> int:
        """Number of records of an experiment."""
        return sum(1 for doc, *_ in self._records.values() if doc["experiment_id"] == experiment_id)

    async def recorded_among(self, experiment_id: str, trial_ids: Iterable[str]) -> set[str]:
        """The ids among ``trial_ids`` that have a record in the experiment."""
        kept = {t: self._records.get(t) for t in trial_ids}
        return {t for t, k in kept.items() if k and k[0]["experiment_id"] == experiment_id}

    async def scored_trial_ids(self, experiment_id: str) -> set[str]:
        """trial_ids whose record carries a valid reward."""
        return {
            doc["trial_id"]
            for doc, *_ in self._records.values()
            if doc["experiment_id"] == experiment_id and doc["evaluation"]["reward_valid"]
        }

    async def upsert_experiment(self, info: ExperimentInfo) -> None:
        """Record (or refresh) an experiment's submission metadata."""
        # Deep copy: the caller may mutate its manifest dict after the call.
        self._experiments[info.experiment_id] = copy.deepcopy(info)
        self._seen(info.experiment_id)
        self._bump(info.experiment_id)

    def _bump(self, experiment_id: str) -> None:
        self._versions[experiment_id] = self._versions.get(experiment_id, 0) + 1

    async def get_experiment(self, experiment_id: str) -> ExperimentInfo | None:
        """An experiment's submission metadata, or None."""
        info = self._experiments.get(experiment_id)
        return copy.deepcopy(info) if info else None

    async def experiment_ids(self) -> list[str]:
        """Ids of all experiments with metadata or records, newest (first seen) first."""
        return sorted(self._first_seen, key=lambda e: (-self._first_seen[e], e))

    async def experiment_tally(self, experiment_id: str) -> dict[str, float]:
        """Summed from the stored records each time (the Mongo adapter keeps it)."""
        return tally_of(await self.records_for(experiment_id))

    async def experiment_version(self, experiment_id: str) -> str | None:
        """Changes with every write that changes the experiment (a record or its
        metadata); None for an experiment this ledger knows nothing of."""
        if experiment_id not in self._versions:
            return None
        return f"{self._nonce}.{self._versions[experiment_id]}"

    async def stored_derived(self, experiment_id: str, kind: str, version: str) -> bytes | None:
        """The blob kept for (experiment, kind) under exactly ``version``, or None."""
        found = self._derived.get((experiment_id, kind))
        return found[1] if found is not None and found[0] == version else None

    async def keep_derived(self, experiment_id: str, kind: str, version: str, blob: bytes) -> None:
        """Keep ``blob`` under ``version``, replacing any other version's (one per key)."""
        if len(blob) > MAX_DERIVED_BYTES:
            raise ValueError(f"derived value of {len(blob):,} bytes: over {MAX_DERIVED_BYTES:,}")
        self._derived[(experiment_id, kind)] = (version, bytes(blob))

    async def close(self) -> None:
        """Mark closed (tests may assert it); the data stays readable."""
        self.closed = True


class RecordingBus:
    """An EventBus that keeps what it is given, deduplicating by msg id like JetStream.

    Each event goes through the wire encoding (encode, then parse) before it is
    recorded, so an event that could not be published cannot be recorded either.
    JetStream forgets msg ids after the stream's duplicate window; this fake never does.
    ``fail_next`` holds exceptions the next publishes raise, in order (a TransientError
    plays a publish JetStream did not confirm).
    """

    def __init__(self, topology: Topology | None = None) -> None:
        self._topology = topology or Topology()
        self._ids: set[str] = set()
        self.published: list[Envelope] = []
        self.duplicates: list[str] = []
        self.fail_next: list[BaseException] = []

    @property
    def topology(self) -> Topology:
        """Stream and subject names (unused by the fake, present for the port)."""
        return self._topology

    async def publish(self, event: Envelope, *, msg_id: str | None = None) -> bool:
        """Record ``event`` unless its msg id was seen; False for a duplicate."""
        if self.fail_next:
            raise self.fail_next.pop(0)
        wire = parse_event(encode_event(event))
        key = msg_id or event.dedup_id()
        if key in self._ids:
            self.duplicates.append(key)
            return False
        self._ids.add(key)
        self.published.append(wire)
        return True

    async def publish_many(self, events: Sequence[Envelope]) -> list[bool]:
        """Publish each event in order; per event, whether it was new."""
        return [await self.publish(event) for event in events]

    def of_type(self, kind: type[E]) -> list[E]:
        """The recorded events of one class, in publish order."""
        return [e for e in self.published if isinstance(e, kind)]


class InMemoryCoordinator:
    """A Coordinator with NatsCoordinator's semantics, on a clock the test drives.

    Like the KV bucket, a lease is a key ``<experiment>.<slot>`` that lives
    ``lease_ttl_s`` after its last write; ``renew`` rewrites it unconditionally and
    ``release`` purges it, whoever holds it now. Slots are probed from a random start,
    at most ``MAX_PROBES`` of them. ``is_cancelled`` is always fresh (the real adapter
    may answer from a one-second cache unless asked for ``fresh``).
    """

    def __init__(
        self,
        *,
        lease_ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._ttl = lease_ttl_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._revisions = itertools.count(1)
        # key -> (holder, revision, written_at)
        self._leases: dict[str, tuple[str, int, float]] = {}
        self._cancelled: set[str] = set()
        self._paused: set[str] = set()
        self._paused_trials: dict[str, set[str]] = {}
        self._attempts: dict[str, int] = {}
        self._taken_back: dict[str, int] = {}
        self._endings: dict[str, bytes] = {}
        self._stops: dict[tuple[str, str], bytes] = {}
        self._budgets: dict[str, bytes] = {}
        self._spent: dict[str, Spend] = {}
        self._tallies: dict[tuple[str, str], quotas.Tally] = {}
        self._shares: dict[str, TeamShare] = {}
        self._team_limits: bytes | None = None
        self.now: Callable[[], datetime] = lambda: datetime.now(UTC)
        """The wall clock of the daily tallies (a test may move it)."""

    def _live(self, key: str) -> tuple[str, int, float] | None:
        entry = self._leases.get(key)
        if entry is not None and self._clock() - entry[2] >= self._ttl:
            del self._leases[key]
            return None
        return entry

    def holders(self, experiment_id: str) -> list[str]:
        """Holders of the experiment's live leases (for assertions)."""
        prefix = f"{experiment_id}."
        return [
            entry[0]
            for key in sorted(self._leases)
            if key.startswith(prefix) and (entry := self._live(key)) is not None
        ]

    async def acquire(self, experiment_id: str, limit: int, holder: str) -> Lease | None:
        """Take a free slot of the experiment, or None when none is found."""
        return self._take(experiment_id, limit, holder)

    async def acquire_team(self, team: str, limit: int, holder: str) -> Lease | None:
        """Take a free slot of the team (key ``_team.<team key>.<slot>``)."""
        return self._take(f"_team.{quotas.team_key(team)}", limit, holder)

    def _take(self, prefix: str, limit: int, holder: str) -> Lease | None:
        start = self._rng.randrange(limit)
        for step in range(min(limit, MAX_PROBES)):
            key = f"{prefix}.{(start + step) % limit}"
            if self._live(key) is not None:
                continue
            revision = next(self._revisions)
            self._leases[key] = (holder, revision, self._clock())
            return Lease(key, revision)
        return None

    async def renew(self, lease: Lease) -> Lease:
        """Rewrite the lease's key (a KV put): its TTL starts again."""
        holder = entry[0] if (entry := self._live(lease.key)) is not None else "renewed"
        revision = next(self._revisions)
        self._leases[lease.key] = (holder, revision, self._clock())
        return Lease(lease.key, revision)

    async def release(self, lease: Lease) -> None:
        """Purge the lease's key (a missing one is not an error)."""
        self._leases.pop(lease.key, None)

    async def add_tally(
        self, kind: str, team: str, amount: float, *, limit: float | None = None
    ) -> tuple[bool, float]:
        """Add to the team's rolling tally unless ``limit`` would be passed."""
        now = self.now()
        stored = self._tallies.get((kind, team), {})
        before = quotas.window_total(stored, now)
        if limit is not None and before + amount > limit:
            return False, before
        self._tallies[(kind, team)] = quotas.window_add(stored, now, amount)
        return True, before

    async def tally(self, kind: str, team: str, *, fresh: bool = False) -> float:
        """The team's total over the last 24 h (always fresh here)."""
        return quotas.window_total(self._tallies.get((kind, team), {}), self.now())

    async def set_team_limits(self, limits: quotas.Quotas) -> None:
        """Publish the team limits (encoded, as the NATS adapter stores them)."""
        self._team_limits = quotas.encode_limits(limits)

    async def team_limits(self, *, fresh: bool = False) -> quotas.Quotas | None:
        """The published team limits, or None (always fresh here)."""
        return quotas.decode_limits(self._team_limits)

    async def cancel(self, experiment_id: str) -> None:
        """Flag the experiment cancelled."""
        self._cancelled.add(experiment_id)

    async def uncancel(self, experiment_id: str) -> None:
        """Lift a cancellation."""
        self._cancelled.discard(experiment_id)

    async def is_cancelled(self, experiment_id: str, *, fresh: bool = False) -> bool:
        """Whether the experiment is cancelled (always fresh here)."""
        return experiment_id in self._cancelled

    async def pause(self, experiment_id: str) -> None:
        """Flag the experiment paused."""
        self._paused.add(experiment_id)

    async def resume(self, experiment_id: str) -> None:
        """Lift the pause."""
        self._paused.discard(experiment_id)

    async def is_paused(
        self, experiment_id: str, *, trial_id: str | None = None, fresh: bool = False
    ) -> bool:
        """Whether the experiment (or with ``trial_id`` that trial) is paused (always fresh)."""
        if experiment_id in self._paused:
            return True
        return trial_id is not None and trial_id in self._paused_trials.get(experiment_id, ())

    async def pause_trial(self, experiment_id: str, trial_id: str) -> None:
        """Flag one trial paused."""
        self._paused_trials.setdefault(experiment_id, set()).add(trial_id)

    async def resume_trial(self, experiment_id: str, trial_id: str) -> bool:
        """Lift one trial's pause; whether it was paused."""
        trials = self._paused_trials.get(experiment_id, set())
        was = trial_id in trials
        trials.discard(trial_id)
        return was

    async def paused_trials(self, experiment_id: str, *, fresh: bool = False) -> frozenset[str]:
        """The experiment's trials paused one by one."""
        return frozenset(self._paused_trials.get(experiment_id, ()))

    async def next_attempt(self, run_id: str) -> int:
        """Count one more start of ``run_id`` and return the new count (1 first)."""
        return (await self.begin_attempt(run_id)).attempt

    async def begin_attempt(self, run_id: str) -> AttemptStart:
        """Count one more start of ``run_id``: the attempt and the starts taken back."""
        self._attempts[run_id] = self._attempts.get(run_id, 0) + 1
        return AttemptStart(self._attempts[run_id], self._taken_back.get(run_id, 0))

    async def take_back_attempt(self, run_id: str) -> int:
        """Uncount the last start of ``run_id``; the starts taken back so far."""
        self._attempts[run_id] = max(0, self._attempts.get(run_id, 0) - 1)
        self._taken_back[run_id] = self._taken_back.get(run_id, 0) + 1
        return self._taken_back[run_id]

    async def record_ending(self, run_id: str, event: bytes) -> bytes:
        """Store ``event`` as how ``run_id`` ended unless an ending is stored; return it."""
        return self._endings.setdefault(run_id, event)

    async def ending(self, run_id: str) -> bytes | None:
        """The encoded final event of ``run_id`` if the run has ended, else None."""
        return self._endings.get(run_id)

    async def stop_agent(self, experiment_id: str, agent_key: str, reason: bytes) -> bytes:
        """Stop the agent's remaining trials unless a stop is stored; the stored reason."""
        return self._stops.setdefault((experiment_id, agent_key), reason)

    async def agent_stop(
        self, experiment_id: str, agent_key: str, *, fresh: bool = False
    ) -> bytes | None:
        """Why the agent's trials are stopped, or None (always fresh here)."""
        return self._stops.get((experiment_id, agent_key))

    async def clear_agent_stops(self, experiment_id: str, agent_keys: Sequence[str]) -> None:
        """Lift these agents' stops."""
        for key in agent_keys:
            self._stops.pop((experiment_id, key), None)

    async def set_budget(self, experiment_id: str, budget: bytes | None) -> None:
        """Store (or with None remove) the experiment's budget."""
        _put_or_purge(self._budgets, experiment_id, budget)

    async def budget(self, experiment_id: str, *, fresh: bool = False) -> bytes | None:
        """The experiment's stored budget (always fresh here)."""
        return self._budgets.get(experiment_id)

    async def add_spend(self, experiment_id: str, spend: Spend) -> Spend:
        """Add to the experiment's running total; the new total."""
        total = self._spent.get(experiment_id, Spend()) + spend
        self._spent[experiment_id] = total
        return total

    async def spent(self, experiment_id: str, *, fresh: bool = False) -> Spend:
        """The experiment's running total (always fresh here)."""
        return self._spent.get(experiment_id, Spend())

    async def set_share(self, experiment_id: str, share: TeamShare | None) -> None:
        """Store (or with None remove) the experiment's team and share."""
        _put_or_purge(self._shares, experiment_id, share)

    async def share_of(self, experiment_id: str, *, fresh: bool = False) -> TeamShare | None:
        """The experiment's team and share (always fresh here)."""
        return self._shares.get(experiment_id)

    async def mark_running(self, key: str, holder: str) -> Lease:
        """Write ``key`` as a lease (unconditionally, as a KV put)."""
        revision = next(self._revisions)
        self._leases[key] = (holder, revision, self._clock())
        return Lease(key, revision)

    def marks(self) -> dict[str, int]:
        """Live lease keys (1 each), as the leases stream's subject counts give them."""
        return {key: 1 for key in list(self._leases) if self._live(key) is not None}
