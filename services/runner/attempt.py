"""One attempt while it runs: the executor, its heartbeat, and its TrialStarted beside it.

The handler decides whether and when an attempt starts (services.runner.admission)
and what its outcome means (services.runner.handlers); this module only keeps a
started attempt company: every ``heartbeat_s`` it tells JetStream the message is still
being worked on, renews the experiment's (and team's) concurrency leases, and reads
the cancellation flag fresh, stopping the run when the experiment was cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from services.common.logging import get_logger
from services.common.ports import Coordinator, ExecutionOutcome, Lease

log = get_logger(__name__)

KeepAlive = Callable[[], Awaitable[None]]
"""Tells the broker the message is still being worked on (JetStream in_progress)."""


async def acquire_kept_alive(
    slots: asyncio.Semaphore, keep_alive: KeepAlive, heartbeat_s: float
) -> None:
    """Take one of ``slots``, calling ``keep_alive`` every ``heartbeat_s`` while none is
    free: a message waiting for its turn (admission, settling) must not expire."""
    while True:
        try:
            await asyncio.wait_for(slots.acquire(), heartbeat_s)
            return
        except TimeoutError:
            await keep_alive()


async def run_attempt(
    execution: Coroutine[Any, Any, ExecutionOutcome],
    announced: asyncio.Task[bool],
    *,
    coordinator: Coordinator,
    experiment_id: str,
    leases: list[Lease],
    keep_alive: KeepAlive,
    heartbeat_s: float,
    bind_stop: Callable[[Callable[[], None]], None] | None = None,
) -> ExecutionOutcome | None:
    """Run ``execution`` with heartbeats; None when the experiment was cancelled, or
    when the stop given to ``bind_stop`` was called (the runner hands the trial back:
    preemption, a stop notice; services.runner.preemption).

    TrialStarted's publish (``announced``) runs beside the executor; when it fails,
    the run is stopped at once and its error raised: an attempt that cannot be
    reported is handed back, not paid for to the end.
    """
    run = asyncio.create_task(execution)
    cancelled = asyncio.Event()
    if bind_stop is not None:

        def stop() -> None:
            # The executor's cancel path, as for the experiment's cancellation.
            cancelled.set()
            run.cancel()

        bind_stop(stop)
    beat = asyncio.create_task(
        _heartbeat(coordinator, experiment_id, leases, run, cancelled, keep_alive, heartbeat_s)
    )
    try:
        await asyncio.wait({run, announced}, return_when=asyncio.FIRST_EXCEPTION)
        if not run.done():  # only a failed announcement returns before the run ends
            run.cancel()
            await asyncio.wait({run})
            announced.result()  # raises the publish's error
        return run.result()  # CancelledError when the experiment's cancellation stopped it
    except asyncio.CancelledError:
        if not cancelled.is_set():
            raise  # shutdown, not the experiment's cancellation
        return None
    finally:
        beat.cancel()
        if not run.done():  # shutdown: stop the run and let it clean up first
            run.cancel()
            await asyncio.wait({run})


async def _heartbeat(
    coordinator: Coordinator,
    experiment_id: str,
    leases: list[Lease],
    run: asyncio.Task[ExecutionOutcome],
    cancelled: asyncio.Event,
    keep_alive: KeepAlive,
    heartbeat_s: float,
) -> None:
    """Keep the message, and the slots, ours; stop a cancelled trial."""
    while True:
        await asyncio.sleep(heartbeat_s)
        try:
            await keep_alive()
            for i, lease in enumerate(leases):
                leases[i] = await coordinator.renew(lease)
            if await coordinator.is_cancelled(experiment_id, fresh=True):
                cancelled.set()
                run.cancel()
                return
        except Exception as exc:  # noqa: BLE001 - a missed beat is retried next tick
            log.warning("heartbeat failed", error=f"{type(exc).__name__}: {exc}")
