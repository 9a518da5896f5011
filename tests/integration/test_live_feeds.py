"""What live views read from the events stream: an experiment's started trials
(``LiveFeeds.started_trials``, the history) and ``StartedTrials`` (that history once,
then the live feed), against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from schemas.events import TrialStarted, encode_event
from schemas.subjects import Topology
from services.submitter.live_feeds import LiveFeeds, StartedTrials
from tests.support.starts import started

pytestmark = pytest.mark.integration

N = 2000


async def publish(js: JetStreamContext, topology: Topology, *events: TrialStarted) -> None:
    acks = [
        await js.publish_async(
            topology.event_subject("trial_started", e.experiment_id), encode_event(e)
        )
        for e in events
    ]
    await asyncio.gather(*acks)


async def test_the_history_holds_each_trial_s_latest_start_and_skips_what_is_not_one(
    js: JetStreamContext, nc: NatsClient, topology: Topology
) -> None:
    await publish(
        js, topology, *(started(f"t__{i:05d}", experiment="exp-a", at_s=i) for i in range(N))
    )
    await publish(js, topology, started("t__00000", experiment="exp-a", attempt=2, at_s=N + 1))
    await publish(js, topology, *(started(f"b__{i}", experiment="exp-b") for i in range(5)))
    await js.publish(topology.event_subject("trial_started", "exp-a"), b"{not an event")

    history = await LiveFeeds(nc, topology).started_trials("exp-a")

    assert len(history) == N and all(t.experiment_id == "exp-a" for t in history.values())
    assert history["t__00000"].attempt == 2  # its retry, not its first start
    assert await LiveFeeds(nc, topology).started_trials("exp-c") == {}


async def test_a_live_view_reads_the_history_once_and_follows_its_feed(
    js: JetStreamContext, nc: NatsClient, topology: Topology
) -> None:
    await publish(js, topology, *(started(f"t__{i:05d}", experiment="exp-a") for i in range(10)))
    live = LiveFeeds(nc, topology)
    reads = 0

    class Counted:
        async def started_trials(self, experiment_id: str) -> dict[str, TrialStarted]:
            nonlocal reads
            reads += 1
            return await live.started_trials(experiment_id)

    tracked = StartedTrials(Counted(), "exp-a")
    unfed = StartedTrials(live, "exp-a")  # control: a view that is not given the feed
    async with live.experiment_events("exp-a") as feed:  # subscribed before the read
        assert len(await tracked.current()) == 10
        assert len(await unfed.current()) == 10
        await publish(
            js, topology, started("late", experiment="exp-a"), started("other", experiment="exp-b")
        )
        event = await feed.next(30)
        assert isinstance(event, TrialStarted) and event.trial_id == "late"
        tracked.seen(event)
        assert set(await tracked.current()) == {f"t__{i:05d}" for i in range(10)} | {"late"}
    assert reads == 1
    assert "late" not in await unfed.current()  # what the feed alone brought in
