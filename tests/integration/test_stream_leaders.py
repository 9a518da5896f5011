"""A replicated bucket is written only once its stream has a leader.

On a 3-node cluster, a stream that lost its quorum (two nodes killed) answers no
write until a node is back and a leader is elected, seconds later: the case a runner
meets starting on a loaded or recovering cluster. The control shows the write that
failed in CI (``NoStreamResponseError`` right after the node is back); the checks
show :func:`await_leader` and the runner's first announcement waiting it out.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import nats
import pytest
from nats.js.errors import NoStreamResponseError

from infra.embedded import NatsCluster
from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.adapters.jetstream import await_leader
from services.common.adapters.nats_registry import NatsRunnerRegistry, announce_first
from services.common.errors import TransientError
from tests.support.bus_roles import require_nats_server

pytestmark = pytest.mark.integration


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
            with pytest.raises(TransientError, match=f"stream {stream} has no leader after 1 s"):
                await await_leader(js, stream, timeout_s=1.0)

            await asyncio.to_thread(cluster.nodes[1].start)
            # The control: a write right after the node is back meets no leader yet.
            with pytest.raises(NoStreamResponseError):
                await registry.announce(info)
            await announce_first(registry, info.seen_now(None), wait_s=60.0)
            assert [r.runner_id for r in await registry.live_runners()] == ["r-1"]
            await await_leader(js, stream, timeout_s=5.0)  # and it says so at once
        finally:
            await nc.close()
