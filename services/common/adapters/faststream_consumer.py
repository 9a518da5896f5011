"""The FastStream side of a batch consumer, shared by the importer and the watcher.

Both read the events stream the same way: a batched pull subscriber on a durable
the admin (or ``ensure_streams``) declared, bodies left as raw bytes for
``parse_event``, manual acks applied from the verdicts their ``handle_batch``
returns, in-progress heartbeats while a batch runs, and the role's own inbox prefix.
What differs (the durable, batch size, consumer limits, the handler) is a parameter.
``EventsConsumer`` also builds what both wrap around it: the role's broker, the
service metrics, the metered ledger, the app that closes it, the metrics exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from faststream import FastStream
from faststream.message import StreamMessage
from faststream.middlewares import AckPolicy
from faststream.nats import ConsumerConfig, JStream, NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from infra.nats_auth import BrokerAuth, broker_auth
from services.common.adapters.jetstream import apply_settle, ensure_streams
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.errors import Settle
from services.common.logging import configure_logging
from services.common.metrics import MeteredLedger, ServiceMetrics, serve_metrics
from services.common.ports import Ledger
from services.common.service import running_beside
from services.common.settings import CommonSettings

__all__ = [
    "BatchDurable",
    "BatchHandler",
    "EventsConsumer",
    "app_closing_ledger",
    "keep_batches_on_timeout",
    "make_broker",
    "run_app",
    "subscribe_batches",
]

BatchHandler = Callable[[list[Msg]], Awaitable[Sequence[Settle]]]
"""Turns one batch of raw messages into one verdict per message, in order."""


@dataclass(frozen=True, slots=True)
class BatchDurable:
    """A service's durable on the events stream and how its batches are pulled."""

    name: str
    batch_size: int
    batch_timeout_s: float
    ack_wait_s: float
    """Short: a batch is kept in progress (every ``ack_wait_s / 3``) while it is
    handled, so a message lost between a pull request and the handler comes back
    within seconds, not minutes."""
    max_ack_pending: int | None = None
    filters: Sequence[str] = ()
    """The durable's ``filter_subjects`` when the subscriber creates it (no admin);
    empty: every event. An admin's durable is bound as it is (infra.nats_provision
    makes the same filters)."""


@dataclass(slots=True)
class EventsConsumer:
    """A service that consumes the events stream in batches (the importer, the watcher).

    Built before its handler, which closes over ``ledger`` (metered); ``app`` then
    registers the handler and returns the FastStream app to add start-up hooks to.
    """

    settings: CommonSettings
    broker: NatsBroker
    auth: BrokerAuth
    metrics: ServiceMetrics
    ledger: Ledger

    @classmethod
    def build(cls, settings: CommonSettings, role: str, ledger: Ledger | None) -> EventsConsumer:
        """The role's broker and metrics, and ``ledger`` (the settings' MongoLedger
        when None) metered; nothing connects until the app starts."""
        broker, auth = make_broker(settings, role)
        metrics = ServiceMetrics(role)
        metrics.instrument(broker)
        metered = MeteredLedger(
            ledger or MongoLedger(settings.ledger_url, settings.ledger_db), metrics
        )
        return cls(settings, broker, auth, metrics, metered)

    async def start(self) -> JetStreamContext:
        """At app start-up: configure logging, connect, make sure the streams exist."""
        settings = self.settings
        configure_logging(settings.log_level, settings.log_json)
        await self.broker.connect()
        js = self.broker.connection.jetstream()
        await ensure_streams(js, settings.topology, settings.stream_replicas)
        return js

    def app(self, handle: BatchHandler, durable: BatchDurable) -> FastStream:
        """Subscribe ``handle`` (metered) to the events ``durable`` takes; the app closes
        the ledger after shutdown, serves the metrics and polls the durable's counts."""
        topo = self.settings.topology
        subscribe_batches(
            self.broker,
            self.auth,
            self.metrics.metered(handle),
            subject=topo.event_filter(),
            stream=topo.events_stream,
            durable=durable,
        )
        app = app_closing_ledger(self.broker, self.ledger)
        serve_metrics(
            app, self.metrics, self.settings.metrics_port, str(self.settings.metrics_addr)
        )
        broker = self.broker
        self.metrics.watch_consumer(
            app, lambda: broker.connection.jetstream(), topo.events_stream, durable.name
        )
        return app


def make_broker(settings: CommonSettings, role: str) -> tuple[NatsBroker, BrokerAuth]:
    """A broker that authenticates as ``role`` (anonymous without credentials) and
    reconnects forever; nothing connects until the app starts."""
    auth = broker_auth(settings.nats_credentials, role)
    broker = NatsBroker(
        settings.nats_servers, logger=None, max_reconnect_attempts=-1, **auth.broker_options
    )
    return broker, auth


def app_closing_ledger(broker: NatsBroker, ledger: Ledger) -> FastStream:
    """The service's FastStream app; it closes ``ledger`` once the broker has stopped."""
    app = FastStream(broker)

    @app.after_shutdown
    async def teardown() -> None:
        await ledger.close()

    return app


