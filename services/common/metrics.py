"""Prometheus metrics of a trialbus process (prometheus-client), listed in docs/operations.md.

Each process builds one :class:`ServiceMetrics` with a registry of its own (never the
library's global one: tests build several apps in one process, and a process exports
only what it measures). The batch consumers (importer, watcher) count what they
consume and how each message was settled, time their batches and, through
:class:`MeteredLedger`, every ledger write; FastStream's own Prometheus middleware adds
its per-subscriber counters (``trialbus_faststream_*``). :func:`serve_metrics` runs the
HTTP exporter when ``CommonSettings.metrics_port`` is set (on ``metrics_addr``,
loopback by default: the exporter has no authentication); the submitter serves
``/metrics`` on its API instead (services/submitter/app.py).

Labels carry service names, actions, failure reasons and record statuses, never an
experiment or trial id: their number stays bounded and nothing identifying leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from faststream import FastStream
from faststream.nats import NatsBroker
from faststream.nats.prometheus import NatsPrometheusMiddleware
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common.errors import Settle
from services.common.logging import get_logger

if TYPE_CHECKING:
    from schemas.record import TrialRecord
    from services.common.adapters.faststream_consumer import BatchHandler
    from services.common.ports import ExperimentInfo, Ledger, UpsertOutcome

__all__ = ["HttpMetrics", "MeteredLedger", "ServiceMetrics", "serve_metrics"]

log = get_logger(__name__)

_BATCH_SIZES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000)
CONSUMER_POLL_S = 5.0
"""How often a service reads its durable's pending counts (one small request)."""
LOOPBACK = "127.0.0.1"
"""Where exporters bind unless told otherwise (CommonSettings.metrics_addr)."""
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServiceMetrics:
    """The metrics of one service process, in a registry of its own."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        r = self.registry
        self.consumed = Counter(
            "trialbus_events_consumed", "Messages handed to the service's handler.",
            ["service"], registry=r,
        )  # fmt: skip
        self.settled = Counter(
            "trialbus_events_settled",
            "Consumed messages by how they were settled (ack, nak, term) and why.",
            ["service", "action", "reason"],
            registry=r,
        )
        self.batch_size = Histogram(
            "trialbus_batch_size", "Messages per consumed batch.",
            ["service"], buckets=_BATCH_SIZES, registry=r,
        )  # fmt: skip
        self.batch_seconds = Histogram(
            "trialbus_batch_duration_seconds", "Time to handle one batch, settling excluded.",
            ["service"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.ledger_seconds = Histogram(
            "trialbus_ledger_write_duration_seconds", "Time of one ledger write call.",
            ["service", "op"], buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.records_written = Counter(
            "trialbus_records_written",
            "Trial records upserted, by record status and outcome (inserted, updated, "
            "unchanged, conflict).",
            ["service", "status", "outcome"],
            registry=r,
        )
        self.consumer_pending = Gauge(
            "trialbus_consumer_pending",
            "Messages of the service's durable consumer: not yet delivered (pending) or "
            "delivered and not yet acknowledged (ack_pending), as the server last said.",
            ["durable", "state"],
            registry=r,
        )
        # Exported at zero from the start: "nothing consumed yet" is a value, not a gap.
        self.consumed.labels(service)
        self.batch_size.labels(service)
        self.batch_seconds.labels(service)

    def instrument(self, broker: NatsBroker) -> None:
        """Add FastStream's Prometheus middleware to ``broker`` (before subscribing)."""
        broker.add_middleware(
            NatsPrometheusMiddleware(
                registry=self.registry, app_name=self.service, metrics_prefix="trialbus_faststream"
            )
        )

    def metered(self, handle: BatchHandler) -> BatchHandler:
        """``handle``, counting the batch, its duration and each message's verdict."""
        service = self.service

        async def on_batch(raws: list[Msg]) -> Sequence[Settle]:
            self.consumed.labels(service).inc(len(raws))
            self.batch_size.labels(service).observe(len(raws))
            started = time.perf_counter()
            settles = await handle(raws)
            self.batch_seconds.labels(service).observe(time.perf_counter() - started)
            for s in settles:
                self.settled.labels(service, s.action, s.reason).inc()
            return settles

        return on_batch

    async def poll_consumer(self, js: JetStreamContext, stream: str, durable: str) -> None:
        """Read the durable's pending and ack-pending counts from the server once."""
        info = await js.consumer_info(stream, durable)
        self.consumer_pending.labels(durable, "pending").set(info.num_pending or 0)
        self.consumer_pending.labels(durable, "ack_pending").set(info.num_ack_pending or 0)

    def watch_consumer(
        self, app: FastStream, js: Callable[[], JetStreamContext], stream: str, durable: str
    ) -> None:
        """Poll the durable's counts every few seconds while ``app`` runs (after start-up,
        when ``js()`` is connected); a failed read is logged and retried."""
        tasks: list[asyncio.Task[None]] = []

        async def loop() -> None:
            while True:
                try:
                    await self.poll_consumer(js(), stream, durable)
                except (NatsError, TimeoutError) as exc:  # the next poll may work
                    log.warning("consumer info not read", durable=durable, error=str(exc))
                await asyncio.sleep(CONSUMER_POLL_S)

        @app.after_startup
        async def start_polling() -> None:
            tasks.append(asyncio.create_task(loop()))

        @app.on_shutdown
        async def stop_polling() -> None:
            for t in tasks:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t


