"""Composition root of a runner process: connect, build the adapters, run, drain.

The decisions live in services.runner.handlers (over the ports) and
services.runner.policy (pure); the nats-py pull loop is services.runner.consumer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from pathlib import Path

from schemas.runners import RunnerInfo, RunnerPolicy
from services.common.adapters.jetstream import JetStreamBus, connect, ensure_streams
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.adapters.nats_objects import open_bucket
from services.common.adapters.nats_pool_load import NatsPoolLoad
from services.common.adapters.nats_registry import NatsRunnerRegistry, heartbeat
from services.common.errors import EXIT_USER_ERROR
from services.common.fit import Fit
from services.common.logging import configure_logging, get_logger
from services.common.redaction import TrialSecrets
from services.common.runner_metrics import RunnerMetrics, exporter
from services.common.runner_policy import (
    PolicyFileError,
    harbor_agent_names,
    load_policy,
    secrets_set,
)
from services.common.service import install_stop_signals, running_beside
from services.common.settings import RunnerSettings
from services.common.task_cache import TaskCache
from services.common.trial_folders import TrialFolders, sweep_set_aside
from services.localenv.stale import LAYERS_NAME, default_scratch, sweep_stale
from services.runner.capabilities import detect_environments
from services.runner.consumer import WorkConsumer, ensure_runner_consumers
from services.runner.executors import ExecutorSettingError, custom_executor
from services.runner.fair_share import FairShare
from services.runner.fit import Peers
from services.runner.handback import StopNotice, watch_preemption
from services.runner.handlers import TrialHandler
from services.runner.harbor_executor import HarborExecutor
from services.runner.live_logs import CoreNatsLogSinks
from services.runner.preemption import Running
from services.runner.trial_process import SandboxSettings

log = get_logger(__name__)


def trial_folders_root(settings: RunnerSettings) -> Path:
    """Where this runner's executor writes trial folders (until they are stored)."""
    return (settings.work_dir / "jobs").resolve()


def harbor_executor(
    settings: RunnerSettings, tasks: TaskCache, policy: RunnerPolicy | None = None
) -> HarborExecutor:
    """Harbor's executor as the settings describe it, enforcing ``policy`` (another
    executor is made before the runner connects: services.runner.executors)."""
    sandbox = SandboxSettings(
        scratch_dir=settings.sandbox_dir,
        hidden_paths=tuple(settings.hidden_from_trials()),
        disk_mb=settings.sandbox_disk_mb,
        userns_base=(
            settings.sandbox_userns_base if settings.sandbox_userns == "shifted" else None
        ),
    )
    return HarborExecutor(
        trial_folders_root(settings),
        tasks,
        sandbox,
        policy=policy,
        secrets=TrialSecrets.from_settings(settings),
    )


def release_stale_disks(settings: RunnerSettings) -> list[Path]:
    """Release the disks that trials and builds of a dead runner left in this runner's
    sandbox folder (mounts, loop devices, images: services.localenv.stale); the trial
    and build folders released."""
    scratch = settings.sandbox_dir or default_scratch()
    logger = logging.getLogger("services.localenv.stale")
    swept = []
    # Trials' disks in the sandbox folder, builds' disks in its layer cache.
    for folder in (scratch, scratch / LAYERS_NAME):
        if folder.is_dir():
            swept += sweep_stale(folder, logger)
    if swept:
        log.warning("released disks of dead trials", sandbox_dir=str(scratch), trials=len(swept))
    return swept


def heartbeat_interval(settings: RunnerSettings, lease_ttl_s: float | None) -> float:
    """How often a running trial's message is kept alive and its leases renewed: the
    setting, but three beats at least per ack wait and per lease TTL (the leases
    bucket's, which whoever created it first set), so one lost beat never lets the
    message be redelivered nor the experiment's slot lapse while the trial runs."""
    beat = min(settings.heartbeat_s, settings.ack_wait_s / 3)
    if lease_ttl_s is not None and lease_ttl_s / 3 < beat:
        log.warning(
            "heartbeat shortened to the leases bucket's TTL",
            heartbeat_s=lease_ttl_s / 3,
            setting=settings.heartbeat_s,
            lease_ttl_s=lease_ttl_s,
        )
        beat = lease_ttl_s / 3
    return beat


