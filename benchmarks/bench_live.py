"""13. Live views: an experiment's started trials, 10,000 starts (history read, p50).

What only the bus knows of a running experiment, which trials have started, is read
from the events stream's TrialStarted history (services/submitter/live_feeds.py).
N TrialStarted events of one experiment (10,000; ``TRIALBUS_BENCH_LIVE`` overrides)
are published to a fresh nats-server, then measured, ``runs`` times each:

- ``LiveFeeds.started_trials``, the read every page view and every live view's first
  update does (the headline): an ordered consumer whose messages a callback takes;
- the same read a message at a time (``next_msg()`` through ``EventFeed.take``), as it
  was done before, for comparison;
- a live view's redraw (``StartedTrials.current()`` after its first read): what
  ``status --follow`` and the dashboard's experiment stream pay per update now, where
  each update used to do the whole read.

Each read must return all N trials, so a read cut by its time bound is not timed as
a fast one.
"""

from __future__ import annotations

import asyncio
import os
import time

import nats
from nats.aio.client import Client as NatsClient
from nats.js.api import DeliverPolicy

from benchmarks.harness import BenchResult, Context, Figure, median
from infra.embedded import NatsServer
from schemas.events import TrialStarted, encode_event
from schemas.subjects import Topology
from services.common.adapters.jetstream import ensure_streams
from services.submitter.live_feeds import HISTORY_TIMEOUT_S, LiveFeeds, StartedTrials

EXPERIMENT = "live-bench"
TARGET_MS = 250.0
"""A page view's read of 10,000 starts (one Python process, a loaded 2-core machine)."""


async def publish_starts(nc: NatsClient, topology: Topology, n: int) -> None:
    """N TrialStarted events of ``EXPERIMENT``, acknowledged."""
    js = nc.jetstream()
    await ensure_streams(js, topology)
    subject = topology.event_subject("trial_started", EXPERIMENT)
    for first in range(0, n, 1000):
        acks = []
        for i in range(first, min(n, first + 1000)):
            start = TrialStarted(
                experiment_id=EXPERIMENT,
                correlation_id="bench",
                trial_id=f"trial__{i:08d}",
                attempt=1,
                runner_id="bench-runner",
                host="bench",
            )
            acks.append(await js.publish_async(subject, encode_event(start)))
        await asyncio.gather(*acks)


async def read_one_at_a_time(live: LiveFeeds, topology: Topology, n: int) -> int:
    """The history read as it was: ``next_msg()`` per message; the trials read."""
    subject = topology.event_subject("trial_started", EXPERIMENT)
    started: set[str] = set()
    async with live._follow(subject, DeliverPolicy.ALL) as feed:
        async for event in feed.take(n, time.monotonic() + 10 * HISTORY_TIMEOUT_S):
            if isinstance(event, TrialStarted):
                started.add(event.trial_id)
    return len(started)


async def measure(url: str, n: int, runs: int) -> dict[str, list[float]]:
    """Milliseconds per run of each way of reading (module docstring)."""
    topology = Topology("livebench")
    nc = await nats.connect(url, name="bench-live")
    try:
        await publish_starts(nc, topology, n)
        live = LiveFeeds(nc, topology)
        times: dict[str, list[float]] = {"callback": [], "one_at_a_time": [], "redraw": []}
        for _ in range(runs):
            t0 = time.perf_counter()
            got = len(await live.started_trials(EXPERIMENT))
            times["callback"].append((time.perf_counter() - t0) * 1000)
            if got != n:
                raise AssertionError(f"read {got} of {n} starts within the time bound")
            t0 = time.perf_counter()
            got = await read_one_at_a_time(live, topology, n)
            times["one_at_a_time"].append((time.perf_counter() - t0) * 1000)
            if got != n:
                raise AssertionError(f"read {got} of {n} starts a message at a time")
            view = StartedTrials(live, EXPERIMENT)
            await view.current()  # its first read
            t0 = time.perf_counter()
            got = len(await view.current())
            times["redraw"].append((time.perf_counter() - t0) * 1000)
            if got != n:
                raise AssertionError(f"a redraw saw {got} of {n} starts")
        return times
    finally:
        await nc.close()


def run(ctx: Context) -> BenchResult:
    n = int(os.environ.get("TRIALBUS_BENCH_LIVE", 0)) or (500 if ctx.quick else 10_000)
    ctx.log(f"live: {n} starts, {ctx.runs} runs")
    with NatsServer(ctx.path("live", "nats")) as server:
        times = asyncio.run(measure(server.url, n, ctx.runs))
    callback, before = median(times["callback"]), median(times["one_at_a_time"])
    return BenchResult(
        name="live",
        title=f"Live views: an experiment's started trials, {n:,} starts (history read, p50)",
        value=callback,
        unit="ms",
        target=TARGET_MS,
        target_op="<=",
        runs=[round(x, 2) for x in times["callback"]],
        peers=[
            Figure("one_at_a_time_ms", before, "ms", "the read before: next_msg() per message"),
            Figure("speedup", before / callback if callback else 0.0, "x", "before / now"),
            Figure(
                "redraw_ms",
                median(times["redraw"]),
                "ms",
                "a live view's update after its first read (each used to read it all)",
            ),
        ],
        config={"starts": n, "history_bound_s": HISTORY_TIMEOUT_S},
    )
