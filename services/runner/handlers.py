"""The runner's message handler: one TrialRequested in, events out, a verdict back.

Longer than 350 lines because the start path below is one sequence of decisions
(flags, guards, leases, attempt, verdict) that reads best in one place; the executor
run is in attempt.py, the outcome policy in policy.py, the guards in guards.py.

Written against the ports only (EventBus, Coordinator, Executor): the nats-py pull
loop that feeds it and applies its verdicts is services.runner.consumer. For one work
message the handler

1. waits for admission: at most ``admission`` handlers at once are between "message
   taken" and "executor started", so a burst of thousands waits here, its message
   kept alive, not in coordinator requests that time out into redeliveries;
2. checks the cached flags (no round trip while warm): a cancelled experiment's trial
   ends at once; a paused experiment's is handed back (nak, a few seconds' random delay)
   with no lease taken and no attempt counted, so paused work is neither started nor
   lost (docs/scheduling.md); a trial whose team reached its daily spend quota is held
   back the same way (``guards``; the pause flag stays the submitter's); a trial whose
   agent was stopped by a provider or whose budget is spent ends at once (final
   TrialFailed AgentStopped / BudgetExceeded, ``guards``); one needing what this runner
   does not offer ends at once (RunnerLacksCapability: its pool was chosen for runners
   that can, so this one is misconfigured);
3. hands back a trial whose team is over its fair share while another team waits
   (services.runner.fair_share: no round trip while its pool view is fresh; no slot,
   no attempt); then reads whether the run already ended and takes the experiment's
   concurrency slot (and a teamed trial's share mark), together (one round trip
   each, concurrent). A run that ended (its work message was
   redelivered after the ending was stored, e.g. the runner was killed between the
   publish and the ack) has its stored ending re-published (same dedup id, so JetStream
   drops it if it got through) and is acknowledged, without running or counting an
   attempt. No slot is taken when the limit cannot bind (the submission has no more
   trials than ``n_concurrent_trials``); a team concurrency quota carried by the message
   takes a team slot beside it (none otherwise); without a free slot the trial is handed
   back (nak, short random delay) so other experiments' trials keep flowing;
4. counts the start (Coordinator.next_attempt) and starts the Executor at once, with
   TrialStarted published beside it: confirmed before any ending goes out (consumers
   see it first); if it cannot be confirmed the run is stopped and handed back. A
   heartbeat keeps the message and the lease alive and stops the run when the
   experiment is cancelled;
5. stores the trial folder of an attempt that ends the run in the results bucket
   (``TrialFolders``: no disk is shared with the importer), publishes what
   ``policy.decide`` says, deletes the local folder, and returns its verdict. An ending (a
   TrialCompleted or a final TrialFailed, cancellations included) is stored with the
   coordinator first, then published, then acknowledged; if another runner stored
   one first (it ran the same message after ack_wait), that ending is published
   instead, so a run ends once (the endings of step 2 go the same way).

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
import random
import time
from collections.abc import Callable
from typing import Any

from schemas.events import (
    EventDecodeError,
    TrialCompleted,
    TrialFailed,
    TrialRequested,
    TrialStarted,
    encode_event,
    parse_event,
)
from services.common.errors import ACK, InternalError, Settle, nak, settle_error
from services.common.logging import get_logger
from services.common.pools import required_capabilities
from services.common.ports import AttemptStart, Coordinator, EventBus, Executor, Lease, LogSink
from services.common.priority import DEFAULT_CLASSES, PriorityClasses
from services.common.trial_folders import TrialFolders
from services.runner import guards, policy
from services.runner.attempt import KeepAlive, run_attempt
from services.runner.fair_share import FairShare, HeldBack
from services.runner.preemption import Reason, Running, RunningTrial, time_limit

log = get_logger(__name__)

LogSinks = Callable[[TrialRequested], LogSink | None]
"""Gives the live-output sink of a trial (None: live logs are off)."""

# A publish that could not be confirmed: hand the trial back, soon.
TRANSIENT_RETRY_DELAY_S = 5.0
# While an experiment's slots are all taken, a trial is handed back after a short
# random delay: spread out, the waiting trials do not poll the leases in lockstep.
SLOT_WAIT_S = (0.5, 2.0)
# A paused experiment's work is handed back for a few seconds, spread out: after a
# resume (the flag is cached for up to a second) its trials start within seconds.
PAUSE_WAIT_S = (2.0, 5.0)


def parse_work(data: bytes) -> TrialRequested:
    """Decode a work message; anything but a valid TrialRequested is poison."""
    event = parse_event(data)
    if not isinstance(event, TrialRequested):
        raise EventDecodeError(f"expected trial_requested, got {event.type}")
    return event


def decode_ending(data: bytes, request: TrialRequested) -> TrialCompleted | TrialFailed:
    """A run's stored ending; one that cannot be read is a bug, not the message's fault."""
    try:
        event = parse_event(data)
    except EventDecodeError as exc:
        raise InternalError(f"stored ending of run {request.dedup_id()} unreadable: {exc}") from exc
    if not isinstance(event, TrialCompleted | TrialFailed) or event.run_key != request.dedup_id():
        raise InternalError(f"stored ending of run {request.dedup_id()} is not this run's")
    return event


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
        offers: frozenset[str] | None = None,
        log_sinks: LogSinks | None = None,
        rng: random.Random | None = None,
        running: Running | None = None,
        classes: PriorityClasses | None = None,
        fair_share: FairShare | None = None,
    ) -> None:
        self._bus = bus
        self._executor = executor
        self._coord = coordinator
        self._folders = folders
        self.runner_id = runner_id
        self._who = policy.RunnerIdentity(host=host, harbor_version=executor.version)
        self._heartbeat_s = heartbeat_s
        self._admission = asyncio.Semaphore(admission)
        self._offers = offers
        self._log_sinks = log_sinks
        self._rng = rng or random.Random()
        # Where running trials are listed for preemption and stop notices (None: the
        # runner never hands a running trial back; services.runner.preemption).
        self._running = running
        self._classes = classes or PriorityClasses.parse(DEFAULT_CLASSES)
        self._fair = fair_share

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
        started = await self._admitted(request, keep_alive, bound)
        if isinstance(started, Settle):
            return started
        start, lease, announced = started
        attempt = start.attempt
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
            finally:
                if trial is not None and self._running is not None:
                    self._running.remove(trial)
            # TrialStarted went out beside the executor: it is confirmed before the ending
            # is stored or published, so consumers see it first.
            await announced
            if outcome is None and trial is not None and trial.reason is not None:
                return await self._hand_back(request, start, trial.reason, bound)
            if outcome is None:
                decision = policy.cancelled(request, attempt, self._who.host)
                verdict = await self._publish(request, decision, bound)
                bound.info("trial cancelled")
                return verdict
            await guards.account(self._coord, request, outcome, bound)  # spend; agent stops
            result = None
            if outcome.trial_dir is not None and not policy.should_retry(request, attempt, outcome):
                result = await self._folders.upload(request, attempt, outcome.trial_dir)
            decision = policy.decide(
                request, attempt, outcome, self._who, result, handed_back=start.handed_back
            )
            verdict = await self._publish(request, decision, bound)
            if outcome.trial_dir is not None:
                await self._folders.discard(outcome.trial_dir)
            bound.info("trial settled", outcome=outcome.kind, exception=outcome.exception_type)
            return verdict
        finally:
            if not announced.done():
                announced.cancel()
            elif not announced.cancelled():
                announced.exception()  # retrieved: its error, if any, is the verdict's
            await self._give_back(lease)

    async def _admitted(
        self, request: TrialRequested, keep_alive: KeepAlive, bound: Any
    ) -> Settle | tuple[AttemptStart, list[Lease], asyncio.Task[bool]]:
        """Everything before the executor starts, at most ``admission`` trials at once.

        Returns the verdict of a message that is not to run here, or the attempt, the
        leases held (none when no limit can bind) and the TrialStarted publish in flight.
        """
        await self._wait_for_admission(keep_alive)
        try:
            return await self._start(request, bound)
        finally:
            self._admission.release()

    async def _wait_for_admission(self, keep_alive: KeepAlive) -> None:
        """Take an admission slot, keeping the message alive while the burst drains."""
        while True:
            try:
                await asyncio.wait_for(self._admission.acquire(), self._heartbeat_s)
                return
            except TimeoutError:
                await keep_alive()

    async def _start(
        self, request: TrialRequested, bound: Any
    ) -> Settle | tuple[AttemptStart, list[Lease], asyncio.Task[bool]]:
        coord = self._coord
        # Cached reads first (no round trip while the cache is warm). A run that already
        # ended is caught below, or by _publish: it stores an ending only when none is
        # stored, and publishes the stored one otherwise.
        if await coord.is_cancelled(request.experiment_id):
            return await self._publish(request, policy.cancelled(request, 1, self._who.host), bound)
        if await coord.is_paused(request.experiment_id, trial_id=request.trial_id):
            # Neither started nor lost: no lease, no attempt counted, back in the queue.
            return nak(self._rng.uniform(*PAUSE_WAIT_S), "handback")
        capped = await guards.team_capped(coord, request)
        if capped is not None:
            # The team's spend cap: the trial waits unstarted like a paused one. The
            # runner does not set the pause flag: a runner's bus user may not touch
            # pause flags (it could then lift an operator's pause too).
            bound.warning("team spend quota reached: trial held back", reason=capped)
            return nak(self._rng.uniform(*PAUSE_WAIT_S), "handback")
        refused = await guards.refusal(coord, request, self._who.host)
        if refused is not None:  # its agent was stopped, or the budget is spent
            bound.warning("trial not started: its agent is stopped or the budget spent")
            return await self._publish(request, refused, bound)
        missing = self._missing(request)
        if missing:
            decision = policy.lacking(request, self._who.host, missing)
            bound.error("trial needs what this runner does not offer", missing=missing)
            return await self._publish(request, decision, bound)
        mark = await self._fair.admit(request) if self._fair is not None else None
        if isinstance(mark, HeldBack):
            # Over its team's fair share while another team waits: back in the queue,
            # no attempt counted, like a full experiment lease.
            bound.debug("over fair share: trial handed back", reason=mark.reason)
            return nak(self._rng.uniform(*mark.wait_s), "handback")
        # The one read every delivery pays for "a run ends once", and the slots (with
        # a teamed trial's share mark), together.
        ended, lease, marked = await asyncio.gather(
            coord.ending(request.dedup_id()),
            self._lease(request),
            self._mark(mark),
            return_exceptions=True,
        )
        held = [*(lease if isinstance(lease, list) else [])]
        held += [marked] if isinstance(marked, Lease) else []
        failed = next((r for r in (ended, lease, marked) if isinstance(r, BaseException)), None)
        if failed is not None or ended is not None or lease is False:
            await self._give_back(held)
            if mark is not None and self._fair is not None:
                self._fair.released(mark)  # never taken, or given back above: uncounted
            if failed is not None:
                raise failed
        if isinstance(ended, bytes):
            fresh = await self._bus.publish(decode_ending(ended, request))
            bound.info("run had ended; its ending re-published, not run again", fresh=fresh)
            return ACK
        if lease is False:
            # The experiment's or the team's slots are all taken: back in the queue, no
            # attempt counted, like a pause.
            return nak(self._rng.uniform(*SLOT_WAIT_S), "handback")
        try:
            start = await coord.begin_attempt(request.dedup_id())
        except BaseException:
            await self._give_back(held)
            raise
        announced = asyncio.create_task(
            self._bus.publish(
                TrialStarted(
                    experiment_id=request.experiment_id,
                    trial_id=request.trial_id,
                    correlation_id=request.correlation_id,
                    runner_id=self.runner_id,
                    host=self._who.host,
                    attempt=start.attempt,
                    handed_back=start.handed_back,
                    run_id=request.dedup_id(),
                )
            )
        )
        return start, held, announced

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

    async def _hand_back(
        self, request: TrialRequested, start: AttemptStart, reason: Reason, bound: Any
    ) -> Settle:
        """The runner stopped this attempt to hand the trial back (preemption, a stop
        notice): uncount the attempt, record why, and nak with no delay."""
        taken_back = await self._coord.take_back_attempt(request.dedup_id())
        decision = policy.handed_back(
            request, start.attempt, start.handed_back, self._who.host, reason
        )
        for event in decision.events:
            await self._bus.publish(event)
        bound.warning("trial handed back", reason=reason, taken_back=taken_back)
        return decision.settle

    async def _lease(self, request: TrialRequested) -> list[Lease] | bool:
        """The experiment's slot and the team's; True when neither is needed, False
        when one is not free (then none is held).

        The team's slot is taken only when the message carries a team concurrency
        quota: a trial of no such team pays nothing here. When both are needed they are
        taken together (one round trip of wall time)."""
        team = request.team
        team_limit = team.max_concurrent_trials if team is not None else None
        wants_exp = request.limit_binds()
        if team is None or team_limit is None:
            if not wants_exp:
                return True
            lease = await self._coord.acquire(
                request.experiment_id, request.compute.n_concurrent_trials, self.runner_id
            )
            return False if lease is None else [lease]
        takes = [self._coord.acquire_team(team.name, team_limit, self.runner_id)]
        if wants_exp:
            takes.append(
                self._coord.acquire(
                    request.experiment_id, request.compute.n_concurrent_trials, self.runner_id
                )
            )
        got = await asyncio.gather(*takes, return_exceptions=True)
        held = [g for g in got if isinstance(g, Lease)]
        failed = next((g for g in got if isinstance(g, BaseException)), None)
        if failed is not None or len(held) < len(got):
            await self._give_back(held)
            if failed is not None:
                raise failed
            return False
        return held

    async def _mark(self, key: str | None) -> Lease | None:
        """Hold the share mark fair share asked for (None: none to hold)."""
        return None if key is None else await self._coord.mark_running(key, self.runner_id)

    async def _give_back(self, leases: object) -> None:
        """Release the slots if any are held (share marks uncounted by fair share too);
        best effort, since a lease expires anyway."""
        if not isinstance(leases, list):
            return
        for lease in leases:
            if self._fair is not None and isinstance(lease, Lease):
                self._fair.released(lease.key)
            try:
                await self._coord.release(lease)
            except Exception as exc:  # noqa: BLE001 - the slot comes back with its TTL
                log.warning(
                    "lease not released; it frees with its TTL",
                    lease=lease.key,
                    error=f"{type(exc).__name__}: {exc}",
                )

    def _missing(self, request: TrialRequested) -> list[str]:
        if self._offers is None:
            return []
        return [c for c in required_capabilities(request.compute) if c not in self._offers]

    async def _publish(
        self, request: TrialRequested, decision: policy.Decision, bound: Any
    ) -> Settle:
        """Publish the decision's events; an ending is stored first (module docstring)."""
        events: tuple[TrialCompleted | TrialFailed, ...] = decision.events
        ending = decision.ending
        if ending is not None:
            data = encode_event(ending)
            stored = await self._coord.record_ending(request.dedup_id(), data)
            if stored != data:
                bound.warning("run already ended on another runner; publishing that ending")
                events = (decode_ending(stored, request),)
        for event in events:
            await self._bus.publish(event)
        return decision.settle
