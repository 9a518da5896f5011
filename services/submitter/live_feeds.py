"""What the dashboard reads live from NATS: an experiment's events, a trial's log, and
which trials have started. The one place the dashboard touches nats-py.

Everything here is read only, through ephemeral ordered consumers (the submitter role
may follow the events and logs streams, infra/nats_permissions.py). Subjects are built
from ids checked against the schemas' patterns, so a crafted id cannot widen a
subscription with ``*``, ``>`` or ``.``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from schemas.envelope import EXPERIMENT_ID_PATTERN, TRIAL_ID_PATTERN
from schemas.events import Envelope, TrialStarted, parse_event
from schemas.subjects import Topology
from services.common.errors import TrialbusError
from services.common.logging import get_logger

log = get_logger(__name__)

HISTORY_TIMEOUT_S = 2.0
"""How long reading an experiment's past TrialStarted events may take at most."""
HISTORY_SLACK = 1000
"""Messages the history read may hold beyond those it counted (starts published while
it reads), before the client drops them as a slow consumer."""

UNAVAILABLE: tuple[type[Exception], ...] = (NatsError, TrialbusError, OSError, TimeoutError)
"""What a read over NATS (or the ledger) raises while the other side is away: a live
page says so and tries again rather than ending its stream."""

_EXPERIMENT_RE = re.compile(EXPERIMENT_ID_PATTERN)
_TRIAL_RE = re.compile(TRIAL_ID_PATTERN)


def valid_experiment_id(experiment_id: str) -> bool:
    """Whether ``experiment_id`` is an id the bus could carry (safe in a subject)."""
    return bool(_EXPERIMENT_RE.fullmatch(experiment_id))


def valid_trial_id(trial_id: str) -> bool:
    """Whether ``trial_id`` is an id the bus could carry (safe in a subject)."""
    return bool(_TRIAL_RE.fullmatch(trial_id))


@dataclass(slots=True)
class EventFeed:
    """Decoded events of one ordered consumer; undecodable messages are skipped."""

    sub: JetStreamContext.PushSubscription

    async def next(self, timeout_s: float) -> Envelope | None:
        """The next event, or None when none arrived within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await self.sub.next_msg(timeout=left)
            except TimeoutError:
                return None
            try:
                return parse_event(msg.data)
            except ValueError:
                continue  # not ours to judge: the importer terminates poison
        return None

    async def take(self, count: int, deadline: float) -> AsyncIterator[Envelope]:
        """Up to ``count`` events as they come; stops early at ``deadline`` (a
        ``time.monotonic()`` value) or when none arrives in the time left."""
        for _ in range(count):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            event = await self.next(left)
            if event is None:
                return
            yield event


@dataclass(frozen=True, slots=True)
class LiveFeeds:
    """Subscriptions the dashboard opens on the submitter's NATS connection."""

    nc: NatsClient
    topology: Topology

    @contextlib.asynccontextmanager
    async def _follow(self, subject: str, deliver: DeliverPolicy) -> AsyncIterator[EventFeed]:
        sub = await self.nc.jetstream().subscribe(
            subject, ordered_consumer=True, deliver_policy=deliver
        )
        try:
            yield EventFeed(sub)
        finally:
            with contextlib.suppress(Exception):  # closing: nothing left to lose
                await sub.unsubscribe()

    async def held(self, stream: str, subject: str) -> int:
        """How many messages ``stream`` holds on ``subject`` (a filter), now."""
        info = await self.nc.jetstream().stream_info(stream, subjects_filter=subject)
        return sum((info.state.subjects or {}).values())

    def experiment_events(
        self, experiment_id: str
    ) -> contextlib.AbstractAsyncContextManager[EventFeed]:
        """The experiment's events published from now on (ValueError for a bad id)."""
        if not valid_experiment_id(experiment_id):
            raise ValueError(f"not an experiment id: {experiment_id!r}")
        return self._follow(self.topology.event_filter("*", experiment_id), DeliverPolicy.NEW)

    def experiment_logs(
        self, experiment_id: str
    ) -> contextlib.AbstractAsyncContextManager[EventFeed]:
        """The live log lines of every trial of the experiment, from now on."""
        if not valid_experiment_id(experiment_id):
            raise ValueError(f"not an experiment id: {experiment_id!r}")
        return self._follow(self.topology.log_subject(experiment_id, "*"), DeliverPolicy.NEW)

    def trial_log(self, trial_id: str) -> contextlib.AbstractAsyncContextManager[EventFeed]:
        """The trial's live log from the oldest line the logs stream still holds.

        A trial id is unique across experiments (it hashes the experiment id), so the
        experiment token of the subject is a wildcard: a running trial's page needs no
        record to know its experiment.
        """
        if not valid_trial_id(trial_id):
            raise ValueError(f"not a trial id: {trial_id!r}")
        subject = f"{self.topology.prefix}.logs.*.{trial_id}"
        return self._follow(subject, DeliverPolicy.ALL)

    async def started_trials(self, experiment_id: str) -> dict[str, TrialStarted]:
        """The latest TrialStarted of each trial of the experiment the stream holds.

        Reads the history (at most ``HISTORY_TIMEOUT_S``): the stream's count for the
        subject first, so an experiment with none costs one request, not a timeout.
        """
        if not valid_experiment_id(experiment_id):
            raise ValueError(f"not an experiment id: {experiment_id!r}")
        subject = self.topology.event_subject("trial_started", experiment_id)
        expected = await self.held(self.topology.events_stream, subject)
        started: dict[str, TrialStarted] = {}
        if expected == 0:
            return started
        seen = 0
        all_seen = asyncio.Event()

        async def on_message(msg: Msg) -> None:
            # A callback, not next_msg() per message: twice as fast (10,000 starts in
            # ~100-160 ms instead of ~210-410 ms), so 100,000 fit in the time bound.
            nonlocal seen
            seen += 1
            with contextlib.suppress(ValueError):  # not ours to judge: skipped
                event = parse_event(msg.data)
                if isinstance(event, TrialStarted):
                    _keep_latest(started, event)
            if seen >= expected:
                all_seen.set()

        sub = await self.nc.jetstream().subscribe(
            subject,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
            cb=on_message,
            pending_msgs_limit=expected + HISTORY_SLACK,
        )
        try:
            await asyncio.wait_for(all_seen.wait(), HISTORY_TIMEOUT_S)
        except TimeoutError:
            log.warning("started trials read in part", experiment_id=experiment_id, seen=seen)
        finally:
            with contextlib.suppress(Exception):  # closing: nothing left to lose
                await sub.unsubscribe()
        return dict(started)


