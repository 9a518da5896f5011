"""The runner's JetStream adapter: a pull loop that fetches only as many trials as it can run.

FastStream's pull subscriber with ``max_workers`` prefetches past ``ack_wait`` and
duplicates work (checked on this machine), so the runner drives nats-py's pull
consumer itself: a free slot is taken *before* a message is fetched, each message is
given to the handler (services.runner.handlers) with its ``in_progress()`` as the
keep-alive, and the handler's verdict is applied to the message here. On drain or
shutdown a message still in flight is handed back (nak) for another runner.

An idle runner pulls one message at a time (returned the moment it arrives); once a
pull finds work, the next asks for every free slot with a short window, so a burst
is taken in batches and a lone trial never waits out a batch's fetch window.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import apply_settle
from services.common.errors import Settle, settle_error
from services.common.logging import get_logger
from services.runner.attempt import KeepAlive
from services.runner.handlers import TRANSIENT_RETRY_DELAY_S

log = get_logger(__name__)


class MessageHandler(Protocol):
    """What the loop calls per message (TrialHandler.handle): the verdict to apply."""

    async def __call__(self, data: bytes, keep_alive: KeepAlive, *, subject: str = "") -> Settle:
        """Handle one message; raises only CancelledError."""


IDLE_FETCH_TIMEOUT_S = 1.0
"""An idle runner's single-message pull: it returns the moment a trial arrives, so
this window only sets how often an idle runner renews its request (once a second)."""
BUSY_FETCH_TIMEOUT_S = 0.05
"""A multi-message pull after the previous one found work: it returns when the batch
is full or after this window, so a trial that is delivered into a batch that never
fills waits at most this long (it waited the whole idle window before)."""


def runner_durable_config(
    topology: Topology, ack_wait_s: float, pool: str = DEFAULT_POOL
) -> ConsumerConfig:
    """The durable pull consumer shared by the runners of ``pool``.

    Filtered on the pool's work subjects: a work-queue stream refuses two consumers
    whose filters overlap, so no pool's durable may take ``work.>``.
    """
    durable = topology.runner_durable_for(pool)
    return ConsumerConfig(
        name=durable,
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        filter_subject=topology.work_pool_filter(pool),
        ack_wait=ack_wait_s,
        max_deliver=-1,  # attempts are counted (KV) and bounded by the runner
        max_ack_pending=100_000,
    )


async def ensure_runner_consumer(
    js: JetStreamContext, topology: Topology, ack_wait_s: float, pool: str = DEFAULT_POOL
) -> None:
    """Create the pool's shared durable pull consumer if it does not exist yet.

    With per-role NATS users the admin created it when provisioning (and narrowed one
    left from before pools); then this only looks.
    """
    config = runner_durable_config(topology, ack_wait_s, pool)
    assert config.durable_name is not None
    try:
        await js.consumer_info(topology.work_stream, config.durable_name)
    except NotFoundError:
        await js.add_consumer(topology.work_stream, config)


async def apply_verdict(msg: Msg, verdict: Settle) -> None:
    """Settle ``msg`` as the handler decided; the runner's ack waits for the server.

    A trial's ack ends minutes of work: waiting for the server's reply turns a lost
    ack into a logged error here (and a nak) rather than a silent re-run after ack_wait.
    """
    if verdict.action == "ack":
        await msg.ack_sync()
    else:
        await apply_settle(msg, verdict)


class WorkConsumer:
    """Fetches work messages for free slots only and hands each to the handler."""

    def __init__(
        self,
        js: JetStreamContext,
        topology: Topology,
        handle: MessageHandler,
        *,
        concurrency: int,
        runner_id: str = "",
        pool: str = DEFAULT_POOL,
    ) -> None:
        self._js = js
        self._pool = pool
        self._topology = topology
        self._handle = handle
        self._concurrency = concurrency
        self._runner_id = runner_id
        self._slots = asyncio.Semaphore(concurrency)
        self._stopping = asyncio.Event()
        self.in_flight: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Fetch and handle trials until ``stop()`` (in-flight trials go on)."""
        topo = self._topology
        psub = await self._js.pull_subscribe_bind(
            topo.runner_durable_for(self._pool), stream=topo.work_stream
        )
        log.info(
            "runner ready",
            runner_id=self._runner_id,
            pool=self._pool,
            concurrency=self._concurrency,
        )
        busy = False
        try:
            while not self._stopping.is_set():
                await self._slots.acquire()
                free = 1
                # Take every other free slot too, without waiting, to fetch in one request.
                while free < self._concurrency and not self._slots.locked():
                    await self._slots.acquire()
                    free += 1
                # Idle: one message, returned on arrival (a batch pull would hold an
                # early arrival until the batch fills or the window ends: the old p99).
                # Busy: the rest of the free slots in one short pull.
                msgs = await self._fetch(psub, free if busy else 1)
                busy = bool(msgs)
                for _ in range(free - len(msgs)):
                    self._slots.release()
                for msg in msgs:
                    task = asyncio.create_task(self._process(msg))
                    self.in_flight.add(task)
                    task.add_done_callback(self._done)
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _fetch(self, psub: JetStreamContext.PullSubscription, n: int) -> list[Msg]:
        if self._stopping.is_set():
            return []
        timeout = IDLE_FETCH_TIMEOUT_S if n == 1 else BUSY_FETCH_TIMEOUT_S
        try:
            return await psub.fetch(batch=n, timeout=timeout)
        except (NatsTimeoutError, TimeoutError):
            return []
        except Exception as exc:  # noqa: BLE001 - reconnecting; keep the loop alive
            log.warning("fetch failed; retrying", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(1.0)
            return []

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._slots.release()

    def stop(self) -> None:
        """Stop fetching new work (in-flight trials go on)."""
        self._stopping.set()

    async def drain(self, grace_s: float) -> None:
        """Stop fetching, let in-flight trials finish for ``grace_s``, hand back the rest."""
        self.stop()
        tasks = list(self.in_flight)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _process(self, msg: Msg) -> None:
        keep_alive: KeepAlive = msg.in_progress
        try:
            verdict = await self._handle(msg.data, keep_alive, subject=msg.subject)
        except asyncio.CancelledError:
            # Draining or shutting down: hand the trial back to another runner now.
            with contextlib.suppress(Exception):
                await msg.nak()
            raise
        try:
            await apply_verdict(msg, verdict)
        except Exception as exc:  # noqa: BLE001 - the message must not stay unsettled
            # Same rule as a failed handler: nak rather than wait for ack_wait. A nak
            # after an ack the server did receive changes nothing.
            fallback = settle_error(exc, transient_delay_s=TRANSIENT_RETRY_DELAY_S)
            log.warning(
                "could not settle work message",
                subject=msg.subject,
                verdict=verdict.action,
                error=f"{type(exc).__name__}: {exc}",
            )
            with contextlib.suppress(Exception):
                await apply_verdict(msg, fallback)
