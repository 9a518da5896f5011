"""Composition root of the watcher: follows experiments, finds external Harbor jobs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection
from pathlib import Path

from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import ConsumerConfig, JStream, NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage
from nats.aio.msg import Msg

from schemas.events import (
    EventDecodeError,
    ExperimentSubmitted,
    ResultImported,
    TrialCompleted,
    parse_event,
)
from services.common.adapters.jetstream import JetStreamBus, ensure_streams
from services.common.adapters.mongo_ledger import MongoLedger
from services.common.errors import LedgerUnavailable
from services.common.harbor_jobs import job_dir_for, read_marker, write_job_result
from services.common.logging import configure_logging, get_logger
from services.common.ports import Ledger
from services.common.service import keep_in_progress, raw_body
from services.common.settings import WatcherSettings
from services.importer.jobdir import scan_job_dir
from services.watcher.logic import RecordTally, completion_of, finished_external_jobs

log = get_logger(__name__)


class Watcher:
    """Publishes ExperimentCompleted; announces trials of external Harbor jobs."""

    def __init__(self, settings: WatcherSettings, ledger: Ledger, bus: JetStreamBus) -> None:
        self._settings = settings
        self._ledger = ledger
        self._bus = bus
        self._announced_jobs: set[Path] = set()
        self._tallies: dict[str, RecordTally] = {}
        self._correlation: dict[str, str] = {}

    async def check(
        self,
        experiment_id: str,
        correlation_id: str,
        imported: Collection[str] = (),
        *,
        exact: bool = False,
    ) -> None:
        """Publish ExperimentCompleted if every trial is recorded.

        ``imported``: trial ids of the ResultImported events that prompted the check;
        the ledger is asked only when they may complete the experiment (``exact``
        always asks).
        """
        tally = self._tallies.setdefault(experiment_id, RecordTally())
        tally.since.update(imported)
        self._correlation[experiment_id] = correlation_id
        if exact:
            tally.counted = None
        done = await completion_of(self._ledger, experiment_id, correlation_id, tally)
        if done is None:
            return
        self._tallies.pop(experiment_id, None)
        self._correlation.pop(experiment_id, None)
        job_dir = job_dir_for(self._settings.jobs_dir, experiment_id)
        if read_marker(job_dir) is not None:
            # Harbor's own job summary, so `harbor view` shows the job as finished.
            await asyncio.to_thread(write_job_result, job_dir, experiment_id, done.n_trials)
        await self._bus.publish(done)
        log.info("experiment completed", experiment_id=experiment_id, n_scored=done.n_scored)

    async def recheck(self) -> None:
        """Ask the ledger about experiments with imports since their last count.

        A safety net for a tally that under-counts: with several watcher processes
        sharing the durable, each sees only part of the events.
        """
        for experiment_id, tally in list(self._tallies.items()):
            if tally.since:
                await self.check(experiment_id, self._correlation[experiment_id], exact=True)

    async def scan_external(self) -> int:
        """Announce the trials of finished Harbor jobs made outside trialbus."""
        n = 0
        for job in await asyncio.to_thread(finished_external_jobs, self._settings.jobs_dir):
            if job in self._announced_jobs:
                continue
            trials = await asyncio.to_thread(scan_job_dir, job)
            if not trials:
                self._announced_jobs.add(job)
                continue
            experiment_id = trials[0].experiment_id
            await self._bus.publish(
                ExperimentSubmitted(
                    experiment_id=experiment_id,
                    name=job.name,
                    n_trials=len(trials),
                    n_published=0,
                    manifest={"source": "external harbor job", "job_dir": str(job), "agents": []},
                ),
                msg_id=f"{experiment_id}:external-submitted",
            )
            for t in trials:
                if await self._ledger.get_record(t.trial_id) is not None:
                    continue
                await self._bus.publish(
                    TrialCompleted(
                        experiment_id=experiment_id,
                        trial_id=t.trial_id,
                        trial_dir=str(t.trial_dir),
                        job_dir=str(job),
                        source="external",
                    )
                )
                n += 1
            self._announced_jobs.add(job)
            log.info("external harbor job announced", job=str(job), trials=len(trials))
        return n


def create_app(settings: WatcherSettings, ledger: Ledger | None = None) -> FastStream:
    """Build the watcher app; nothing connects until the app starts."""
    topo = settings.topology
    broker = NatsBroker(settings.nats_servers, logger=None, max_reconnect_attempts=-1)
    the_ledger: Ledger = ledger or MongoLedger(settings.ledger_url, settings.ledger_db)
    state: dict[str, Watcher] = {}
    tasks: list[asyncio.Task[None]] = []

    @broker.subscriber(
        topo.event_filter(),
        stream=JStream(topo.events_stream, declare=False),
        durable=topo.watcher_durable,
        pull_sub=PullSub(batch_size=500, timeout=0.2, batch=True),
        ack_policy=AckPolicy.MANUAL,
        decoder=raw_body,  # parse_event decodes; FastStream must not (poison stalls)
        config=ConsumerConfig(ack_wait=10, max_deliver=-1),
    )
    async def on_events(msg: NatsMessage) -> None:
        raws: list[Msg] = list(msg.raw_message)  # type: ignore[call-overload]  # a batch
        todo: dict[str, str] = {}
        imported: dict[str, set[str]] = {}
        poison: list[Msg] = []
        for raw in raws:
            try:
                ev = parse_event(raw.data)
            except EventDecodeError:
                poison.append(raw)  # the importer logs poison; here it is only skipped
                continue
            if isinstance(ev, ExperimentSubmitted | ResultImported):
                todo[ev.experiment_id] = ev.correlation_id
            if isinstance(ev, ResultImported):
                imported.setdefault(ev.experiment_id, set()).add(ev.trial_id)
        try:
            async with keep_in_progress(raws, 3.0):
                for experiment_id, correlation_id in todo.items():
                    await state["watcher"].check(
                        experiment_id, correlation_id, imported.get(experiment_id, ())
                    )
        except LedgerUnavailable as exc:
            log.warning("ledger unavailable; batch will be redelivered", error=str(exc))
            await asyncio.gather(*(r.nak(delay=2) for r in raws))
            return
        await asyncio.gather(
            *(r.ack() for r in raws if r not in poison), *(r.term() for r in poison)
        )

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
        state["watcher"] = Watcher(settings, the_ledger, JetStreamBus(js, topo))

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
    asyncio.run(create_app(WatcherSettings()).run())
