"""The runner's start path: from a work message taken to an attempt started, or not.

Written against the ports only (EventBus, Coordinator). For one work message
``Admission.admit``

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
   lacks (an environment, a label, an agent's key) is handed back for another live
   runner of the pool that has it, and ends at once (RunnerLacksCapability) when none
   has (services.runner.fit);
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
4. counts the start (Coordinator.begin_attempt) and publishes TrialStarted, returning
   that publish still in flight: the handler starts the Executor beside it and
   confirms it before any ending goes out (consumers see it first).

The endings of steps 2 and 3 go out the way every ending does (services.runner.endings).
The run itself and its outcome are services.runner.handlers.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any

from schemas.events import TrialRequested, TrialStarted
from services.common.errors import ACK, Settle, nak
from services.common.fit import Fit
from services.common.logging import get_logger
from services.common.ports import AttemptStart, Coordinator, EventBus, Lease
from services.runner import guards, policy
from services.runner.attempt import KeepAlive, acquire_kept_alive
from services.runner.endings import decode_ending, publish_decision
from services.runner.fair_share import FairShare, HeldBack
from services.runner.fit import Peers

log = get_logger(__name__)

# While an experiment's slots are all taken, a trial is handed back after a short
# random delay: spread out, the waiting trials do not poll the leases in lockstep.
SLOT_WAIT_S = (0.5, 2.0)
# A paused experiment's work is handed back for a few seconds, spread out: after a
# resume (the flag is cached for up to a second) its trials start within seconds.
PAUSE_WAIT_S = (2.0, 5.0)
# A trial this runner lacks something for is handed back after a few seconds: the
# runner of the pool that has it takes it meanwhile, or at its next turn.
HANDOFF_WAIT_S = (1.0, 3.0)


@dataclass(frozen=True)
class Admitted:
    """A trial cleared to run: its attempt, the slots it holds (none when no limit can
    bind; the caller gives them back) and its TrialStarted publish in flight."""

    start: AttemptStart
    leases: list[Lease]
    announced: asyncio.Task[bool]


@dataclass(eq=False)
class Admission:
    """Decides whether, and as which attempt, a trial starts on this runner."""

    bus: EventBus
    coordinator: Coordinator
    _: KW_ONLY
    runner_id: str
    host: str
    heartbeat_s: float
    admission: InitVar[int]
    """How many trials may be past delivery and not yet started at once."""
    fit: Fit
    """What this runner offers and holds (services.common.fit)."""
    peers: Peers | None
    """The other live runners, for a trial this one cannot run (None: it ends at once)."""
    rng: random.Random
    fair_share: FairShare | None
    _admission: asyncio.Semaphore = field(init=False)

    def __post_init__(self, admission: int) -> None:
        self._admission = asyncio.Semaphore(admission)

    async def admit(
        self, request: TrialRequested, keep_alive: KeepAlive, bound: Any
    ) -> Settle | Admitted:
        """Everything before the executor starts, at most ``admission`` trials at once.

        Returns the verdict of a message that is not to run here, or the trial cleared
        to run (module docstring, steps 1 to 4).
        """
        await acquire_kept_alive(self._admission, keep_alive, self.heartbeat_s)
        try:
            return await self._start(request, bound)
        finally:
            self._admission.release()

    async def _start(self, request: TrialRequested, bound: Any) -> Settle | Admitted:
        coord = self.coordinator
        # Cached reads first (no round trip while the cache is warm). A run that already
        # ended is caught below, or by publish_decision: it stores an ending only when
        # none is stored, and publishes the stored one otherwise.
        if await coord.is_cancelled(request.experiment_id):
            return await self._publish(request, policy.cancelled(request, 1, self.host), bound)
        if await coord.is_paused(request.experiment_id, trial_id=request.trial_id):
            # Neither started nor lost: no lease, no attempt counted, back in the queue.
            return nak(self.rng.uniform(*PAUSE_WAIT_S), "handback")
        capped = await guards.team_capped(coord, request)
        if capped is not None:
            # The team's spend cap: the trial waits unstarted like a paused one. The
            # runner does not set the pause flag: a runner's bus user may not touch
            # pause flags (it could then lift an operator's pause too).
            bound.warning("team spend quota reached: trial held back", reason=capped)
            return nak(self.rng.uniform(*PAUSE_WAIT_S), "handback")
        refused = await guards.refusal(coord, request, self.host)
        if refused is not None:  # its agent was stopped, or the budget is spent
            bound.warning("trial not started: its agent is stopped or the budget spent")
            return await self._publish(request, refused, bound)
        lack = self.fit.lack(request)
        if lack:
            missing = lack.describe(request)
            if self.peers is not None and await self.peers.another_can_run(request):
                # Neither started nor lost, no attempt counted: back in the queue for
                # the runner of the pool that has it.
                bound.info("trial left for another runner of the pool", lacks=missing)
                return nak(self.rng.uniform(*HANDOFF_WAIT_S), "handoff")
            decision = policy.lacking(request, self.host, lack, asked=self.peers is not None)
            bound.error("trial needs what no live runner of the pool has", lacks=missing)
            return await self._publish(request, decision, bound)
        mark = await self.fair_share.admit(request) if self.fair_share is not None else None
        if isinstance(mark, HeldBack):
            # Over its team's fair share while another team waits: back in the queue,
            # no attempt counted, like a full experiment lease.
            bound.debug("over fair share: trial handed back", reason=mark.reason)
            return nak(self.rng.uniform(*mark.wait_s), "handback")
        # The one read every delivery pays for "a run ends once", and the slots (with
        # a teamed trial's share mark), together.
        ended: bytes | None | BaseException
        lease: list[Lease] | bool | BaseException
        marked: Lease | None | BaseException
        if mark is None and not _needs_slot(request):
            # Nothing to take beside the read: no gather (a task per awaitable) for it.
            ended, lease, marked = await coord.ending(request.dedup_id()), True, None
        else:
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
            await self.give_back(held)
            if mark is not None and self.fair_share is not None:
                self.fair_share.released(mark)  # never taken, or given back above: uncounted
            if failed is not None:
                raise failed
        if isinstance(ended, bytes):
            fresh = await self.bus.publish(decode_ending(ended, request))
            bound.info("run had ended; its ending re-published, not run again", fresh=fresh)
            return ACK
        if lease is False:
            # The experiment's or the team's slots are all taken: back in the queue, no
            # attempt counted, like a pause.
            return nak(self.rng.uniform(*SLOT_WAIT_S), "handback")
        try:
            start = await coord.begin_attempt(request.dedup_id())
        except BaseException:
            await self.give_back(held)
            raise
        announced = asyncio.create_task(
            self.bus.publish(
                TrialStarted(
                    **policy.run_fields(request),
                    runner_id=self.runner_id,
                    host=self.host,
                    attempt=start.attempt,
                    handed_back=start.handed_back,
                    task_name=request.task.name,
                    agent_label=request.agent.display,
                    model=request.agent.model,
                )
            )
        )
        return Admitted(start, held, announced)

    async def _lease(self, request: TrialRequested) -> list[Lease] | bool:
        """The experiment's slot and the team's; True when neither is needed, False
        when one is not free (then none is held).

        The team's slot is taken only when the message carries a team concurrency
        quota: a trial of no such team pays nothing here. When both are needed they are
        taken together (one round trip of wall time)."""
        if not _needs_slot(request):
            return True
        team = request.team
        team_limit = team.max_concurrent_trials if team is not None else None
        wants_exp = request.limit_binds()
        if team is None or team_limit is None:
            lease = await self.coordinator.acquire(
                request.experiment_id, request.compute.n_concurrent_trials, self.runner_id
            )
            return False if lease is None else [lease]
        takes = [self.coordinator.acquire_team(team.name, team_limit, self.runner_id)]
        if wants_exp:
            takes.append(
                self.coordinator.acquire(
                    request.experiment_id, request.compute.n_concurrent_trials, self.runner_id
                )
            )
        got = await asyncio.gather(*takes, return_exceptions=True)
        held = [g for g in got if isinstance(g, Lease)]
        failed = next((g for g in got if isinstance(g, BaseException)), None)
        if failed is not None or len(held) < len(got):
            await self.give_back(held)
            if failed is not None:
                raise failed
            return False
        return held

    async def _mark(self, key: str | None) -> Lease | None:
        """Hold the share mark fair share asked for (None: none to hold)."""
        return None if key is None else await self.coordinator.mark_running(key, self.runner_id)

    async def give_back(self, leases: object) -> None:
        """Release the slots if any are held (share marks uncounted by fair share too);
        best effort, since a lease expires anyway."""
        if not isinstance(leases, list):
            return
        for lease in leases:
            if self.fair_share is not None and isinstance(lease, Lease):
                self.fair_share.released(lease.key)
            try:
                await self.coordinator.release(lease)
            except Exception as exc:  # noqa: BLE001 - the slot comes back with its TTL
                log.warning(
                    "lease not released; it frees with its TTL",
                    lease=lease.key,
                    error=f"{type(exc).__name__}: {exc}",
                )

    async def _publish(
        self, request: TrialRequested, decision: policy.Decision, bound: Any
    ) -> Settle:
        return await publish_decision(self.bus, self.coordinator, request, decision, bound)


def _needs_slot(request: TrialRequested) -> bool:
    """Whether a slot is taken for ``request`` (the experiment's limit binds, or its team
    has a concurrency quota): the one rule ``Admission._lease`` and its caller share."""
    team = request.team
    return request.limit_binds() or (team is not None and team.max_concurrent_trials is not None)
