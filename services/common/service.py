"""Process plumbing shared by the services: stop signals, pluggable factories, a loop
kept running beside a block of work."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any


def install_stop_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM / SIGINT (one handler per process, set here only)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


def load_factory(spec: str) -> Callable[..., object]:
    """Import ``module:attribute`` (used for pluggable executors)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not 'module:attribute'")
    factory: Callable[..., object] = getattr(importlib.import_module(module_name), attr)
    return factory


@contextlib.asynccontextmanager
async def running_beside(loop: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``loop`` (a heartbeat, say) as a task while the block runs; cancel it and
    wait for it to end when the block ends, however it ends."""
    task = asyncio.create_task(loop)
    try:
        yield
    finally:
        await cancel_and_wait(task)


async def cancel_and_wait(*tasks: asyncio.Task[Any]) -> None:
    """Cancel each task and wait for it to end (its cancellation is not an error)."""
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
