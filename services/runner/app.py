"""Composition root of a runner process."""

from __future__ import annotations

import asyncio

from services.common.adapters.jetstream import JetStreamBus, connect, ensure_streams
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.logging import configure_logging, get_logger
from services.common.ports import Executor
from services.common.service import install_stop_signals, load_factory
from services.common.settings import RunnerSettings
from services.runner.harbor_executor import HarborExecutor
from services.runner.worker import Runner, ensure_runner_consumer

log = get_logger(__name__)


def build_executor(settings: RunnerSettings) -> Executor:
    """The executor named by settings: Harbor, or a 'module:factory' (benchmarks)."""
    if settings.executor == "harbor":
        return HarborExecutor(settings.jobs_dir.resolve(), settings.sandbox_dir)
    executor = load_factory(settings.executor)(settings)
    return executor  # type: ignore[return-value]


async def serve(settings: RunnerSettings, drain_grace_s: float = 30.0) -> None:
    """Run until SIGTERM/SIGINT, then drain: finish or hand back in-flight trials."""
    configure_logging(settings.log_level, settings.log_json)
    nc = await connect(settings.nats_servers, name="trialbus-runner")
    try:
        js = nc.jetstream()
        topo = settings.topology
        await ensure_streams(js, topo, settings.stream_replicas)
        await ensure_runner_consumer(js, topo, settings.ack_wait_s)
        coordinator = await NatsCoordinator.open(
            js, topo, lease_ttl_s=settings.ack_wait_s, replicas=settings.stream_replicas
        )
        runner = Runner(
            js,
            JetStreamBus(js, topo),
            build_executor(settings),
            concurrency=settings.concurrency,
            heartbeat_s=min(settings.heartbeat_s, settings.ack_wait_s / 3),
            runner_id=settings.runner_id,
            publish_logs=settings.publish_logs,
            nc_publish=nc.publish,
            coordinator=coordinator,
        )
        install_stop_signals(runner.stop)
        await runner.run()
        log.info("runner draining", in_flight=len(runner.state.in_flight))
        await runner.drain(drain_grace_s)
    finally:
        await nc.drain()


def main() -> None:
    asyncio.run(serve(RunnerSettings()))
