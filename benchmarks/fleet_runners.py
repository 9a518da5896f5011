"""Simulated runners for the fleet benchmark: many runner connections in one process.

Each connection is what a runner process brings to the work stream: its own NATS
connection and the runner's own pull loop (``services.runner.consumer.WorkConsumer``,
long-polling every priority class's shared durable while idle), with one slot. Its
handler decodes the TrialRequested and publishes the trial's TrialStarted (acknowledged)
and nothing else: no lease, no Harbor, so what is measured is the bus and the pull
path with many runners waiting on the same durables.

Run by ``benchmarks.bench_fleet`` as ``python -m benchmarks.fleet_runners URL PREFIX N
TAG``; prints ``ready`` once every connection has started its loop, runs until stdin
closes. The runner's log lines (a failed fetch among them) go to stderr.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import nats
from nats.aio.client import Client as NatsClient

from schemas.events import TrialRequested, TrialStarted, parse_event
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus
from services.common.errors import ACK, Settle
from services.common.logging import configure_logging
from services.runner.attempt import KeepAlive
from services.runner.consumer import IDLE_FETCH_TIMEOUT_S, WorkConsumer
from services.runner.policy import run_fields

HOST = socket.gethostname()


async def _connect(url: str, name: str) -> NatsClient:
    return await nats.connect(url, name=name, max_reconnect_attempts=-1)


def _consumer(nc: NatsClient, topo: Topology, runner_id: str) -> WorkConsumer:
    bus = JetStreamBus(nc.jetstream(), topo)

    async def handle(data: bytes, keep_alive: KeepAlive, *, subject: str = "") -> Settle:
        request = parse_event(data)
        assert isinstance(request, TrialRequested)
        await bus.publish(
            TrialStarted(**run_fields(request), runner_id=runner_id, host=HOST, attempt=1)
        )
        return ACK

    return WorkConsumer(nc.jetstream(), topo, handle, concurrency=1, runner_id=runner_id)


async def run(url: str, prefix: str, n: int, tag: str) -> None:
    """Start ``n`` simulated runners; stop them when stdin closes."""
    configure_logging("WARNING", json=True, stream=sys.stderr)
    topo = Topology(prefix=prefix)
    names = [f"sim-{tag}-{i}" for i in range(n)]
    clients = await asyncio.gather(*(_connect(url, name) for name in names))
    consumers = [_consumer(nc, topo, name) for nc, name in zip(clients, names, strict=True)]
    loops = [asyncio.create_task(c.run()) for c in consumers]
    # Every loop's first long poll is sent within one idle window.
    await asyncio.sleep(2 * IDLE_FETCH_TIMEOUT_S)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for consumer in consumers:
        consumer.stop()
    await asyncio.gather(*loops, return_exceptions=True)
    await asyncio.gather(*(nc.close() for nc in clients), return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
