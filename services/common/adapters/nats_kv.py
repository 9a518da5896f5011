"""State the runners share, kept in NATS JetStream key-value buckets.

Longer than 350 lines because it is the one adapter of the Coordinator port, and the
keys of both buckets are documented and implemented together (paused trials' list
operations are in nats_paused_trials.py).

- **Concurrency leases** (bucket ``<P>_LEASES``, TTL = lease_ttl): an experiment's
  ``compute.n_concurrent_trials`` is a limit across ALL runners. A runner holds slot
  ``<experiment>.<i>`` while a trial runs and renews it with every heartbeat; a runner
  that dies loses its leases when the TTL passes, so slots are never leaked. A slot is
  taken by one conditional write (expected last sequence 0: the key has no message at
  all) and given back by purging the key's subject from the bucket's stream, which
  leaves no purge marker behind: taking and releasing cost one round trip each.
- **Cancellation** (bucket ``<P>_CONTROL``, key ``cancel.<experiment>``).
- **Pause** (key ``pause.<experiment>``, written and purged by the submitter): runners
  hand a paused experiment's work messages back unstarted (docs/scheduling.md).
  Single trials paused are one key per experiment, ``pause.<experiment>.trials``: a
  JSON list of trial ids the submitter changes by compare-and-set, so a runner checks
  every delivery against one cached read per experiment, as for the experiment's own
  flag (a key per trial would cost a KV round trip on every delivery).
- **Attempts** (bucket ``<P>_CONTROL``, key ``runs.<run_id>``): how many times a run
  was actually started, less the starts handed back uncounted (preemption, a stop
  notice; services.common.adapters.nats_attempts keeps both numbers in the key).
  JetStream's delivery count cannot say, because a trial that waits for a free slot
  is handed back (nak) without running.
- **Endings** (bucket ``<P>_CONTROL``, key ``runs.<run_id>.ended``): the encoded final
  event of a run that ended, written with ``create`` (the first ending wins) before
  the event is published and the work message acknowledged. A redelivered message
  whose run has an ending re-publishes it instead of running again. Inside ``runs.>``,
  the only part of the bucket a runner may write (infra/nats_permissions.py). No
  other key can collide: run ids end with a hex digest, never with ``.ended``.
- **Agent stops** (bucket ``<P>_CONTROL``, key ``stops.<experiment>.<agent key>``):
  why an agent configuration's remaining trials in the experiment end before they
  start (a provider refused its key or quota); written with ``create`` by the runner
  that saw the failure (the first reason wins), purged by the next submission.
- **Budgets** (key ``budget.<experiment>``, written by the submitter) and the running
  **spend** (key ``spend.<experiment>``, a JSON total each runner updates with a
  compare-and-set after every attempt that reported usage).

- **Team quotas** (docs/scheduling.md): a team's concurrency slots are leases
  ``_team.<team key>.<i>`` in the leases bucket (no experiment id starts with ``_``);
  its rolling 24-h tallies are ``quota.trials.<team key>`` (the submitter, at submit)
  and ``quota.spend.<team key>`` (runners, after each priced attempt): one JSON object
  of hourly buckets each, updated with a compare-and-set (services.common.quotas).
  The limits runners enforce are ``quota.limits`` (the submitter publishes its quotas
  file's there whenever it loads it; runners read it with the cached reads below).
- **Fair share** (services/common/fair_share.py): ``share.<experiment>`` (the
  submitter: the experiment's team and share) and a running trial's share mark
  ``_share.<pool>.<class>.<team key>.<run key>`` in the leases bucket.

Reads that every delivery pays for (cancel, pause, stop, budget, spend) are cached for
``cache_s`` per runner unless asked ``fresh``: a flag or a total seen one second late
lets at most that second's trials start.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from infra.nats_permissions import kv_stream
from schemas.subjects import Topology
from services.common import quotas
from services.common.adapters import nats_attempts
from services.common.adapters.jetstream import kv_config, open_kv
from services.common.adapters.nats_paused_trials import (
    change_paused_trials,
    paused_trials_key,
    trial_set,
)
from services.common.fair_share import TeamShare, share_key
from services.common.ports import AttemptStart, Lease, Spend

MAX_PROBES = 64


def _key(text: str) -> str:
    """KV keys allow [-/_=.a-zA-Z0-9]; trialbus ids only add ':'."""
    return text.replace(":", "=")


@dataclass(eq=False)
class NatsCoordinator:
    """The Coordinator port over NATS KV: leases, cancellation flags, attempt counters, endings."""

    leases: KeyValue
    """The leases bucket: experiment and team slots and running marks (entries expire)."""
    control: KeyValue
    """The control bucket: flags, attempt counters, endings, stops, budgets and spend."""
    _: KW_ONLY
    js: JetStreamContext
    leases_bucket: str
    """The leases bucket's name: ``release`` purges a slot's subject from its stream."""
    lease_ttl_s: float | None = None
    """How long an unrenewed lease lives: the bucket's TTL as whoever created it set it
    (an admin's provisioning, another service first), not necessarily the one asked for."""
    cache_s: float = 1.0
    """How long a non-fresh read of the control bucket may be served from the cache."""
    # key -> (read at, value): the cached reads of the control bucket's flags,
    # stops, budgets and spend
    _reads: dict[str, tuple[float, bytes | None]] = field(init=False, default_factory=dict)
    # experiment -> (stored list, parsed): the paused trials, parsed once per change
    _trial_sets: dict[str, tuple[bytes | None, frozenset[str]]] = field(
        init=False, default_factory=dict
    )
    # the published team limits (stored bytes, parsed), parsed once per change
    _limits: tuple[bytes | None, quotas.Quotas | None] | None = field(init=False, default=None)

    @classmethod
    async def open(
        cls, js: JetStreamContext, topology: Topology, *, lease_ttl_s: float, replicas: int = 1
    ) -> NatsCoordinator:
        """Open (creating when missing) the two buckets."""
        leases = await _bucket(js, topology.leases_bucket, ttl=lease_ttl_s, replicas=replicas)
        control = await _bucket(js, topology.control_bucket, ttl=None, replicas=replicas)
        ttl = (await leases.status()).ttl
        return cls(
            leases,
            control,
            js=js,
            leases_bucket=topology.leases_bucket,
            lease_ttl_s=float(ttl) if ttl else None,
        )

    # -- concurrency -------------------------------------------------------------------
    async def acquire(self, experiment_id: str, limit: int, holder: str) -> Lease | None:
        """Take a free slot of the experiment, or None when none is found.

        Slots are probed from a random start; for large limits at most
        ``MAX_PROBES`` slots are tried, so a saturated experiment costs a bounded
        number of KV calls per attempt (a miss only delays the trial: it is handed
        back and tried again). Each probe is one conditional write that succeeds only
        on a key without any message (``release`` leaves none): a held slot costs one
        round trip to pass over, not the get that nats-py's ``create`` adds.
        """
        return await self._take(experiment_id, limit, holder)

    async def acquire_team(self, team: str, limit: int, holder: str) -> Lease | None:
        """Take a free slot of the team, as ``acquire`` does an experiment's."""
        return await self._take(f"_team.{quotas.team_key(team)}", limit, holder)

    async def _take(self, prefix: str, limit: int, holder: str) -> Lease | None:
        start = random.randrange(limit)
        for step in range(min(limit, MAX_PROBES)):
            key = f"{prefix}.{(start + step) % limit}"
            try:
                revision = await self.leases.update(key, holder.encode(), last=0)
            except KeyWrongLastSequenceError:
                continue
            return Lease(key, revision)
        return None

    async def renew(self, lease: Lease) -> Lease:
        """Refresh a lease's TTL (with each heartbeat)."""
        revision = await self.leases.put(lease.key, b"renewed")
        return Lease(lease.key, revision)

    async def release(self, lease: Lease) -> None:
        """Remove every message of the slot's key: the next conditional take succeeds.

        A KV purge would leave a marker that the next take must read and then overwrite
        (three round trips); a subject purge of the bucket's stream leaves nothing.
        Keys a runner of an older release purged the KV way expire with the TTL.
        """
        await self.js.purge_stream(
            kv_stream(self.leases_bucket), subject=f"$KV.{self.leases_bucket}.{lease.key}"
        )

    # -- cancellation ------------------------------------------------------------------
    async def cancel(self, experiment_id: str) -> None:
        await self._put(f"cancel.{experiment_id}", b"1")

    async def uncancel(self, experiment_id: str) -> None:
        """A new submission of the experiment lifts an earlier cancellation."""
        await self._purge(f"cancel.{experiment_id}")

    async def is_cancelled(self, experiment_id: str, *, fresh: bool = False) -> bool:
        """Whether the experiment was cancelled (cached for ``cache_s``)."""
        return await self._read(f"cancel.{experiment_id}", fresh=fresh) == b"1"

    # -- pause -------------------------------------------------------------------------
    async def pause(self, experiment_id: str) -> None:
        """Flag the experiment paused."""
        await self._put(f"pause.{experiment_id}", b"1")

    async def resume(self, experiment_id: str) -> None:
        """Lift the pause (purged, so the bucket keeps no trace of it)."""
        await self._purge(f"pause.{experiment_id}")

    async def is_paused(
        self, experiment_id: str, *, trial_id: str | None = None, fresh: bool = False
    ) -> bool:
        """Whether the experiment, or with ``trial_id`` that trial of it, is paused (both
        reads cached for ``cache_s``)."""
        if await self._read(f"pause.{experiment_id}", fresh=fresh) == b"1":
            return True
        return trial_id is not None and trial_id in await self.paused_trials(
            experiment_id, fresh=fresh
        )

    async def pause_trial(self, experiment_id: str, trial_id: str) -> None:
        """Add ``trial_id`` to the experiment's paused trials."""
        await self._change_paused_trials(experiment_id, lambda ids: ids | {trial_id})

    async def resume_trial(self, experiment_id: str, trial_id: str) -> bool:
        """Remove ``trial_id`` from the experiment's paused trials; whether it was there."""
        before = await self._change_paused_trials(experiment_id, lambda ids: ids - {trial_id})
        return trial_id in before

    async def paused_trials(self, experiment_id: str, *, fresh: bool = False) -> frozenset[str]:
        """The experiment's trials paused one by one (cached for ``cache_s``)."""
        raw = await self._read(paused_trials_key(experiment_id), fresh=fresh)
        parsed = self._trial_sets.get(experiment_id)
        if parsed is None or parsed[0] != raw:  # parsed once per change, not per delivery
            parsed = (raw, trial_set(raw))
            self._trial_sets[experiment_id] = parsed
        return parsed[1]

    async def _change_paused_trials(
        self, experiment_id: str, change: Callable[[frozenset[str]], frozenset[str]]
    ) -> frozenset[str]:
        before, written = await change_paused_trials(self.control, experiment_id, change)
        if written is not None:  # this process reads its own change back without asking
            self._reads[paused_trials_key(experiment_id)] = (time.monotonic(), written)
        return before

    # -- attempts (services.common.adapters.nats_attempts) -----------------------------
    async def next_attempt(self, run_id: str) -> int:
        """Count one more start of ``run_id`` and return the new count (1 first)."""
        return (await self.begin_attempt(run_id)).attempt

    async def begin_attempt(self, run_id: str) -> AttemptStart:
        """Count one more start of ``run_id``: the attempt and the starts taken back."""
        return await nats_attempts.begin(self.control, f"runs.{_key(run_id)}")

    async def take_back_attempt(self, run_id: str) -> int:
        """Uncount the last start of ``run_id``; the starts taken back so far."""
        return await nats_attempts.take_back(self.control, f"runs.{_key(run_id)}")

    # -- endings -----------------------------------------------------------------------
    async def record_ending(self, run_id: str, event: bytes) -> bytes:
        """Store ``event`` as how ``run_id`` ended unless an ending is stored; return it."""
        key = _ending_key(run_id)
        while True:
            try:
                await self.control.create(key, event)
                return event
            except KeyWrongLastSequenceError:
                pass  # another runner ended the run first: its ending stands
            stored = await self.ending(run_id)
            if stored is not None:
                return stored
            # Gone between the two calls (only a purge removes an ending): try again.

    async def ending(self, run_id: str) -> bytes | None:
        """The encoded final event of ``run_id`` if the run has ended, else None."""
        try:
            entry = await self.control.get(_ending_key(run_id))
        except KeyNotFoundError:
            return None
        return entry.value

    # -- agent stops, budgets, spend -----------------------------------------------------
    async def stop_agent(self, experiment_id: str, agent_key: str, reason: bytes) -> bytes:
        """Store ``reason`` unless a stop is stored (first wins); return the stored one."""
        key = f"stops.{experiment_id}.{agent_key}"
        while True:
            try:
                await self.control.create(key, reason)
                self._reads[key] = (time.monotonic(), reason)
                return reason
            except KeyWrongLastSequenceError:
                pass  # another runner stopped the agent first: its reason stands
            stored = await self._read(key, fresh=True)
            if stored is not None:
                return stored

    async def agent_stop(
        self, experiment_id: str, agent_key: str, *, fresh: bool = False
    ) -> bytes | None:
        """Why the agent's trials are stopped, or None (cached for ``cache_s``)."""
        return await self._read(f"stops.{experiment_id}.{agent_key}", fresh=fresh)

    async def clear_agent_stops(self, experiment_id: str, agent_keys: Sequence[str]) -> None:
        """Purge these agents' stops (keys are named, not listed: the submitter may not
        read the control bucket)."""
        for agent_key in agent_keys:
            await self._purge(f"stops.{experiment_id}.{agent_key}")

    async def set_budget(self, experiment_id: str, budget: bytes | None) -> None:
        """Store (or with None purge) the experiment's budget."""
        key = f"budget.{experiment_id}"
        if budget is None:
            await self._purge(key)
        else:
            await self.control.put(key, budget)
            self._reads.pop(key, None)

    async def budget(self, experiment_id: str, *, fresh: bool = False) -> bytes | None:
        """The experiment's stored budget, or None (cached for ``cache_s``)."""
        return await self._read(f"budget.{experiment_id}", fresh=fresh)

    async def add_spend(self, experiment_id: str, spend: Spend) -> Spend:
        """Add to the running total with a compare-and-set (runners race); the new total."""
        key = f"spend.{experiment_id}"
        while True:
            try:
                entry = await self.control.get(key)
            except KeyNotFoundError:
                try:
                    await self.control.create(key, spend.encode())
                    total = spend
                except KeyWrongLastSequenceError:
                    continue  # another runner wrote the first total: add to it
            else:
                total = Spend.decode(entry.value) + spend
                try:
                    await self.control.update(key, total.encode(), last=entry.revision)
                except KeyWrongLastSequenceError:
                    continue
            self._reads[key] = (time.monotonic(), total.encode())
            return total

    async def spent(self, experiment_id: str, *, fresh: bool = False) -> Spend:
        """The running total (cached for ``cache_s``)."""
        return Spend.decode(await self._read(f"spend.{experiment_id}", fresh=fresh))

    # -- fair share ---------------------------------------------------------------------
    async def set_share(self, experiment_id: str, share: TeamShare | None) -> None:
        """Store (or with None purge) ``share.<experiment>``."""
        if share is None:
            await self._purge(share_key(experiment_id))
        else:
            await self._put(share_key(experiment_id), share.encode())

    async def share_of(self, experiment_id: str, *, fresh: bool = False) -> TeamShare | None:
        """The experiment's team and share (cached for ``cache_s``)."""
        return TeamShare.decode(await self._read(share_key(experiment_id), fresh=fresh))

    async def mark_running(self, key: str, holder: str) -> Lease:
        """One put of the lease key (no probing: the key is the run's own)."""
        return Lease(key, await self.leases.put(key, holder.encode()))

    # -- team tallies -------------------------------------------------------------------
    async def add_tally(
        self, kind: str, team: str, amount: float, *, limit: float | None = None
    ) -> tuple[bool, float]:
        """Compare-and-set the team's hourly buckets (submitters and runners race)."""
        key = f"quota.{kind}.{quotas.team_key(team)}"
        while True:
            now = datetime.now(UTC)
            try:
                entry = await self.control.get(key)
                stored, revision = quotas.decode_tally(entry.value), entry.revision
            except KeyNotFoundError:
                stored, revision = {}, 0
            before = quotas.window_total(stored, now)
            if limit is not None and before + amount > limit:
                self._reads[key] = (time.monotonic(), quotas.encode_tally(stored))
                return False, before
            new = quotas.encode_tally(quotas.window_add(stored, now, amount))
            try:
                if revision:
                    await self.control.update(key, new, last=revision)
                else:
                    await self.control.create(key, new)  # the tally's first write
            except KeyWrongLastSequenceError:
                continue  # another process counted first: read its total again
            self._reads[key] = (time.monotonic(), new)
            return True, before

    async def tally(self, kind: str, team: str, *, fresh: bool = False) -> float:
        """The team's total over the last 24 h (cached for ``cache_s``)."""
        raw = await self._read(f"quota.{kind}.{quotas.team_key(team)}", fresh=fresh)
        return quotas.window_total(quotas.decode_tally(raw), datetime.now(UTC))

    async def set_team_limits(self, limits: quotas.Quotas) -> None:
        """Store the limits under ``quotas.LIMITS_KEY`` (one key: every team, the default)."""
        await self._put(quotas.LIMITS_KEY, quotas.encode_limits(limits))

    async def team_limits(self, *, fresh: bool = False) -> quotas.Quotas | None:
        """The published limits (cached for ``cache_s``; parsed once per change)."""
        raw = await self._read(quotas.LIMITS_KEY, fresh=fresh)
        if self._limits is None or self._limits[0] != raw:
            self._limits = (raw, quotas.decode_limits(raw))
        return self._limits[1]

    async def _put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``; this process reads it back without asking."""
        await self.control.put(key, value)
        self._reads[key] = (time.monotonic(), value)

    async def _purge(self, key: str) -> None:
        """Remove ``key`` and its history (the bucket keeps no trace); forget its read."""
        with contextlib.suppress(KeyNotFoundError):
            await self.control.purge(key)
        self._reads.pop(key, None)

    async def _read(self, key: str, *, fresh: bool) -> bytes | None:
        """The value under ``key`` or None, cached for ``cache_s`` unless ``fresh``."""
        now = time.monotonic()
        cached = self._reads.get(key)
        if cached is not None and not fresh and now - cached[0] < self.cache_s:
            return cached[1]
        try:
            value = (await self.control.get(key)).value
        except KeyNotFoundError:
            value = None
        self._reads[key] = (now, value)
        return value


def _ending_key(run_id: str) -> str:
    return f"runs.{_key(run_id)}.ended"


async def _bucket(js: JetStreamContext, name: str, *, ttl: float | None, replicas: int) -> KeyValue:
    return await open_kv(js, kv_config(name, ttl_s=ttl, replicas=replicas))
