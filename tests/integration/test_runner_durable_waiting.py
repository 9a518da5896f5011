"""A pool's class durables hold a pull request from every idle runner, well past 512.

Each idle runner keeps one pull request open per class durable. nats-server's default
limit of waiting pull requests (512) answers the rest with 409, which nats-py's fetch
reads as "no message" after waiting out its window: those runners take no work. With 600
pullers against a real nats-server: the runners' durables hold all of them; a durable
made as before (the server's default, the control) holds 512 and refuses the rest. A
durable made before keeps its limit (the server refuses to change it), and re-filtering
it must still work.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import ensure_streams
from services.common.priority import DEFAULT_CLASSES, PriorityClasses
from services.runner.durables import MAX_WAITING, ensure_runner_durables, runner_durable_config

PULLERS = 600
"""Idle runners of one pool: more than nats-server's default of 512."""
CLASSES = PriorityClasses.parse(DEFAULT_CLASSES)


async def _waiting_after_pulls(js: JetStreamContext, topo: Topology, durable: str) -> int:
    """Open PULLERS long polls on ``durable`` (as idle runners do); how many it holds."""
    subs = [await js.pull_subscribe_bind(durable, stream=topo.work_stream) for _ in range(PULLERS)]
    polls = [asyncio.create_task(s.fetch(1, timeout=20)) for s in subs]
    try:
        seen: list[int] = []
        async with asyncio.timeout(30):  # the requests reach the server in well under this
            # Until all are held, or the count has stood still for three looks (1.5 s).
            while not seen or (
                seen[-1] < PULLERS and not (len(seen) > 3 and len(set(seen[-4:])) == 1)
            ):
                info = await js.consumer_info(topo.work_stream, durable)
                seen.append(info.num_waiting or 0)
                await asyncio.sleep(0.5)
        return seen[-1]
    finally:
        for poll in polls:
            poll.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def test_every_idle_runner_keeps_its_pull_request(nc: NatsClient, topology: Topology) -> None:
    js = nc.jetstream()
    await ensure_streams(js, topology)
    await ensure_runner_durables(js, topology, 30, [DEFAULT_POOL], CLASSES)
    durable = topology.runner_durable_for(DEFAULT_POOL)
    info = await js.consumer_info(topology.work_stream, durable)
    assert info.config.max_waiting == MAX_WAITING
    assert await _waiting_after_pulls(js, topology, durable) == PULLERS


async def test_control_a_durable_made_as_before_refuses_past_512(
    nc: NatsClient, topology: Topology
) -> None:
    js = nc.jetstream()
    await ensure_streams(js, topology)
    old = dataclasses.replace(runner_durable_config(topology, 30), max_waiting=None)
    assert old.durable_name is not None
    await js.add_consumer(topology.work_stream, old)
    assert await _waiting_after_pulls(js, topology, old.durable_name) == 512


async def test_a_durable_made_before_is_refiltered_keeping_its_limit(
    nc: NatsClient, topology: Topology
) -> None:
    """The update a re-filter sends must not ask for a new limit (nats-server refuses)."""
    js = nc.jetstream()
    await ensure_streams(js, topology)
    old = dataclasses.replace(
        runner_durable_config(topology, 30),
        max_waiting=None,
        filter_subjects=[topology.work_pool_filter(DEFAULT_POOL)],  # from before classes
    )
    assert old.durable_name is not None
    await js.add_consumer(topology.work_stream, old)
    await ensure_runner_durables(js, topology, 30, [DEFAULT_POOL], CLASSES)
    info = await js.consumer_info(topology.work_stream, old.durable_name)
    assert info.config.max_waiting == 512
    assert sorted(info.config.filter_subjects or []) == sorted(
        topology.work_class_filters(DEFAULT_POOL, CLASSES.default, default=True)
    )
