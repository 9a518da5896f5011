"""The fleet and queue pages' live push needs no new bus right: what it re-runs on a
timer (``runners_context``, ``queue_context``: ``follow.fleet`` and
``follow.read_queue``) works over the submitter role's own connection, on a
nats-server with the generated role users. What a push by subscription would have
needed, a watch of the runner registry (a consumer on its KV stream), is refused to
the submitter; control: the admin role may watch it, and sees the runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus
from services.common.adapters.memory import InMemoryLedger
from services.common.adapters.nats_registry import NatsRunnerRegistry
from services.common.settings import CommonSettings
from services.submitter.connections import NatsSide
from services.submitter.dashboard_live_pages import queue_context, runners_context
from tests.support.bus_roles import RoleBus, require_nats_server, role_server

pytestmark = pytest.mark.integration

TOPO = Topology("trialbus")
ACK_WAIT_S = 30.0
DENIAL_WAIT_S = 20.0
"""A bound on the server reporting a refusal (an event), generous for a loaded machine."""


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RoleBus]:
    require_nats_server()
    root: Path = tmp_path_factory.mktemp("live-pages-auth")
    with role_server(root, TOPO, pools=[], ack_wait_s=ACK_WAIT_S) as bus:
        yield bus


async def test_the_push_reads_with_the_submitters_rights_and_cannot_watch(
    bus: RoleBus,
) -> None:
    refusals: asyncio.Queue[str] = asyncio.Queue()

    async def on_error(exc: Exception) -> None:
        await refusals.put(str(exc))

    runner = await bus.connect("runner", name="t-runner")
    submitter = await bus.connect("submitter", name="t-submitter", error_cb=on_error)
    admin = await bus.connect("admin", name="t-admin")
    try:
        registry = await NatsRunnerRegistry.open(runner.jetstream(), TOPO)
        await registry.announce(RunnerInfo(runner_id="r-1", host="h", concurrency=1))

        # What the live pages re-read, as the submitter.
        side = NatsSide(submitter, CommonSettings(prefix=TOPO.prefix), JetStreamBus(
            submitter.jetstream(), TOPO
        ))  # fmt: skip
        app = SimpleNamespace(state=SimpleNamespace(nats=side, ports=SimpleNamespace(
            ledger=InMemoryLedger(), quotas=None
        )))  # fmt: skip
        fleet = await runners_context(app)
        assert [r["runner_id"] for r in fleet["rows"]] == ["r-1"]
        queue = await queue_context(app)
        assert queue["experiments"] == []
        assert refusals.empty(), refusals.get_nowait()

        # A watch of the registry: refused to the submitter...
        kv = await submitter.jetstream().key_value(TOPO.runners_bucket)
        watch = asyncio.ensure_future(kv.watchall())
        consumer = f"$js.api.consumer.create.kv_{TOPO.runners_bucket}".lower()
        try:
            async with asyncio.timeout(DENIAL_WAIT_S):
                while True:
                    said = (await refusals.get()).lower()
                    if "permissions violation for publish" in said and consumer in said:
                        break
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        # ...granted to the admin (control), which sees the runner's record.
        admin_kv = await admin.jetstream().key_value(TOPO.runners_bucket)
        watcher = await admin_kv.watchall()  # the latest value of each key, then live
        entry = await watcher.updates(timeout=DENIAL_WAIT_S)  # type: ignore[no-untyped-call]
        assert entry is not None and entry.key.endswith("r-1")
        await watcher.stop()  # type: ignore[no-untyped-call]
    finally:
        for nc in (runner, submitter, admin):
            await nc.close()
