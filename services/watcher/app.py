"""Composition root of the watcher: a FastStream batched pull consumer and two timers.

Connects, builds the adapters (JetStreamBus, MongoLedger) and the Watcher
(services.watcher.handlers), hands each batch of events to ``handle_batch`` and
applies its verdicts; the timers re-check completion and scan the jobs folder for
Harbor jobs made outside trialbus.
"""

from __future__ import annotations

import asyncio
import os

from faststream import FastStream
from nats.aio.msg import Msg

from services.common.adapters.faststream_consumer import BatchDurable, EventsConsumer, run_app
from services.common.adapters.jetstream import JetStreamBus
from services.common.adapters.nats_objects import open_bucket
from services.common.archive import DEFAULT_TRIAL_CAP_BYTES
from services.common.errors import Settle
from services.common.logging import get_logger
from services.common.ports import Ledger
from services.common.service import cancel_and_wait
from services.common.settings import WatcherSettings
from services.common.trial_folders import TrialFolders
from services.watcher.handlers import Watcher, handle_batch
from services.watcher.secrets import watcher_redactor

log = get_logger(__name__)

ACK_WAIT_S = 10.0
RETRY_DELAY_S = 2.0
"""nak delay of a batch whose completion check found the ledger unreachable."""


def create_app(settings: WatcherSettings, ledger: Ledger | None = None) -> FastStream:
    """Build the watcher app; nothing connects until the app starts."""
    topo = settings.topology
    consumer = EventsConsumer.build(settings, "watcher", ledger)
    state: dict[str, Watcher] = {}
    # Read once here: the secrets redacted from external jobs (services.watcher.secrets).
    redactor = watcher_redactor(settings, os.environ)
    tasks: list[asyncio.Task[None]] = []

    async def on_events(raws: list[Msg]) -> list[Settle]:
        return await handle_batch(
            state["watcher"], [r.data for r in raws], transient_delay_s=RETRY_DELAY_S
        )

    app = consumer.app(
        on_events,
        BatchDurable(
            topo.watcher_durable, batch_size=500, batch_timeout_s=0.2, ack_wait_s=ACK_WAIT_S
        ),
    )

    async def scan_loop(watcher: Watcher) -> None:
        while True:
            try:
                await watcher.scan_external()
            except Exception as exc:  # noqa: BLE001 - logged (redacted), tried again
                # No traceback: its text (paths, file contents) would pass unredacted.
                log.error(
                    "jobs folder scan failed; retrying",
                    error_type=type(exc).__name__,
                    error=redactor.redact(str(exc)),
                )
            await asyncio.sleep(settings.scan_interval_s)

    async def recheck_loop(watcher: Watcher) -> None:
        while True:
            await asyncio.sleep(settings.scan_interval_s)
            try:
                await watcher.recheck()
            except Exception:
                log.exception("completion re-check failed; retrying")

    @app.on_startup
    async def setup() -> None:
        js = await consumer.start()
        results = await open_bucket(js, settings, "results")
        folders = TrialFolders(results, cap_bytes=DEFAULT_TRIAL_CAP_BYTES, keep_local=True)
        state["watcher"] = Watcher(
            consumer.ledger, JetStreamBus(js, topo), settings.jobs_dir, folders, redactor
        )

    @app.after_startup
    async def start_scanning() -> None:
        tasks.append(asyncio.create_task(recheck_loop(state["watcher"])))
        if settings.watch_external:
            tasks.append(asyncio.create_task(scan_loop(state["watcher"])))
        log.info("watcher ready", jobs_dir=str(settings.jobs_dir))

    @app.on_shutdown
    async def stop_scanning() -> None:
        await cancel_and_wait(*tasks)

    return app


def main() -> None:
    """Run the watcher with settings from the environment until SIGTERM / SIGINT."""
    run_app(WatcherSettings(), create_app)
