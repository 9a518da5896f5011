"""Prometheus metrics of a runner, ready for services/runner/app.py to wrap its bus and
handler with (the runner's composition root is not wired yet: see docs/operations.md).

Counts what the runner publishes (trials started, completed, failed by failure class),
times each attempt from its TrialStarted to its ending, and tracks the work messages
in flight; labels never carry an id.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from schemas.events import Envelope, TrialCompleted, TrialFailed, TrialStarted
from schemas.runners import RunnerLoad
from schemas.subjects import Topology
from services.common.errors import Settle
from services.common.ports import EventBus

__all__ = ["MeteredBus", "RunnerMetrics", "exporter"]

_TRIAL_SECONDS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14_400)
_MAX_OPEN_ATTEMPTS = 10_000
"""Attempts remembered between start and end; an attempt that ended elsewhere (a
runner stopped mid-trial) would otherwise stay forever."""

KeepAlive = Callable[[], Awaitable[None]]


class Handle(Protocol):
    """What the runner's WorkConsumer calls per work message (TrialHandler.handle)."""

    def __call__(
        self, data: bytes, keep_alive: KeepAlive, *, subject: str = ""
    ) -> Coroutine[Any, Any, Settle]: ...


class RunnerMetrics:
    """One runner process's metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.trials = Counter(
            "trialbus_trials",
            "Trial events this runner published: started, completed, failed (by failure "
            "class, and whether the failure was final).",
            ["event", "failure_class", "final"],
            registry=r,
        )
        self.in_flight = Gauge(
            "trialbus_trials_in_flight", "Work messages being handled now.", registry=r
        )
        self.trial_seconds = Histogram(
            "trialbus_trial_duration_seconds",
            "An attempt, from its TrialStarted to its TrialCompleted or TrialFailed.",
            ["outcome"],
            buckets=_TRIAL_SECONDS,
            registry=r,
        )
        self.settled = Counter(
            "trialbus_events_settled",
            "Work messages by how they were settled (ack, nak, term) and why.",
            ["service", "action", "reason"],
            registry=r,
        )
        self._open: dict[tuple[str, int], float] = {}
        self._active = self._done = self._failed = 0

    def load(self) -> RunnerLoad:
        """Trials in flight now and attempts done / failed since start (the runner's
        heartbeat record carries them to the fleet view, ``trialbus runners``)."""
        return RunnerLoad(in_flight=self._active, done=self._done, failed=self._failed)

    def published(self, event: Envelope) -> None:
        """Count one event the runner published (others are ignored)."""
        if isinstance(event, TrialStarted):
            self.trials.labels("started", "", "").inc()
            self._open[(event.trial_id, event.attempt)] = time.monotonic()
            while len(self._open) > _MAX_OPEN_ATTEMPTS:
                del self._open[next(iter(self._open))]
        elif isinstance(event, TrialCompleted | TrialFailed):
            if isinstance(event, TrialCompleted):
                outcome, labels = "completed", ("completed", "", "")
                self._done += 1
            else:
                outcome = "failed"
                self._failed += 1
                labels = ("failed", event.failure_class, str(event.final).lower())
            self.trials.labels(*labels).inc()
            started = self._open.pop((event.trial_id, event.attempt), None)
            if started is not None:
                self.trial_seconds.labels(outcome).observe(time.monotonic() - started)

    def bus(self, inner: EventBus) -> MeteredBus:
        """``inner``, counting what is published through it (after the server confirms)."""
        return MeteredBus(inner, self)

    def handler(self, handle: Handle) -> Handle:
        """``handle`` (TrialHandler.handle), tracking in-flight messages and verdicts."""

        async def metered(data: bytes, keep_alive: KeepAlive, *, subject: str = "") -> Settle:
            self.in_flight.inc()
            self._active += 1
            try:
                settle = await handle(data, keep_alive, subject=subject)
            finally:
                self.in_flight.dec()
                self._active -= 1
            self.settled.labels("runner", settle.action, settle.reason).inc()
            return settle

        return metered


class MeteredBus:
    """An EventBus that reports each confirmed publish to RunnerMetrics."""

    def __init__(self, inner: EventBus, metrics: RunnerMetrics) -> None:
        self._inner = inner
        self._m = metrics

    @property
    def topology(self) -> Topology:
        """The inner bus's."""
        return self._inner.topology

    async def publish(self, event: Envelope, *, msg_id: str | None = None) -> bool:
        """Publish; counted once confirmed and new (a redelivery's re-publish of a stored
        ending, dropped by the server as a duplicate, is not a second trial)."""
        fresh = await self._inner.publish(event, msg_id=msg_id)
        if fresh:
            self._m.published(event)
        return fresh

    async def publish_many(self, events: Sequence[Envelope]) -> list[bool]:
        """Publish all; each new one counted once confirmed."""
        fresh = await self._inner.publish_many(events)
        for event, new in zip(events, fresh, strict=True):
            if new:
                self._m.published(event)
        return fresh


@contextlib.contextmanager
def exporter(
    registry: CollectorRegistry, port: int | None, addr: str = "127.0.0.1"
) -> Iterator[int | None]:
    """Serve ``registry`` on ``addr``:``port`` inside the block; None: nothing.

    Loopback unless the operator chooses another address (``metrics_addr``): the
    exporter has no authentication. Yields the bound port (``0`` picks a free one)."""
    if port is None:
        yield None
        return
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
