"""The runner registry's contract, run against the NATS KV adapter and the in-memory fake.

The NATS side uses a real nats-server (one per module) and a bucket per test (a unique
topology prefix); the fake lets time pass on a clock the test moves. Expiry is awaited
on the real server (its TTL is one second), with a generous deadline, never slept on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest

from infra.embedded import NatsServer
from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.adapters.memory_registry import MemoryRunnerRegistry
from services.common.adapters.nats_registry import (
    HEARTBEATS_PER_TTL,
    NatsRunnerRegistry,
    heartbeat,
)
from services.common.ports import RunnerRegistry
from tests.support.bus_roles import require_nats_server

pytestmark = pytest.mark.integration

TTL_S = 1.0
EXPIRY_DEADLINE_S = 10.0


@dataclass(slots=True)
class Subject:
    """A registry under test and how to let its TTL pass."""

    registry: RunnerRegistry
    expire: Callable[[], Awaitable[None]]


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_nats_server()
    with NatsServer(Path(tmp_path_factory.mktemp("registry"))) as server:
        yield server.url


@pytest.fixture(params=["nats", "memory"])
async def subject(request: pytest.FixtureRequest, nats_url: str) -> AsyncIterator[Subject]:
    if request.param == "memory":
        now = [0.0]

        async def advance() -> None:
            now[0] += TTL_S

        yield Subject(MemoryRunnerRegistry(TTL_S, clock=lambda: now[0]), advance)
        return
    nc = await nats.connect(nats_url)
    topo = Topology(f"reg{uuid.uuid4().hex[:8]}")
    registry = await NatsRunnerRegistry.open(nc.jetstream(), topo, create_ttl_s=TTL_S)
    assert registry.ttl_s == TTL_S  # read back from the bucket
    assert registry.heartbeat_s == TTL_S / HEARTBEATS_PER_TTL

    async def wait_out_ttl() -> None:
        deadline = time.monotonic() + EXPIRY_DEADLINE_S
        while await registry.live_runners():
            assert time.monotonic() < deadline, "records outlived the bucket's TTL"
            await asyncio.sleep(0.1)  # the server expires records on its own timer

    try:
        yield Subject(registry, wait_out_ttl)
    finally:
        await nc.close()


def _runner(runner_id: str, pool: str = "default", **kw: object) -> RunnerInfo:
    return RunnerInfo.model_validate(
        {"runner_id": runner_id, "host": "h1", "pool": pool, "concurrency": 2, **kw}
    )


async def test_announced_runners_are_listed_until_withdrawn(subject: Subject) -> None:
    reg = subject.registry
    assert await reg.live_runners() == []
    a = _runner("h1-100", capabilities=["local"])
    b = _runner("h2-7.example", pool="gpu", labels=["gpu"])
    await reg.announce(a)
    await reg.announce(b)
    assert await reg.live_runners() == [a, b]
    again = a.seen_now()
    await reg.announce(again)  # a heartbeat replaces, never duplicates
    assert await reg.live_runners() == [again, b]
    await reg.withdraw(a)
    assert await reg.live_runners() == [b]


async def test_a_silent_runner_expires(subject: Subject) -> None:
    await subject.registry.announce(_runner("h1-1"))
    assert len(await subject.registry.live_runners()) == 1  # control: it was there
    await subject.expire()
    assert await subject.registry.live_runners() == []


async def test_heartbeat_announces_while_running_and_withdraws_on_stop(subject: Subject) -> None:
    reg = subject.registry
    info = _runner("h1-hb", capabilities=["local"])
    async with heartbeat(reg, info, interval_s=0.05):
        listed = await reg.live_runners()
        assert [r.runner_id for r in listed] == ["h1-hb"]
        first = listed[0].last_seen
        deadline = time.monotonic() + EXPIRY_DEADLINE_S
        while (await reg.live_runners())[0].last_seen == first:
            assert time.monotonic() < deadline, "no second heartbeat"
            await asyncio.sleep(0.05)
    assert await reg.live_runners() == []


async def test_a_malformed_record_is_skipped(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        topo = Topology(f"reg{uuid.uuid4().hex[:8]}")
        reg = await NatsRunnerRegistry.open(nc.jetstream(), topo, create_ttl_s=60)
        good = _runner("h1-ok")
        await reg.announce(good)
        kv = await nc.jetstream().key_value(topo.runners_bucket)
        await kv.put("default.forged", b'{"runner_id": "x"}')
        assert await reg.live_runners() == [good]
    finally:
        await nc.close()