HISTORY_REFRESH_S = 60.0
"""``StartedTrials`` reads the history again after this long (a feed that missed an
event, across a reconnect, is set right within it)."""


def _keep_latest(started: dict[str, TrialStarted], event: TrialStarted) -> None:
    """Keep ``event`` for its trial unless a later start of it is kept already."""
    kept = started.get(event.trial_id)
    if kept is None or kept.occurred_at <= event.occurred_at:
        started[event.trial_id] = event


class StartedHistory(Protocol):
    """Where ``StartedTrials`` reads the history (``LiveFeeds``)."""

    async def started_trials(self, experiment_id: str) -> dict[str, TrialStarted]:
        """The latest TrialStarted of each trial of the experiment, as the stream holds."""
        ...


@dataclass(slots=True)
class StartedTrials:
    """One experiment's started trials (the latest TrialStarted of each), kept current
    for a live view: the history is read once (``LiveFeeds.started_trials``), then each
    TrialStarted of the experiment's live feed is added as it passes (``seen``). So a
    redraw of ``status --follow`` or of a dashboard page reads no history: each read of
    a 10,000-trial experiment's takes ~100-160 ms (docs/dashboard.md). The history is read
    again every ``HISTORY_REFRESH_S``, so an event the feed missed is set right.

    The feed must be subscribed before the first ``current()``: a start published
    while the history is read is then in one or the other, or both (kept once).
    """

    live: StartedHistory
    experiment_id: str
    clock: Callable[[], float] = time.monotonic
    _started: dict[str, TrialStarted] = field(default_factory=dict)
    _read_at: float | None = None

    async def current(self) -> dict[str, TrialStarted]:
        """The started trials, by trial id."""
        now = self.clock()
        if self._read_at is None or now - self._read_at >= HISTORY_REFRESH_S:
            history = await self.live.started_trials(self.experiment_id)
            for event in self._started.values():  # seen while it was read, or since
                _keep_latest(history, event)
            self._started, self._read_at = history, now
        return self._started

    def seen(self, event: Envelope | None) -> None:
        """Take in an event of the experiment's live feed (any type; others are left)."""
        if isinstance(event, TrialStarted) and event.experiment_id == self.experiment_id:
            _keep_latest(self._started, event)
