"""Follow a test's events stream, and wait on what it says instead of sleeping.

An :class:`EventTap` reads the test's events stream from its first message with an
ordered JetStream consumer (it survives a nats-server restart or the loss of a
cluster node: the consumer is re-created from the last sequence it saw) and keeps
every event in stream order. :meth:`EventTap.eventually` wakes on each new event and
re-evaluates a condition, so a test waits exactly as long as the system needs, and
a timeout names what never happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Self, TypeVar

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.client import JetStreamContext

from infra.nats_auth import RoleCredentials, connect_as
from schemas.events import (
    Event,
    ResultImported,
    TrialCompleted,
    TrialFailed,
    TrialStarted,
    parse_event,
)
from schemas.subjects import Topology

T = TypeVar("T")

Condition = Callable[[Sequence[Event]], T | None | Awaitable[T | None]]
"""Given every event so far (stream order): a truthy answer ends the wait."""


def starts_of(
    events: Sequence[Event], *, experiment_id: str | None = None, trial_id: str | None = None
) -> list[TrialStarted]:
    """The TrialStarted events among ``events`` (in their order), of ``experiment_id``
    and of ``trial_id`` where each is given."""
    return [
        e
        for e in events
        if isinstance(e, TrialStarted)
        and (experiment_id is None or e.experiment_id == experiment_id)
        and (trial_id is None or e.trial_id == trial_id)
    ]


def in_flight_counts(events: Sequence[Event], experiments: Collection[str]) -> list[int]:
    """How many trials of ``experiments`` are started and not yet ended (completed, or
    failed for good), after each start or ending along ``events`` (stream order).

    A trial is counted by its id, so one started again after a retry is in flight once,
    and an ending whose start came before ``events`` takes nothing away.
    """
    running: set[str] = set()
    counts: list[int] = []
    for e in events:
        if e.experiment_id not in experiments:
            continue
        if isinstance(e, TrialStarted):
            running.add(e.trial_id)
        elif isinstance(e, TrialCompleted) or (isinstance(e, TrialFailed) and e.final):
            running.discard(e.trial_id)
        else:
            continue
        counts.append(len(running))
    return counts


async def stream_payloads(js: JetStreamContext, stream: str) -> list[bytes]:
    """The payload of every message ``stream`` holds, by sequence from 1 (for a stream
    nothing was removed from: the events and logs streams, work no runner took)."""
    n = (await js.stream_info(stream)).state.messages
    return [(await js.get_msg(stream, seq)).data or b"" for seq in range(1, n + 1)]


def server_list(nats_url: str) -> list[str]:
    """``nats://a,nats://b`` (the form EmbeddedStack takes for a cluster) as a list."""
    return [u.strip() for u in nats_url.split(",") if u.strip()]


async def connect(nats_url: str, credentials: RoleCredentials | None = None) -> Client:
    """A client that keeps reconnecting through a server restart (faults are on purpose).

    ``credentials``: a role to connect as, on a server with users (e.g. the admin's of
    an EmbeddedStack's own nats-server); anonymous when None.
    """

    async def quiet(_exc: Exception) -> None:
        # Disconnections are the faults under test; the tap reports what it missed
        # through eventually()'s timeout message instead.
        return None

    options: dict[str, Any] = {
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.25,
        "error_cb": quiet,
    }
    if credentials is not None:
        return await connect_as(server_list(nats_url), credentials, name="e2e-tap", **options)
    return await nats.connect(servers=server_list(nats_url), **options)


class EventTap:
    """Every event of one topology's events stream, in order, kept up to date."""

    def __init__(
        self, nats_url: str, topology: Topology, credentials: RoleCredentials | None = None
    ) -> None:
        self.nats_url = nats_url
        self.topology = topology
        self.credentials = credentials
        self.events: list[Event] = []
        self._last_seq = 0
        self._imported: dict[str, set[str]] = {}
        self._changed = asyncio.Event()
        self._nc: Client | None = None

    async def start(self) -> Self:
        """Subscribe from the stream's first message (start the stack first: the
        services declare the streams)."""
        self._nc = await connect(self.nats_url, self.credentials)
        await self._nc.jetstream().subscribe(
            self.topology.events_wildcard,
            ordered_consumer=True,
            idle_heartbeat=1.0,  # a lost consumer is re-created within ~2 s
            deliver_policy=DeliverPolicy.ALL,
            cb=self._on_msg,
        )
        return self

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _on_msg(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq <= self._last_seq:
            return  # re-delivered after the ordered consumer was re-created
        self._last_seq = seq
        event = parse_event(msg.data)
        self.events.append(event)
        if isinstance(event, ResultImported):
            self._imported.setdefault(event.experiment_id, set()).add(event.trial_id)
        self._changed.set()

    @property
    def js(self) -> JetStreamContext:
        """The tap's JetStream context (to ask the server about consumers)."""
        assert self._nc is not None, "start() the tap first"
        return self._nc.jetstream()

    # -- queries ------------------------------------------------------------------------
    def mark(self) -> int:
        """A position in the stream, for :meth:`since`."""
        return len(self.events)

    def since(self, mark: int) -> list[Event]:
        """Events that arrived after ``mark``."""
        return self.events[mark:]

    def imported(self, experiment_id: str) -> set[str]:
        """Trials of ``experiment_id`` with a ResultImported so far (their record is written)."""
        return self._imported.get(experiment_id, set())

    # -- waiting ------------------------------------------------------------------------
    async def eventually(self, condition: Condition[T], what: str, timeout_s: float) -> T:
        """Wait until ``condition(events)`` is truthy and return its answer.

        Re-evaluated on every new event (never on a timer); raises AssertionError
        naming ``what`` after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            self._changed.clear()  # before evaluating: an event arriving later wakes us
            answer: Any = condition(self.events)
            if inspect.isawaitable(answer):
                answer = await answer
            if answer:
                return answer  # type: ignore[no-any-return]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                last = ", ".join(type(e).__name__ for e in self.events[-5:])
                raise AssertionError(
                    f"{what}: not seen within {timeout_s:.0f} s "
                    f"({len(self.events)} events so far; last: {last or 'none'})"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def all_imported(
        self, experiment_id: str, trial_ids: set[str], timeout_s: float
    ) -> float:
        """Wait until every trial in ``trial_ids`` has a ResultImported; seconds taken."""
        t0 = time.monotonic()

        def done(_events: Sequence[Event]) -> bool:
            return trial_ids <= self.imported(experiment_id)

        await self.eventually(
            done, f"ResultImported for all {len(trial_ids)} trials of {experiment_id}", timeout_s
        )
        return time.monotonic() - t0


async def read_events(
    nats_url: str, topology: Topology, credentials: RoleCredentials | None = None
) -> list[Event]:
    """Every event in the stream now, read afresh (what a checker should judge)."""
    nc = await connect(nats_url, credentials)
    try:
        js = nc.jetstream()
        total = (await js.stream_info(topology.events_stream)).state.last_seq
        sub = await js.subscribe(
            topology.events_wildcard, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        out: list[Event] = []
        seq = 0
        while seq < total:
            msg = await sub.next_msg(timeout=10)
            seq = msg.metadata.sequence.stream
            out.append(parse_event(msg.data))
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()
