"""A replicated bucket is written only once its stream has a leader.

On a 3-node cluster, a stream that lost its quorum (two nodes killed) answers no
write until a node is back and a leader is elected, seconds later: the case a runner
meets starting on a loaded or recovering cluster. The control shows the write that
failed in CI (``NoStreamResponseError`` while there is no leader); the checks show
:func:`await_leader` refusing then, and the runner's first announcement, started while
there is none, waiting it out until a node is back.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import nats
import pytest
from nats.js import JetStreamContext

from infra.embedded import NatsCluster
from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.adapters.jetstream import UNANSWERED, await_leader
from services.common.adapters.nats_registry import NatsRunnerRegistry, announce_first
from services.common.errors import TransientError
from tests.support.bus_roles import require_nats_server

pytestmark = pytest.mark.integration


async def _once_leaderless(js: JetStreamContext, stream: str) -> TransientError:
    """await_leader's refusal, once the surviving node reports no leader (60 s at most)."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        try:
            await await_leader(js, stream, timeout_s=1.0)
        except TransientError as exc:
            return exc
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"stream {stream} still reports a leader 60 s after 2 of its 3 nodes died")
        await asyncio.sleep(0.5)


async def test_a_registry_write_waits_for_its_stream_leader(tmp_path: Path) -> None:
    require_nats_server()
    info = RunnerInfo(runner_id="r-1", host="h", concurrency=1)
    with NatsCluster(tmp_path / "cluster") as cluster:
        # Connected to node 0 only: it is the node that stays up.
        nc = await nats.connect(servers=[cluster.urls[0]], max_reconnect_attempts=-1)
        try:
            js = nc.jetstream(timeout=2.0)
            topology = Topology(f"lead{uuid.uuid4().hex[:8]}")
            stream = f"KV_{topology.runners_bucket}"
            registry = await NatsRunnerRegistry.open(js, topology, replicas=3)
            # Opened means led: the first write goes through.
            led = (await js.stream_info(stream)).cluster
            assert led is not None and led.leader in {n.server_name for n in cluster.nodes}
            await registry.announce(info)

            cluster.kill(1)
            cluster.kill(2)
            # Node 0, if it led, calls itself the leader until it notices it has lost
            # its quorum (its election timeout, a few seconds): wait for that.
            refused = await _once_leaderless(js, stream)
            assert f"stream {stream} has no leader after 1 s" in str(refused)

            # The control: a plain write now meets no leader.
            with pytest.raises(UNANSWERED):
                await registry.announce(info)
            # The first announcement starts while there is none, and waits the
            # election out once a second node is back.
            first = asyncio.create_task(announce_first(registry, info.seen_now(None), 120.0))
            await asyncio.sleep(1.0)
            assert not first.done()
            await asyncio.to_thread(cluster.nodes[1].start)
            await asyncio.wait_for(first, 150.0)
            assert [r.runner_id for r in await registry.live_runners()] == ["r-1"]
            await await_leader(js, stream, timeout_s=5.0)  # and it says so at once
        finally:
            await nc.close()
