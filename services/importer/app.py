"""Composition root of the importer: a FastStream batched pull consumer.

Connects, builds the adapters (JetStreamBus, MongoLedger) and hands each batch to
``services.importer.handlers.handle_batch``, whose verdicts it applies to the messages.
"""

from __future__ import annotations

import asyncio

from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import ConsumerConfig, JStream, NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage
from nats.aio.msg import Msg

from infra.nats_auth import broker_auth
from services.common.adapters.jetstream import JetStreamBus, apply_settle, ensure_streams
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.logging import configure_logging, get_logger
from services.common.ports import Ledger
from services.common.service import keep_in_progress, raw_body
from services.common.settings import ImporterSettings
from services.importer.handlers import Incoming, handle_batch

log = get_logger(__name__)

# Short, with heartbeats while a batch runs: a message that goes astray between a
# pull request and this handler is redelivered within seconds, not minutes (seen
# once in a few runs with FastStream 0.7.8's batch pull under CPU load).
ACK_WAIT_S = 10.0


def create_app(settings: ImporterSettings, ledger: Ledger | None = None) -> FastStream:
    """Build the importer app; nothing connects until the app starts."""
    topo = settings.topology
    auth = broker_auth(settings.nats_credentials, "importer")
    broker = NatsBroker(
        settings.nats_servers, logger=None, max_reconnect_attempts=-1, **auth.broker_options
    )
    the_ledger: Ledger = ledger or MongoLedger(settings.ledger_url, settings.ledger_db)
    state: dict[str, JetStreamBus] = {}

    @broker.subscriber(
        topo.event_filter(),
        stream=JStream(topo.events_stream, declare=False),
        durable=topo.importer_durable,
        pull_sub=PullSub(
            batch_size=settings.batch_size, timeout=settings.batch_timeout_s, batch=True
        ),
        ack_policy=AckPolicy.MANUAL,
        # FastStream's pull subscriber brings its own inbox prefix: the role's must win.
        inbox_prefix=auth.subscription_inbox_prefix,
        decoder=raw_body,  # parse_event decodes; FastStream must not (poison stalls)
        config=ConsumerConfig(ack_wait=ACK_WAIT_S, max_deliver=-1, max_ack_pending=50_000),
    )
    async def on_events(msg: NatsMessage) -> None:
        raws: list[Msg] = list(msg.raw_message)  # type: ignore[call-overload]  # a batch
        incoming = [Incoming(r.data, r.metadata.num_delivered) for r in raws]
        async with keep_in_progress(raws, ACK_WAIT_S / 3):
            settles = await handle_batch(
                incoming, the_ledger, state["bus"], transient_delay_s=settings.retry_delay_s
            )
        await asyncio.gather(*(apply_settle(r, s) for r, s in zip(raws, settles, strict=True)))

    app = FastStream(broker)

    @app.on_startup
    async def setup() -> None:
        configure_logging(settings.log_level, settings.log_json)
        await broker.connect()
        js = broker.connection.jetstream()
        await ensure_streams(js, topo, settings.stream_replicas)
        state["bus"] = JetStreamBus(js, topo)
        await the_ledger.ensure_indexes()
        log.info("importer ready", stream=topo.events_stream)

    @app.after_shutdown
    async def teardown() -> None:
        await the_ledger.close()

    return app


def main() -> None:
    """Run the importer with settings from the environment until SIGTERM / SIGINT."""
    settings = ImporterSettings()
    # Before FastStream starts: its own start-up line then goes through the one format.
    configure_logging(settings.log_level, settings.log_json)
    asyncio.run(create_app(settings).run())
