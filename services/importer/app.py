"""Composition root of the importer: a FastStream batched pull consumer.

Connects, builds the adapters (JetStreamBus, MongoLedger) and hands each batch to
``services.importer.handlers.handle_batch``, whose verdicts it applies to the messages.
"""

from __future__ import annotations

from typing import Any

from faststream import FastStream
from nats.aio.msg import Msg

from services.common.adapters.faststream_consumer import BatchDurable, EventsConsumer, run_app
from services.common.adapters.jetstream import JetStreamBus
from services.common.adapters.nats_objects import open_bucket
from services.common.errors import Settle
from services.common.logging import get_logger
from services.common.ports import Ledger
from services.common.settings import ImporterSettings
from services.importer.folders import StoredTrials
from services.importer.handlers import handle_batch, importer_filters

log = get_logger(__name__)

# Short, with heartbeats while a batch runs: a message that goes astray between a
# pull request and this handler is redelivered within seconds, not minutes. (The one
# such loss seen, FastStream 0.7.8 dropping a batch on nats-py's builtin TimeoutError,
# is closed by faststream_consumer.keep_batches_on_timeout; the bound stays for others.)
ACK_WAIT_S = 10.0


class Consumed:
    """A consumed nats message as the batch reads it. The delivery count is read from
    the message only when asked: nats-py's ``metadata`` parses the whole ack subject
    (nine fields and a timestamp) of every message, and only a message whose record
    failed needs it (docs/performance.md, pipeline)."""

    __slots__ = ("_msg",)

    def __init__(self, msg: Msg) -> None:
        self._msg = msg

    @property
    def data(self) -> bytes:
        """The message's bytes."""
        return self._msg.data

    @property
    def delivered(self) -> int:
        """JetStream's delivery count of the message."""
        return self._msg.metadata.num_delivered


def create_app(settings: ImporterSettings, ledger: Ledger | None = None) -> FastStream:
    """Build the importer app; nothing connects until the app starts."""
    topo = settings.topology
    consumer = EventsConsumer.build(settings, "importer", ledger)
    the_ledger = consumer.ledger
    state: dict[str, Any] = {}

    async def on_events(raws: list[Msg]) -> list[Settle]:
        return await handle_batch(
            [Consumed(r) for r in raws],
            the_ledger,
            state["bus"],
            state["trials"],
            transient_delay_s=settings.retry_delay_s,
        )

    app = consumer.app(
        on_events,
        BatchDurable(
            topo.importer_durable,
            batch_size=settings.batch_size,
            batch_timeout_s=settings.batch_timeout_s,
            ack_wait_s=ACK_WAIT_S,
            max_ack_pending=50_000,
            filters=importer_filters(topo),
        ),
    )

    @app.on_startup
    async def setup() -> None:
        js = await consumer.start()
        state["bus"] = JetStreamBus(js, topo)
        results = await open_bucket(js, settings, "results")
        state["trials"] = StoredTrials(results, settings.jobs_dir.resolve())
        await the_ledger.ensure_indexes()
        log.info("importer ready", stream=topo.events_stream)

    return app


def main() -> None:
    """Run the importer with settings from the environment until SIGTERM / SIGINT."""
    run_app(ImporterSettings(), create_app)
