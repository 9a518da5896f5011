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
from nats.js.api import StreamInfo

from schemas.subjects import Topology
from tests.e2e.conftest import Stacks
from tests.e2e.test_pipeline import test_example_experiment_end_to_end as pipeline_scenario

pytestmark = [pytest.mark.docker, pytest.mark.e2e, pytest.mark.timeout(900)]

REPLICAS = 3


async def test_example_experiment_on_production_servers(stacks: Stacks, tmp_path: Path) -> None:
    replicas_env = {"TRIALBUS_STREAM_REPLICAS": str(REPLICAS)}
    stack = await stacks.start(concurrency=4, extra_env=replicas_env)
    # The CLI too: whichever process makes a stream or bucket first sets its replicas.
    await pipeline_scenario(stack, stacks.cli(stack, **replicas_env), tmp_path)

    # The run above was replicated, not merely on a cluster: every stream and bucket
    # on the cluster (only this test's stack uses it) has three replicas.
    nc = await nats.connect(servers=(stack.nats_url or "").split(","))
    try:
        streams = {s.config.name: s for s in await nc.jetstream().streams_info()}
    finally:
        await nc.close()
    topo = Topology(stack.prefix)
    made = {topo.work_stream, topo.events_stream, f"OBJ_{topo.results_bucket}"}
    assert made <= set(streams), sorted(n or "" for n in streams)  # control: not vacuous
    single = {n: s.config.num_replicas for n, s in streams.items() if not is_replicated(s)}
    assert single == {}, f"not on {REPLICAS} nodes (lost with the node that holds them)"


def is_replicated(info: StreamInfo) -> bool:
    """The stream has REPLICAS replicas: a leader and its current followers."""
    cluster = info.cluster
    return (
        info.config.num_replicas == REPLICAS
        and cluster is not None
        and bool(cluster.leader)
        and len(cluster.replicas or []) == REPLICAS - 1
    )
