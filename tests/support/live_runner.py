"""A fake live runner: its record in the runner registry, and no process behind it.

What the submitter, ``trialbus queue`` and fair share read to know a pool has a live
runner is the runner's record in the registry bucket (``<pool>.<runner_id>``), which a
runner process writes at start and rewrites on each heartbeat. Tests that need a pool
to be served, without a runner taking its work, write that record as a runner would.
"""

from __future__ import annotations

from nats.js import JetStreamContext

from schemas.runners import RunnerInfo
from schemas.subjects import Topology
from services.common.adapters.nats_registry import NatsRunnerRegistry


async def announce_live_runner(
    js: JetStreamContext,
    topology: Topology,
    *,
    concurrency: int,
    runner_id: str = "r-1",
    capabilities: tuple[str, ...] = ("local",),
) -> RunnerInfo:
    """Announce runner ``runner_id`` of the default pool with ``concurrency`` slots, as
    a runner process does at start; return the record written.

    Nothing renews it: it stays live for the registry bucket's max age (60 s when this
    call creates the bucket), long enough for the few reads a test makes right after.
    """
    runner = RunnerInfo(
        runner_id=runner_id,
        host="h",
        capabilities=list(capabilities),
        concurrency=concurrency,
    )
    registry = await NatsRunnerRegistry.open(js, topology)
    await registry.announce(runner)
    return runner
