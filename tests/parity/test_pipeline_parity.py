"""The pipeline end-to-end scenario (tests/e2e/test_pipeline.py) on production servers.

The same function runs: the example experiment's 24 real Harbor trials submitted, waited
for, resumed, re-imported, judged and exported; here through a 3-node NATS cluster with
every stream and bucket replicated 3x (``TRIALBUS_STREAM_REPLICAS=3``, as compose.yaml
sets it) and a MongoDB replica set as the ledger.
"""

from __future__ import annotations

from pathlib import Path

import nats
import pytest

from schemas.subjects import Topology
from tests.e2e.conftest import Stacks
from tests.e2e.test_pipeline import test_example_experiment_end_to_end as pipeline_scenario

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.timeout(900)]

REPLICAS = 3


async def test_example_experiment_on_production_servers(stacks: Stacks, tmp_path: Path) -> None:
    stack = await stacks.start(concurrency=4, extra_env={"TRIALBUS_STREAM_REPLICAS": str(REPLICAS)})
    await pipeline_scenario(stack, stacks.cli(stack), tmp_path)

    # The run above was replicated, not merely on a cluster: every stream the services
    # made has its two followers (a setting the services ignored would leave R1).
    nc = await nats.connect(servers=(stack.nats_url or "").split(","))
    try:
        js = nc.jetstream()
        topo = Topology(stack.prefix)
        for stream in (topo.events_stream, topo.work_stream):
            info = await js.stream_info(stream)
            assert info.config.num_replicas == REPLICAS, (stream, info.config)
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2, stream
    finally:
        await nc.close()