def serve_metrics(
    app: FastStream, metrics: ServiceMetrics, port: int | None, addr: str = LOOPBACK
) -> None:
    """Serve ``metrics`` over HTTP on ``addr``:``port`` while ``app`` runs.

    None: no exporter. The exporter has no authentication, so it binds the loopback
    address unless the operator chooses another (``CommonSettings.metrics_addr``):
    the page holds counts and durations only, but who runs what, how much and how it
    fails is nobody else's business, and an open port is one more thing to reach.
    """
    if port is None:
        return
    running = []

    @app.on_startup
    async def start_exporter() -> None:
        server, _thread = start_http_server(port, addr=addr, registry=metrics.registry)
        running.append(server)
        log.info("metrics exporter listening", addr=addr, port=server.server_port)

    @app.after_shutdown
    async def stop_exporter() -> None:
        for server in running:
            server.shutdown()
            server.server_close()


class MeteredLedger:
    """A Ledger that times its writes and counts the records written, then delegates."""

    def __init__(self, inner: Ledger, metrics: ServiceMetrics) -> None:
        self._inner = inner
        self._m = metrics

    async def ensure_indexes(self) -> None:
        """Delegated."""
        await self._inner.ensure_indexes()

    async def upsert_records(self, records: Sequence[TrialRecord]) -> UpsertOutcome:
        """Timed; each record counted by its status and what the write did."""
        started = time.perf_counter()
        outcome = await self._inner.upsert_records(records)
        m, service = self._m, self._m.service
        m.ledger_seconds.labels(service, "upsert_records").observe(time.perf_counter() - started)
        what = {t: "inserted" for t in outcome.inserted}
        what.update({t: "updated" for t in outcome.updated})
        what.update({t: "unchanged" for t in outcome.unchanged})
        what.update({t: "conflict" for t in outcome.conflicts})
        for r in records:
            m.records_written.labels(service, r.status, what.get(r.trial_id, "unknown")).inc()
        return outcome

    async def get_record(self, trial_id: str) -> TrialRecord | None:
        """Delegated."""
        return await self._inner.get_record(trial_id)

    async def records_for(self, experiment_id: str) -> list[TrialRecord]:
        """Delegated."""
        return await self._inner.records_for(experiment_id)

    async def count_records(self, experiment_id: str) -> int:
        """Delegated."""
        return await self._inner.count_records(experiment_id)

    async def recorded_among(self, experiment_id: str, trial_ids: Iterable[str]) -> set[str]:
        """Delegated."""
        return await self._inner.recorded_among(experiment_id, trial_ids)

    async def scored_trial_ids(self, experiment_id: str) -> set[str]:
        """Delegated."""
        return await self._inner.scored_trial_ids(experiment_id)

    async def upsert_experiment(self, info: ExperimentInfo) -> None:
        """Timed."""
        started = time.perf_counter()
        await self._inner.upsert_experiment(info)
        self._m.ledger_seconds.labels(self._m.service, "upsert_experiment").observe(
            time.perf_counter() - started
        )

    async def get_experiment(self, experiment_id: str) -> ExperimentInfo | None:
        """Delegated."""
        return await self._inner.get_experiment(experiment_id)

    async def experiment_ids(self) -> list[str]:
        """Delegated."""
        return await self._inner.experiment_ids()

    async def experiment_tally(self, experiment_id: str) -> dict[str, float]:
        """Delegated."""
        return await self._inner.experiment_tally(experiment_id)

    async def experiment_version(self, experiment_id: str) -> str | None:
        """Delegated."""
        return await self._inner.experiment_version(experiment_id)

    async def stored_derived(self, experiment_id: str, kind: str, version: str) -> bytes | None:
        """Delegated."""
        return await self._inner.stored_derived(experiment_id, kind, version)

    async def keep_derived(self, experiment_id: str, kind: str, version: str, blob: bytes) -> None:
        """Delegated."""
        await self._inner.keep_derived(experiment_id, kind, version, blob)

    async def close(self) -> None:
        """Delegated."""
        await self._inner.close()


class HttpMetrics:
    """Requests of an ASGI app by method, route template and status, in their own registry.

    Outermost middleware (add it after the guards), so refused requests count too; the
    route is the template (``/experiments/{experiment_id}/status``), never the path, so
    ids stay out of the labels; unmatched paths share one label.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["method", "route", "status"]
        self.requests = Counter(
            "trialbus_http_requests", "HTTP requests answered.", labels, registry=self.registry
        )
        self.seconds = Histogram(
            "trialbus_http_request_duration_seconds",
            "Time from request to the end of the response (a live stream: its length).",
            labels,
            buckets=_SECONDS,
            registry=self.registry,
        )

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """``app`` wrapped so each HTTP request is counted and timed."""

        async def metered(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            status = ["500"]  # what an exception that escapes every handler becomes

            async def sending(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status[0] = str(message["status"])
                await send(message)

            started = time.perf_counter()
            try:
                await app(scope, receive, sending)
            finally:
                route = getattr(scope.get("route"), "path", "unmatched")
                labels = (scope["method"], route, status[0])
                self.requests.labels(*labels).inc()
                self.seconds.labels(*labels).observe(time.perf_counter() - started)

        return metered

    def page(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