def run_app[S: CommonSettings](settings: S, create_app: Callable[[S], FastStream]) -> None:
    """Run the app ``create_app(settings)`` builds until SIGTERM / SIGINT."""
    # Before FastStream starts: its own start-up line then goes through the one format.
    configure_logging(settings.log_level, settings.log_json)
    asyncio.run(create_app(settings).run())


def subscribe_batches(
    broker: NatsBroker,
    auth: BrokerAuth,
    handle: BatchHandler,
    *,
    subject: str,
    stream: str,
    durable: BatchDurable,
) -> None:
    """Register a batched pull subscriber on ``durable`` whose verdicts ``handle``
    decides; each batch is kept in progress while ``handle`` runs."""
    ack_wait_s = durable.ack_wait_s
    subscriber = broker.subscriber(
        subject,
        stream=JStream(stream, declare=False),
        durable=durable.name,
        pull_sub=PullSub(
            batch_size=durable.batch_size, timeout=durable.batch_timeout_s, batch=True
        ),
        ack_policy=AckPolicy.MANUAL,
        # FastStream's pull subscriber brings its own inbox prefix: the role's must win.
        inbox_prefix=auth.subscription_inbox_prefix,
        decoder=raw_body,  # parse_event decodes; FastStream must not (poison stalls)
        config=ConsumerConfig(
            ack_wait=ack_wait_s,
            max_deliver=-1,
            max_ack_pending=durable.max_ack_pending,
            filter_subjects=list(durable.filters) or None,
        ),
    )
    keep_batches_on_timeout(subscriber)

    @subscriber
    async def on_batch(msg: NatsMessage) -> None:
        raws: list[Msg] = list(msg.raw_message)  # type: ignore[call-overload]  # a batch
        async with keep_in_progress(raws, ack_wait_s / 3):
            settles = await handle(raws)
        await asyncio.gather(*(apply_settle(r, s) for r, s in zip(raws, settles, strict=True)))


def keep_batches_on_timeout(subscriber: Any) -> None:
    """Make FastStream's batched pull subscriber keep a batch when a fetch times out.

    FastStream 0.7.8's batch loop (``BatchPullStreamSubscriber._consume_pull``) fills a
    batch with several fetches until its window ends, and stops at
    ``nats.errors.TimeoutError`` only. nats-py 2.16's fetch raises the builtin
    ``TimeoutError`` instead when the window runs out before its lingering pull is
    sent (``_fetch_n``): the exception escapes the loop, the messages already fetched
    for the batch are dropped unhandled, and FastStream restarts the loop silently.
    They come back only after ack_wait: the importer recorded such trials 10 s late,
    0-20 times per 200-trial run (docs/performance.md, overhead). Here every fetch
    timeout reaches the loop as the error it stops at, so the batch is handled.

    Wraps the subscription when FastStream creates it, before its loop first runs.
    Fails at start-up if FastStream's subscriber no longer has that seam (then check
    whether the loop still needs this; tests/integration/test_batch_timeouts.py).
    """
    create = subscriber._create_subscription

    async def create_keeping_batches() -> None:
        await create()
        # No await between the loop's creation (inside ``create``) and this line: the
        # loop's first fetch already goes through the wrapper.
        if not isinstance(subscriber.subscription, _TimeoutsAsNats):
            subscriber.subscription = _TimeoutsAsNats(subscriber.subscription)

    subscriber._create_subscription = create_keeping_batches


class _TimeoutsAsNats:
    """A nats-py pull subscription whose ``fetch`` raises every timeout as
    ``nats.errors.TimeoutError``; everything else is the subscription's own."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def fetch(self, *args: Any, **kwargs: Any) -> list[Msg]:
        try:
            fetched: list[Msg] = await self._inner.fetch(*args, **kwargs)
        except NatsTimeoutError:
            raise
        except TimeoutError as exc:  # the builtin one, from nats-py's deadline checks
            raise NatsTimeoutError from exc
        return fetched

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def raw_body(msg: StreamMessage[Any]) -> Any:
    """FastStream decoder that leaves message bodies as bytes.

    Every trialbus handler decodes its messages itself with ``parse_event``, which
    turns any bad payload into a poison verdict. FastStream's default decoder parses
    JSON *before* the handler runs, and raises there on hostile JSON (nesting past
    the recursion limit, integers over 4300 digits): the handler never sees the batch,
    nothing acks or terminates it, and it is redelivered forever with every good
    message that shares it.
    """
    return msg.body


@contextlib.asynccontextmanager
async def keep_in_progress(msgs: Sequence[Msg], every_s: float) -> AsyncIterator[None]:
    """Send in_progress() for ``msgs`` every ``every_s`` while the block runs.

    Lets a consumer keep a short ack_wait (a message lost between a pull request and
    its handler is redelivered within seconds) without a slow batch being redelivered
    while it is still being processed.
    """

    async def beat() -> None:
        while True:
            await asyncio.sleep(every_s)
            await asyncio.gather(*(m.in_progress() for m in msgs), return_exceptions=True)

    async with running_beside(beat()):
        yield
