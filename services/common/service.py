"""Process plumbing shared by the service entrypoints: signals and connections."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

if TYPE_CHECKING:
    from faststream.message import StreamMessage


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

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
