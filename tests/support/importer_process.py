"""The importer as its own process (as in production) on the real bus and ledger.

Shared by the tests that feed it events end to end: poison events (integration) and
planted files in trial folders (security). A test module imports the ``importer``
fixture (and overrides ``importer_env`` for settings of its own). Waits poll a state,
never sleep blindly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
import pytest
from nats.js.errors import NotFoundError

from infra.service_process import ServiceProcess
from tests.support.servers import Servers


async def until(
    what: str, check: Callable[[], Awaitable[bool]], proc: ServiceProcess, timeout_s: float
) -> None:
    """Poll ``check`` until true; fail early if ``proc`` died, or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert proc.alive, f"{proc.name} died:\n{proc.log_path.read_text()[-3000:]}"
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.1)


START_S = 90.0
"""Bound on the importer's start, up to its durable consumer existing."""


@pytest.fixture
def importer_env() -> dict[str, str]:
    """Settings added to the importer's environment; a test module overrides this."""
    return {}


@pytest.fixture
async def importer(
    servers: Servers,
    importer_env: dict[str, str],
) -> AsyncIterator[ServiceProcess]:
    """The importer as a separate process, ready (its durable consumer exists)."""
    topology = servers.topology
    env = servers.env()
    env.update(TRIALBUS_LOG_JSON="true", **importer_env)
    proc = ServiceProcess("importer", env, servers.tmp_path / "importer.log")
    proc.start()
    nc = await nats.connect(servers.nats_url)
    try:
        js = nc.jetstream()

        async def ready() -> bool:
            try:
                await js.consumer_info(topology.events_stream, topology.importer_durable)
            except NotFoundError:
                return False
            return True

        await until("the importer's durable consumer", ready, proc, START_S)
        yield proc
    finally:
        await nc.close()
        proc.stop()
