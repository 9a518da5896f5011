"""The CLI's live views (services/submitter/follow.py) need no right the submitter role
lacks: besides the dashboard's feeds (test_dashboard_bus_rights.py), ``logs`` counts a
trial's lines with STREAM.INFO on the logs stream and ``runners`` lists the registry
bucket. Each with its control: a role without that right is refused the same call.

Against a real nats-server with one user per role (the fixtures of
test_bus_permissions.py).
"""

from __future__ import annotations

import asyncio

import pytest

from schemas.events import TrialLog, encode_event
from schemas.runners import RunnerInfo
from services.common.adapters.nats_registry import NatsRunnerRegistry
from services.reports.progress import runner_rows
from services.submitter.live_feeds import LiveFeeds
from tests.security.test_bus_permissions import TOPO, Role, _exp, bus, roles

pytestmark = pytest.mark.integration
__all__ = ["bus", "roles"]  # fixtures, used by name


async def test_submitter_counts_a_trials_log_lines_and_follows_them(
    roles: dict[str, Role],
) -> None:
    submitter, runner, importer = roles["submitter"], roles["runner"], roles["importer"]
    exp = _exp()
    trial = f"{exp}-t1"
    line = TrialLog(experiment_id=exp, trial_id=trial, phase="agent", stream="stdout", text="x")
    await runner.nc.publish(TOPO.log_subject(exp, trial), encode_event(line))
    await runner.nc.flush()
    subject = f"{TOPO.prefix}.logs.*.{trial}"  # what follow.trial_logs counts

    # A core publish is stored by the stream after the flush returns: wait for it (a
    # loaded run read the count before the store).
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        info = await submitter.js.stream_info(TOPO.logs_stream, subjects_filter=subject)
        stored = sum((info.state.subjects or {}).values())
        if stored or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.1)
    assert stored == 1
    async with LiveFeeds(submitter.nc, TOPO).trial_log(trial) as feed:
        got = await feed.next(10)
    assert isinstance(got, TrialLog) and got.text == "x"

    # Control: the importer may look at the stream but not follow it.
    await importer.denied(
        LiveFeeds(importer.nc, TOPO).trial_log(trial).__aenter__(),
        "Publish",
        f"$JS.API.CONSUMER.CREATE.{TOPO.logs_stream}",
    )


async def test_submitter_lists_the_runner_registry(roles: dict[str, Role]) -> None:
    submitter, runner, subscriber = roles["submitter"], roles["runner"], roles["subscriber"]
    me = RunnerInfo(runner_id=f"cli-{_exp()}", host="h", concurrency=2)
    await (await NatsRunnerRegistry.open(runner.js, TOPO)).announce(me)

    registry = await NatsRunnerRegistry.open(submitter.js, TOPO)  # what follow.list_runners does
    rows = runner_rows(await registry.live_runners(), registry.heartbeat_s)
    assert me.runner_id in {r.runner_id for r in rows}

    # Control: the read-only subscriber role may not read the registry at all.
    await subscriber.denied(
        NatsRunnerRegistry.open(subscriber.js, TOPO),
        "Publish",
        f"$JS.API.STREAM.INFO.KV_{TOPO.runners_bucket}",
    )
