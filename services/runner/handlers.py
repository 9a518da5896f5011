"""The runner's message handler: one TrialRequested in, events out, a verdict back.

Written against the ports only (EventBus, Coordinator, Executor): the nats-py pull
loop that feeds it and applies its verdicts is services.runner.consumer. The handler is
two halves around the executor run (services.runner.attempt):

- the start path, services.runner.admission: admission control, the cached flags
  (cancelled, paused, team spend cap), the guards (a stopped agent, a spent budget, a
  capability this runner lacks), fair share, the "run already ended" check, the
  experiment's and team's slots, the attempt counted and TrialStarted published;
- the settle path, here: the Executor starts at once, beside the TrialStarted publish,
  which is confirmed before any ending goes out (consumers see it first); if it
  cannot be confirmed the run is stopped and handed back. A heartbeat keeps the
  message and the lease alive and stops the run when the experiment is cancelled.
  The trial folder of an attempt that ends the run is stored in the results bucket
  (``TrialFolders``: no disk is shared with the importer), what ``policy.decide``
  says is published, and the verdict returned; the local folder is deleted beside
  (``discarded`` waits for it), so the slot is not held while it is. An ending
  is stored with the coordinator first, then published, then acknowledged, so a run
  ends once (services.runner.endings). At most ``endings`` trials (by default as many
  as admission lets start at once) are on this path together: thousands of trials
  ending at once would otherwise advance in lockstep on the loop, each round trip
  queued behind all the others', and every ending would go out at the end of the
  burst; bounded, they go out in order, and the importer records the first while
  the last are still being packed (docs/performance.md, capacity).

A running trial is listed (``running``, services.runner.preemption) so the runner may
hand it back: preempted for a waiting higher class, or by a stop notice. Its attempt
is then stopped through the cancel path, taken back (not counted), recorded as a
non-final ``cancelled`` TrialFailed naming the reason, and nak'ed with no delay.

``handle`` never raises except CancelledError (shutdown: the consumer hands the message
back). Every other failure becomes a verdict through ``settle_error``: poison is
terminated, a transient error and a bug are nak'ed (a bug later), never acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from schemas.events import EventDecodeError, TrialRequested, parse_event
from services.common.errors import Settle, settle_error
from services.common.failures import RUNNER_CRASHED
from services.common.fit import Fit
from services.common.logging import get_logger
from services.common.ports import Coordinator, EventBus, ExecutionOutcome, Executor, LogSink
from services.common.priority import DEFAULT_PRIORITY_CLASSES, PriorityClasses
from services.common.trial_folders import TrialFolders
from services.runner import guards, policy
from services.runner.admission import Admission
from services.runner.attempt import KeepAlive, acquire_kept_alive, run_attempt
from services.runner.endings import publish_decision
from services.runner.fair_share import FairShare
from services.runner.fit import Peers
from services.runner.preemption import Reason, Running, RunningTrial, time_limit

log = get_logger(__name__)

LogSinks = Callable[[TrialRequested], LogSink | None]
"""Gives the live-output sink of a trial (None: live logs are off)."""

# A publish that could not be confirmed: hand the trial back, soon.
TRANSIENT_RETRY_DELAY_S = 5.0


def parse_work(data: bytes) -> TrialRequested:
    """Decode a work message; anything but a valid TrialRequested is poison."""
    event = parse_event(data)
    if not isinstance(event, TrialRequested):
        raise EventDecodeError(f"expected trial_requested, got {event.type}")
    return event


def crashed(exc: Exception) -> ExecutionOutcome:
    """An attempt whose executor raised (a bug in the runner, its executor or Harbor's
    process plumbing, not a trial's own error): a failed attempt of type
    RunnerCrashedError, an infrastructure failure whatever the exception was called
    (never scored, never an agent's zero), retried as the request's retry policy
    allows, then final with the error named. Redelivered without end instead, as
    before, it re-ran the trial every 10 s, an LLM agent's spend with it, and its
    experiment never finished."""
    message = f"the runner's attempt crashed: {type(exc).__name__}: {exc} (see the runner's log)"
    return ExecutionOutcome(kind="failed", exception_type=RUNNER_CRASHED, message=message[:2000])


class TrialHandler:
    """Runs the trial of one work message to a verdict (see the module docstring)."""

    def __init__(
        self,
        bus: EventBus,
        executor: Executor,
        coordinator: Coordinator,
        folders: TrialFolders,
        *,
        runner_id: str,
        host: str,
        heartbeat_s: float,
        admission: int = 32,
        endings: int | None = None,
        fit: Fit | None = None,
        peers: Peers | None = None,
        log_sinks: LogSinks | None = None,
        rng: random.Random | None = None,
        running: Running | None = None,
        classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
        fair_share: FairShare | None = None,
    ) -> None:
        self._bus = bus
        self._executor = executor
        self._coord = coordinator
        self._folders = folders
        self.runner_id = runner_id
        self._host = host
        self._harbor_version = executor.version  # what its TrialCompleted events name
        self._heartbeat_s = heartbeat_s
        self._admission = Admission(
            bus,
            coordinator,
            runner_id=runner_id,
            host=host,
            heartbeat_s=heartbeat_s,
            admission=admission,
            fit=fit or Fit(),
            peers=peers,
            rng=rng or random.Random(),
            fair_share=fair_share,
        )
        self._endings = asyncio.Semaphore(endings or admission)  # module docstring
        self._log_sinks = log_sinks
        # Where running trials are listed for preemption and stop notices (None: the
        # runner never hands a running trial back; services.runner.preemption).
        self._running = running
        self._classes = classes
        # Set-aside folders waiting for deletion, and the one task deleting them.
        self._to_discard: list[Path] = []
        self._discarder: asyncio.Task[None] | None = None

    async def handle(self, data: bytes, keep_alive: KeepAlive, *, subject: str = "") -> Settle:
        """The verdict on one work message (``subject`` is only logged)."""
        bound: Any = log.bind(subject=subject) if subject else log
        try:
            request = parse_work(data)
            bound = bound.bind(trial_id=request.trial_id, experiment_id=request.experiment_id)
            return await self._run(request, keep_alive, bound)
        except asyncio.CancelledError:
            bound.warning("trial handed back")
            raise
        except Exception as exc:  # noqa: BLE001 - settle_error decides; nothing is acked
            verdict = settle_error(exc, transient_delay_s=TRANSIENT_RETRY_DELAY_S)
            if verdict.reason == "poison":
                bound.error("poison work message terminated", error=str(exc))
            elif verdict.reason == "transient":
                bound.warning("could not report trial; will be redelivered", error=str(exc))
            else:
                # A bug: JetStream redelivers the trial rather than lose it.
                bound.exception("runner error; trial will be redelivered")
            return verdict

    async def _run(self, request: TrialRequested, keep_alive: KeepAlive, bound: Any) -> Settle:
        request = await guards.current_limits(self._coord, request, bound)  # quota.limits
        admitted = await self._admission.admit(request, keep_alive, bound)
        if isinstance(admitted, Settle):
            return admitted
        start, lease, announced = admitted.start, admitted.leases, admitted.announced
        attempt = start.attempt
        this = policy.Attempt(request, start, self._host)
        bound = bound.bind(attempt=attempt)
        try:
            sink = self._log_sinks(request) if self._log_sinks is not None else None
            trial = self._track(request)
            try:
                outcome = await run_attempt(
                    self._executor.run(request, attempt, sink),
                    announced,
                    coordinator=self._coord,
                    experiment_id=request.experiment_id,
                    leases=lease,
                    keep_alive=keep_alive,
                    heartbeat_s=self._heartbeat_s,
                    bind_stop=trial.bind if trial is not None else None,
                )
            except Exception as exc:
                if settle_error(exc, transient_delay_s=0).reason != "bug":
                    raise  # NATS away, a poison message: the message's verdict says so
                bound.exception("the attempt crashed; counted as a failed attempt")
                outcome = crashed(exc)
            finally:
                if trial is not None and self._running is not None:
                    self._running.remove(trial)
            # TrialStarted went out beside the executor: it is confirmed before the ending
            # is stored or published, so consumers see it first.
            await announced
            if outcome is None and trial is not None and trial.reason is not None:
                return await self._hand_back(this, trial.reason, bound)
            if outcome is None:
                decision = policy.cancelled(request, attempt, self._host)
                verdict = await self._publish(request, decision, bound)
                bound.info("trial cancelled")
                return verdict
            async with self._ending_turn(keep_alive):
                await guards.account(self._coord, request, outcome, bound)  # spend; agent stops
                result = None
                retry = policy.should_retry(request, attempt, outcome)
                if outcome.trial_dir is not None and not retry:
                    result = await self._folders.upload(request, attempt, outcome.trial_dir)
                decision = policy.decide(this, outcome, self._harbor_version, result)
                verdict = await self._publish(request, decision, bound)
            if outcome.trial_dir is not None:
                self._discard_later(outcome.trial_dir)
            bound.info("trial settled", outcome=outcome.kind, exception=outcome.exception_type)
            return verdict
        finally:
            if not announced.done():
                announced.cancel()
            elif not announced.cancelled():
                announced.exception()  # retrieved: its error, if any, is the verdict's
            await self._admission.give_back(lease)

    @contextlib.asynccontextmanager
    async def _ending_turn(self, keep_alive: KeepAlive) -> AsyncIterator[None]:
        """A place among the ``endings`` trials settling at once; the message is kept
        alive while the trial waits for it."""
        await acquire_kept_alive(self._endings, keep_alive, self._heartbeat_s)
        try:
            yield
        finally:
            self._endings.release()

    def _discard_later(self, folder: Path) -> None:
        """Delete a settled trial's local folder off the slot's path: the slot is freed
        (the message acknowledged, the next trial fetched) while it is deleted. Called
        once the ending is published, so the folder is stored by then (or was never to
        be); a runner that dies before the deletion leaves the folder on disk, as a
        crash between publish and deletion always did."""
        # Renamed first, on the slot's path (one rename): a next attempt of the same
        # trial on this runner never meets a folder that is being deleted.
        aside = self._folders.set_aside(folder)
        if aside is None:
            return
        self._to_discard.append(aside)
        if self._discarder is None or self._discarder.done():
            self._discarder = asyncio.create_task(self._discard_pending())

    async def _discard_pending(self) -> None:
        """Delete the set-aside folders, all that have gathered per hand-off to a worker
        thread: a burst of endings costs the loop one hand-off (a future, a wake-up),
        not one per trial (docs/performance.md, pipeline)."""
        while self._to_discard:
            batch, self._to_discard = self._to_discard, []
            try:
                await self._folders.discard_all(batch)
            except Exception as exc:  # noqa: BLE001 - a cache left on disk loses nothing
                log.warning(
                    "could not delete trials' local folders",
                    folders=[str(f) for f in batch[:3]],
                    n=len(batch),
                    error=str(exc),
                )

    async def discarded(self) -> None:
        """Wait until the local folders of settled trials are deleted (a drain's last step)."""
        while self._discarder is not None and not self._discarder.done():
            await asyncio.gather(self._discarder, return_exceptions=True)

    def _track(self, request: TrialRequested) -> RunningTrial | None:
        """List the trial as running, for preemption and stop notices (None: not listed)."""
        if self._running is None:
            return None
        trial = RunningTrial(
            run_id=request.dedup_id(),
            priority_class=self._classes.resolve(request.compute.priority_class),
            preemptible=request.compute.preemptible,
            started=time.monotonic(),
            time_limit_s=time_limit(self._executor, request),
            limit_of=lambda: time_limit(self._executor, request),
        )
        self._running.add(trial)
        return trial

    async def _hand_back(self, attempt: policy.Attempt, reason: Reason, bound: Any) -> Settle:
        """The runner stopped this attempt to hand the trial back (preemption, a stop
        notice): uncount the attempt, record why, and nak with no delay."""
        taken_back = await self._coord.take_back_attempt(attempt.request.dedup_id())
        decision = policy.handed_back(attempt, reason)
        for event in decision.events:
            await self._bus.publish(event)
        bound.warning("trial handed back", reason=reason, taken_back=taken_back)
        return decision.settle

    async def _publish(
        self, request: TrialRequested, decision: policy.Decision, bound: Any
    ) -> Settle:
        """Publish the decision's events; an ending is stored first (services.runner.endings)."""
        return await publish_decision(self._bus, self._coord, request, decision, bound)
