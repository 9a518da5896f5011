"""The runner's work loop: fetch only as many trials as there are free slots.

FastStream's pull subscriber with ``max_workers`` prefetches past ``ack_wait`` and
duplicates work (checked on this machine), so the runner drives nats-py's pull
consumer itself: a free slot is taken *before* a message is fetched, and every
message in flight gets ``in_progress()`` heartbeats until it is settled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from schemas.events import (
    EventDecodeError,
    TrialCompleted,
    TrialFailed,
    TrialLog,
    TrialRequested,
    TrialStarted,
    parse_event,
)
from schemas.record import FailureClass
from schemas.subjects import Topology
from services.common.adapters.jetstream import JetStreamBus
from services.common.errors import TransientError
from services.common.failures import classify, is_retryable
from services.common.logging import get_logger
from services.common.ports import Coordinator, ExecutionOutcome, Executor, Lease, LogSink

log = get_logger(__name__)

LogPublisher = Callable[[str, bytes], Awaitable[None]]
"""Core NATS publish (subject, payload): fire-and-forget, for live logs."""


def backoff_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff before attempt ``attempt + 1``."""
    return float(min(max_s, base_s * (2 ** max(0, attempt - 1))))


async def ensure_runner_consumer(
    js: JetStreamContext, topology: Topology, ack_wait_s: float
) -> None:
    """Create the runners' shared durable pull consumer if it does not exist yet."""
    try:
        await js.consumer_info(topology.work_stream, topology.runner_durable)
    except NotFoundError:
        await js.add_consumer(
            topology.work_stream,
            ConsumerConfig(
                durable_name=topology.runner_durable,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                filter_subject=topology.work_wildcard,
                ack_wait=ack_wait_s,
                max_deliver=-1,  # attempts are counted and bounded by the runner
                max_ack_pending=100_000,
            ),
        )


@dataclass
class RunnerState:
    """What a runner is doing now (for status and drain)."""

    in_flight: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0


