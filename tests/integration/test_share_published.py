"""A changed fair share reaches queued work once published, on the real nats-server.

Red and blue each submit with ``trialbus submit`` (``TRIALBUS_CLI_TEAM``) under a
quotas file giving them equal shares, so each experiment's ``share.<experiment>``
says 1. Red runs 2 trials and blue 1 (their share marks, as runners hold them), both
with work queued. Judged by the runner's fair share (services/runner/fair_share.py over
the real coordinator and pool counts) and by ``trialbus queue --json``:

- 1:1: red is over its share (held back, ``over_share``), blue's next starts;
- the operator raises red's share to 3 in the file but does not publish it (negative
  control): nothing changes;
- ``trialbus quotas`` publishes it: red (2/3) starts and blue (1/1) waits
  (``over_share``), without resubmitting anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schemas.manifest import AgentSpec, ComputeSpec
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.adapters.nats_pool_load import NatsPoolLoad
from services.common.fair_share import mark_key
from services.common.priority import PriorityClasses
from services.runner.fair_share import FairShare, HeldBack
from tests.e2e.cli import Cli
from tests.support.live_runner import announce_live_runner
from tests.support.manifests import nop_manifest
from tests.support.servers import Servers
from tests.support.work_requests import hello_file_request

pytestmark = pytest.mark.integration

CLASSES = PriorityClasses.parse("urgent=8,normal=3,batch=1", "normal")
"""The installation's defaults (TRIALBUS_PRIORITY_CLASSES), as the CLI uses them."""


async def admitted(servers: Servers, experiment_id: str) -> bool:
    """Whether a runner of the default pool would start the experiment's next trial now
    (a fresh coordinator: nothing cached from an earlier look)."""
    nc = await servers.connect()
    try:
        js = nc.jetstream()
        coord = await NatsCoordinator.open(js, servers.topology, lease_ttl_s=60.0)
        load = NatsPoolLoad(js, servers.topology)
        fair = FairShare(coord, load, servers.topology, "default", CLASSES, look_s=0.0)
        request = hello_file_request(
            f"{experiment_id}-next",
            AgentSpec(name="nop"),
            experiment_id=experiment_id,
            correlation_id="c",
            compute=ComputeSpec(),
        )
        answer = await fair.admit(request)
        assert answer is not None, "the experiment has no team stored (share.<experiment>)"
        return not isinstance(answer, HeldBack)
    finally:
        await nc.close()


async def reasons(cli: Cli) -> dict[str, str]:
    """``trialbus queue --json``: each waiting experiment's reason."""
    waits: dict[str, Any] = await cli.ajson("queue")
    return {e["experiment_id"]: e["reason"] for e in waits["experiments"]}


async def test_a_published_share_change_reaches_queued_work(
    servers: Servers, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("teams:\n  red: {share: 1}\n  blue: {share: 1}\n")
    env = {"TRIALBUS_CHECK_RUNNERS": "false", "TRIALBUS_QUOTAS_FILE": str(quotas)}
    cli = servers.cli(**env)
    ids: dict[str, str] = {}
    for team in ("red", "blue"):
        manifest = nop_manifest(tmp_path, team, agents=1, repetitions=4, concurrency=1000)
        submitted = await servers.cli(TRIALBUS_CLI_TEAM=team, **env).ajson("submit", str(manifest))
        ids[team] = submitted["experiment_id"]
    red, blue = ids["red"], ids["blue"]

    nc = await servers.connect()
    try:
        js = nc.jetstream()
        await announce_live_runner(js, servers.topology, concurrency=4)
        coord = await NatsCoordinator.open(js, servers.topology, lease_ttl_s=60.0)
        for team, run in (("red", "a"), ("red", "b"), ("blue", "a")):
            await coord.mark_running(mark_key("default", "normal", team, run), "r-1")
    finally:
        await nc.close()

    # Equal shares, as stored at submit: red (2) is over blue (1).
    assert (await admitted(servers, red), await admitted(servers, blue)) == (False, True)
    assert await reasons(cli) == {red: "over_share", blue: "priority"}

    # Negative control: the file says 3:1, but nothing published it.
    quotas.write_text("teams:\n  red: {share: 3}\n  blue: {share: 1}\n")
    assert (await admitted(servers, red), await admitted(servers, blue)) == (False, True)
    assert await reasons(cli) == {red: "over_share", blue: "priority"}

    published = await cli.ajson("quotas")
    assert published["limits"]["teams"]["red"] == {"share": 3.0}, published
    # Published: red at 2 of share 3 is under blue's 1 of 1; the same queued messages.
    assert (await admitted(servers, red), await admitted(servers, blue)) == (True, False)
    assert await reasons(cli) == {red: "priority", blue: "over_share"}