async def serve(settings: RunnerSettings, drain_grace_s: float = 30.0) -> None:
    """Run until SIGTERM/SIGINT, then drain: finish or hand back in-flight trials
    (with ``settings.stop_notice_s``: hand back at once what cannot finish in time)."""
    configure_logging(settings.log_level, settings.log_json)
    # Read before connecting: a broken policy file or executor setting stops the runner
    # at once (exit 2).
    policy = load_policy(settings.policy_file)
    custom = custom_executor(settings)
    # A runner killed outright (SIGKILL) left its trials' disks mounted: release them
    # before taking work, not only when the next local trial starts.
    await asyncio.to_thread(release_stale_disks, settings)
    # Stored trial folders a stopped runner had set aside but not yet deleted.
    await asyncio.to_thread(sweep_set_aside, trial_folders_root(settings))
    nc = await connect(
        settings.nats_servers,
        name="trialbus-runner",
        credentials=settings.nats_credentials,
        role="runner",
    )
    try:
        js = nc.jetstream(domain=settings.nats_js_domain)
        topo = settings.topology
        await ensure_streams(js, topo, settings.stream_replicas)
        coordinator = await NatsCoordinator.open(
            js, topo, lease_ttl_s=settings.ack_wait_s, replicas=settings.stream_replicas
        )
        tasks = TaskCache(
            (settings.work_dir / "tasks").resolve(),
            await open_bucket(js, settings, "tasks"),
            budget_bytes=settings.task_cache_bytes,
        )
        secrets = TrialSecrets.from_settings(settings)
        folders = TrialFolders(
            await open_bucket(js, settings, "results"),
            cap_bytes=settings.result_cap_bytes,
            keep_local=settings.keep_trial_dirs,
            # Stored folders are redacted like live logs and exception messages.
            scrub_for=lambda request: secrets.redactor(request).redact_file,
        )
        host = socket.gethostname()
        runner_id = settings.runner_id or f"{host}-{os.getpid()}"
        executor = custom or harbor_executor(settings, tasks, policy)
        info = RunnerInfo(
            runner_id=runner_id,
            host=host,
            pool=settings.pool,
            capabilities=await asyncio.to_thread(detect_environments),
            labels=settings.labels,
            harbor_version=executor.version,
            harbor_agents=sorted(harbor_agent_names()),
            concurrency=settings.concurrency,
            policy=policy,
            secrets_set=secrets_set(policy, os.environ),
        )
        registry = await NatsRunnerRegistry.open(
            js, topo, create_ttl_s=settings.ack_wait_s, replicas=settings.stream_replicas
        )
        metrics = RunnerMetrics()
        running = Running()  # for preemption and stop notices (services.runner.handback)
        handler = TrialHandler(
            metrics.bus(JetStreamBus(js, topo)),
            executor,
            coordinator,
            folders,
            runner_id=runner_id,
            host=host,
            heartbeat_s=heartbeat_interval(settings, coordinator.lease_ttl_s),
            admission=settings.admission,
            fit=Fit(info.offers, frozenset(info.secrets_set or ()), policy.allowed_secrets),
            peers=Peers(registry, runner_id),
            log_sinks=CoreNatsLogSinks.from_settings(nc.publish, settings)
            if settings.publish_logs
            else None,
            running=running,
            classes=settings.classes,
            fair_share=FairShare(
                coordinator, NatsPoolLoad(js, topo), topo, settings.pool, settings.classes
            )
            if settings.fair_share
            else None,
        )
        consumer = WorkConsumer(
            js,
            topo,
            metrics.handler(handler.handle),
            concurrency=settings.concurrency,
            runner_id=runner_id,
            pool=settings.pool,
            classes=settings.classes,
        )
        notice = StopNotice(consumer, running, settings.stop_notice_s)
        install_stop_signals(notice.signal)
        log.info(
            "runner capabilities",
            pool=info.pool,
            offers=sorted(info.offers),
            policy_file=str(settings.policy_file or "default"),
        )
        # Announced (pool, capabilities) while it takes work; withdrawn when it stops.
        # Announced before its durable is made: whoever waits for the durable (the
        # embedded stack's readiness) then finds the runner live.
        with exporter(metrics.registry, settings.metrics_port, str(settings.metrics_addr)):
            async with heartbeat(registry, info, registry.heartbeat_s, metrics.load):
                await ensure_runner_consumers(
                    js, topo, settings.ack_wait_s, settings.pool, settings.classes
                )
                weights = dict(settings.classes.weights)
                async with running_beside(watch_preemption(consumer, running, weights)):
                    await consumer.run()
            log.info("runner draining", in_flight=len(consumer.in_flight))
            await notice.finish(drain_grace_s)
            await handler.discarded()  # settled trials' local folders, deleted off the slot
    finally:
        await nc.drain()


def main() -> None:
    """Entry point of ``python -m services.runner``."""
    try:
        asyncio.run(serve(RunnerSettings()))
    except (PolicyFileError, ExecutorSettingError) as exc:
        print(f"trialbus runner: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USER_ERROR) from None