class Runner:
    """Takes trials from the work stream and runs them with an Executor."""

    def __init__(
        self,
        js: JetStreamContext,
        bus: JetStreamBus,
        executor: Executor,
        *,
        concurrency: int,
        heartbeat_s: float,
        runner_id: str | None = None,
        publish_logs: bool = True,
        nc_publish: LogPublisher | None = None,
        coordinator: Coordinator | None = None,
    ) -> None:
        self._js = js
        self._bus = bus
        self._executor = executor
        self._slots = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self._heartbeat_s = heartbeat_s
        self.host = socket.gethostname()
        self.runner_id = runner_id or f"{self.host}-{os.getpid()}"
        self._publish_logs = publish_logs and nc_publish is not None
        self._nc_publish = nc_publish
        self._coord = coordinator
        self._stopping = asyncio.Event()
        self.state = RunnerState()

    @property
    def topology(self) -> Topology:
        return self._bus.topology

    async def run(self) -> None:
        """Fetch and run trials until ``stop()``; then wait for in-flight trials."""
        topo = self.topology
        psub = await self._js.pull_subscribe_bind(topo.runner_durable, stream=topo.work_stream)
        log.info("runner ready", runner_id=self.runner_id, concurrency=self._concurrency)
        try:
            while not self._stopping.is_set():
                await self._slots.acquire()
                free = 1
                # Take every other free slot too, without waiting, to fetch in one request.
                while free < self._concurrency and not self._slots.locked():
                    await self._slots.acquire()
                    free += 1
                msgs = await self._fetch(psub, free)
                for _ in range(free - len(msgs)):
                    self._slots.release()
                for msg in msgs:
                    task = asyncio.create_task(self._handle(msg))
                    key = f"{id(task)}"
                    self.state.in_flight[key] = task
                    task.add_done_callback(functools.partial(self._done, key))
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _fetch(self, psub: JetStreamContext.PullSubscription, n: int) -> list[Msg]:
        if self._stopping.is_set():
            return []
        try:
            return await psub.fetch(batch=n, timeout=1.0)
        except (NatsTimeoutError, TimeoutError):
            return []
        except Exception as exc:  # noqa: BLE001 - reconnecting; keep the loop alive
            log.warning("fetch failed; retrying", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(1.0)
            return []

    def _done(self, key: str, _task: asyncio.Task[None]) -> None:
        self.state.in_flight.pop(key, None)
        self._slots.release()

    def stop(self) -> None:
        """Stop fetching new work (in-flight trials go on)."""
        self._stopping.set()

    async def drain(self, grace_s: float) -> None:
        """Stop fetching, let in-flight trials finish for ``grace_s``, hand back the rest."""
        self.stop()
        tasks = list(self.state.in_flight.values())
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # -- one message ---------------------------------------------------------------------
    async def _handle(self, msg: Msg) -> None:
        try:
            event = parse_event(msg.data)
            if not isinstance(event, TrialRequested):
                raise EventDecodeError(f"expected trial_requested, got {event.type}")
        except EventDecodeError as exc:
            log.error("poison work message terminated", subject=msg.subject, error=str(exc))
            await msg.term()
            return
        bound = log.bind(trial_id=event.trial_id, experiment_id=event.experiment_id)
        try:
            await self._run_one(msg, event, bound)
        except asyncio.CancelledError:
            # Draining or shutting down: hand the trial back to another runner now.
            with contextlib.suppress(Exception):
                await msg.nak()
            bound.warning("trial handed back")
            raise
        except TransientError as exc:
            bound.warning("could not report trial; will be redelivered", error=str(exc))
            with contextlib.suppress(Exception):
                await msg.nak(delay=5)
        except Exception:  # noqa: BLE001 - nak, never ack: the trial is redelivered
            # A bug: log it and let JetStream redeliver rather than lose the trial.
            bound.exception("runner error; trial will be redelivered")
            with contextlib.suppress(Exception):
                await msg.nak(delay=10)

    async def _run_one(self, msg: Msg, req: TrialRequested, bound: Any) -> None:
        coord = self._coord
        if coord is not None and await coord.is_cancelled(req.experiment_id):
            await self._report_cancelled(msg, req, attempt=1, trial_dir=None)
            return
        lease = None
        if coord is not None:
            lease = await coord.acquire(
                req.experiment_id, req.compute.n_concurrent_trials, self.runner_id
            )
            if lease is None:
                # The experiment's concurrency budget is used by other runners/trials:
                # hand the trial back; other experiments' trials keep flowing.
                await msg.nak(delay=random.uniform(0.5, 2.0))
                return
        try:
            attempt = (
                await coord.next_attempt(req.dedup_id())
                if coord is not None
                else msg.metadata.num_delivered
            )
            bound = bound.bind(attempt=attempt)
            await self._bus.publish(
                TrialStarted(
                    experiment_id=req.experiment_id,
                    trial_id=req.trial_id,
                    correlation_id=req.correlation_id,
                    runner_id=self.runner_id,
                    host=self.host,
                    attempt=attempt,
                    run_id=req.dedup_id(),
                )
            )
            run = asyncio.create_task(self._executor.run(req, attempt, self._log_sink(req)))
            cancelled = asyncio.Event()
            heartbeat = asyncio.create_task(self._heartbeat(msg, req, lease, run, cancelled))
            try:
                outcome = await run
            except asyncio.CancelledError:
                if not cancelled.is_set():
                    raise  # shutdown, not the experiment's cancellation
                trial_dir = None
                with contextlib.suppress(Exception):
                    trial_dir = self._executor_trial_dir(req)
                await self._report_cancelled(msg, req, attempt, trial_dir)
                bound.info("trial cancelled")
                return
            finally:
                heartbeat.cancel()
            await self._settle(msg, req, attempt, outcome)
            bound.info("trial settled", outcome=outcome.kind, exception=outcome.exception_type)
        finally:
            if lease is not None and coord is not None:
                with contextlib.suppress(Exception):
                    await coord.release(lease)

    def _executor_trial_dir(self, req: TrialRequested) -> str | None:
        trial_dir = getattr(self._executor, "trial_dir_for", None)
        return str(trial_dir(req)) if callable(trial_dir) else None

    async def _report_cancelled(
        self, msg: Msg, req: TrialRequested, attempt: int, trial_dir: str | None
    ) -> None:
        await self._bus.publish(
            self._failed(
                req,
                attempt,
                ExecutionOutcome(
                    kind="failed",
                    exception_type="CancelledError",
                    message="experiment cancelled",
                ),
                final=True,
                failure_class="cancelled",
                trial_dir=trial_dir,
            )
        )
        await msg.ack_sync()

    async def _settle(
        self, msg: Msg, req: TrialRequested, attempt: int, outcome: ExecutionOutcome
    ) -> None:
        retry = req.retry
        retryable = is_retryable(outcome.exception_type) if outcome.exception_type else False
        if outcome.kind == "failed":
            retryable = retryable or outcome.exception_type == "MissingResult"
        if retryable and attempt < retry.max_attempts:
            delay = backoff_delay(attempt, retry.backoff_seconds, retry.max_backoff_seconds)
            await self._bus.publish(self._failed(req, attempt, outcome, final=False))
            await msg.nak(delay=delay)
            return
        if outcome.kind == "completed":
            assert outcome.trial_dir is not None and outcome.job_dir is not None
            await self._bus.publish(
                TrialCompleted(
                    experiment_id=req.experiment_id,
                    trial_id=req.trial_id,
                    correlation_id=req.correlation_id,
                    trial_dir=str(outcome.trial_dir),
                    job_dir=str(outcome.job_dir),
                    runner_host=self.host,
                    harbor_version=self._executor.version,
                    environment=req.compute.environment,
                    agent_label=req.agent.display,
                    attempt=attempt,
                    run_id=req.dedup_id(),
                )
            )
            self.state.completed += 1
        else:
            await self._bus.publish(self._failed(req, attempt, outcome, final=True))
            self.state.failed += 1
        await msg.ack_sync()

    def _failed(
        self,
        req: TrialRequested,
        attempt: int,
        outcome: ExecutionOutcome,
        *,
        final: bool,
        failure_class: FailureClass | None = None,
        trial_dir: str | None = None,
    ) -> TrialFailed:
        failure = failure_class or classify(outcome.exception_type)
        return TrialFailed(
            experiment_id=req.experiment_id,
            trial_id=req.trial_id,
            correlation_id=req.correlation_id,
            failure_class="infrastructure" if failure == "none" else failure,
            error_type=outcome.exception_type or "UnknownError",
            message=outcome.message or "",
            attempt=attempt,
            final=final,
            trial_dir=trial_dir or (str(outcome.trial_dir) if outcome.trial_dir else None),
            task=req.task,
            agent=req.agent,
            repetition=req.repetition,
            runner_host=self.host,
            run_id=req.dedup_id(),
        )

    async def _heartbeat(
        self,
        msg: Msg,
        req: TrialRequested,
        lease: Lease | None,
        run: asyncio.Task[ExecutionOutcome],
        cancelled: asyncio.Event,
    ) -> None:
        """Keep the message, and the experiment's slot, ours; stop a cancelled trial."""
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                await msg.in_progress()
                if lease is not None and self._coord is not None:
                    lease = await self._coord.renew(lease)
                if self._coord is not None and await self._coord.is_cancelled(
                    req.experiment_id, fresh=True
                ):
                    cancelled.set()
                    run.cancel()
                    return
            except Exception as exc:  # noqa: BLE001 - a missed beat is retried next tick
                log.warning("heartbeat failed", error=f"{type(exc).__name__}: {exc}")

    def _log_sink(self, req: TrialRequested) -> LogSink | None:
        if not self._publish_logs or self._nc_publish is None:
            return None
        publish = self._nc_publish
        subject = self.topology.log_subject(req.experiment_id, req.trial_id)

        async def sink(phase: str, stream: str, text: str) -> None:
            event = TrialLog(
                experiment_id=req.experiment_id,
                trial_id=req.trial_id,
                correlation_id=req.correlation_id,
                phase=phase,
                stream="stderr" if stream == "stderr" else "stdout",
                text=text[:16_000],
            )
            # Live logs are best effort (core publish into the logs stream): a lost
            # line must never slow or fail a trial. The full logs stay in the job folder.
            with contextlib.suppress(Exception):
                await publish(subject, event.model_dump_json().encode())

        return sink
