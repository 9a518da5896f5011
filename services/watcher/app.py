"""Composition root of the watcher: a FastStream batched pull consumer and two timers.

Connects, builds the adapters (JetStreamBus, MongoLedger) and the Watcher
(services.watcher.handlers), hands each batch of events to ``handle_batch`` and
applies its verdicts; the timers re-check completion and scan the jobs folder for
Harbor jobs made outside trialbus.
"""

from __future__ import annotations

import asyncio
import contextlib

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
from services.common.settings import WatcherSettings
from services.watcher.handlers import Watcher, handle_batch

log = get_logger(__name__)

ACK_WAIT_S = 10.0
RETRY_DELAY_S = 2.0
"""nak delay of a batch whose completion check found the ledger unreachable."""


def create_app(settings: WatcherSettings, ledger: Ledger | None = None) -> FastStream:
    """Build the watcher app; nothing connects until the app starts."""
    topo = settings.topology
    auth = broker_auth(settings.nats_credentials, "watcher")
    broker = NatsBroker(
        settings.nats_servers, logger=None, max_reconnect_attempts=-1, **auth.broker_options
    )
    the_ledger: Ledger = ledger or MongoLedger(settings.ledger_url, settings.ledger_db)
    state: dict[str, Watcher] = {}
    tasks: list[asyncio.Task[None]] = []

    @broker.subscriber(
        topo.event_filter(),
        stream=JStream(topo.events_stream, declare=False),
        durable=topo.watcher_durable,
        pull_sub=PullSub(batch_size=500, timeout=0.2, batch=True),
        ack_policy=AckPolicy.MANUAL,
        # FastStream's pull subscriber brings its own inbox prefix: the role's must win.
        inbox_prefix=auth.subscription_inbox_prefix,
        decoder=raw_body,  # parse_event decodes; FastStream must not (poison stalls)
        config=ConsumerConfig(ack_wait=ACK_WAIT_S, max_deliver=-1),
    )
    async def on_events(msg: NatsMessage) -> None:
        raws: list[Msg] = list(msg.raw_message)  # type: ignore[call-overload]  # a batch
        async with keep_in_progress(raws, ACK_WAIT_S / 3):
            settles = await handle_batch(
                state["watcher"], [r.data for r in raws], transient_delay_s=RETRY_DELAY_S
            )
        await asyncio.gather(*(apply_settle(r, s) for r, s in zip(raws, settles, strict=True)))

    async def scan_loop(watcher: Watcher) -> None:
        while True:
            try:
                await watcher.scan_external()
            except Exception:
                log.exception("jobs folder scan failed; retrying")
            await asyncio.sleep(settings.scan_interval_s)

    async def recheck_loop(watcher: Watcher) -> None:
        while True:
            await asyncio.sleep(settings.scan_interval_s)
            try:
                await watcher.recheck()
            except Exception:
                log.exception("completion re-check failed; retrying")

    app = FastStream(broker)

    @app.on_startup
    async def setup() -> None:
        configure_logging(settings.log_level, settings.log_json)
        await broker.connect()
        js = broker.connection.jetstream()
        await ensure_streams(js, topo, settings.stream_replicas)
        state["watcher"] = Watcher(the_ledger, JetStreamBus(js, topo), settings.jobs_dir)

    @app.after_startup
    async def start_scanning() -> None:
        tasks.append(asyncio.create_task(recheck_loop(state["watcher"])))
        if settings.watch_external:
            tasks.append(asyncio.create_task(scan_loop(state["watcher"])))
        log.info("watcher ready", jobs_dir=str(settings.jobs_dir))

    @app.on_shutdown
    async def stop_scanning() -> None:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t

    @app.after_shutdown
    async def teardown() -> None:
        await the_ledger.close()

    return app


def main() -> None:
    """Run the watcher with settings from the environment until SIGTERM / SIGINT."""
    settings = WatcherSettings()
    # Before FastStream starts: its own start-up line then goes through the one format.
    configure_logging(settings.log_level, settings.log_json)
    asyncio.run(create_app(settings).run())
