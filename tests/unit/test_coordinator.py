"""The Coordinator contract: leases with a limit and a TTL, attempt counters, cancel and pause
flags, run endings, agent stops, budgets and spend.

``CoordinatorContract`` holds the assertions; each adapter gets a subclass that
provides a ``world``. Here it runs against InMemoryCoordinator on a hand-driven clock;
tests/integration/test_coordinator_contract.py runs the same class against
NatsCoordinator on a real nats-server. Every invariant has its negative control.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from services.common.adapters import nats_kv
from services.common.adapters.memory import MAX_PROBES, InMemoryCoordinator
from services.common.fair_share import TeamShare
from services.common.ports import Coordinator, Lease, Spend
from services.common.quotas import Quotas, TeamQuota


@dataclass
class World:
    """Two runners' views of one shared coordination store.

    ``advance(seconds)`` lets time pass; ``expired(lease)`` returns once the lease's
    TTL has run out in the store (the real server expires keys on its own clock).
    """

    a: Coordinator
    b: Coordinator
    ttl_s: float
    advance: Callable[[float], Awaitable[None]]
    expired: Callable[[Lease], Awaitable[None]]

    async def a_holds(self, runner: str = "r1") -> Lease:
        """Runner a's lease on the one slot of experiment ``exp`` (asserted granted)."""
        lease = await self.a.acquire("exp", 1, runner)
        assert lease is not None
        return lease

    async def b_gets_the_slot(self) -> bool:
        """Whether runner b is granted the one slot of ``exp`` (it keeps the lease)."""
        return await self.b.acquire("exp", 1, "r2") is not None


@dataclass(frozen=True)
class Flag:
    """An experiment-wide flag of the coordinator: cancelled or paused."""

    setter: str
    lifter: str
    reader: str

    async def set(self, coordinator: Coordinator, experiment_id: str) -> None:
        await getattr(coordinator, self.setter)(experiment_id)

    async def lift(self, coordinator: Coordinator, experiment_id: str) -> None:
        await getattr(coordinator, self.lifter)(experiment_id)

    async def read(
        self, coordinator: Coordinator, experiment_id: str, *, fresh: bool = True
    ) -> bool:
        """Read as another runner would (``fresh``), or from the setter's own view."""
        seen: bool = await getattr(coordinator, self.reader)(experiment_id, fresh=fresh)
        return seen


CANCEL = Flag("cancel", "uncancel", "is_cancelled")
PAUSE = Flag("pause", "resume", "is_paused")


class CoordinatorContract:
    """Assertions every Coordinator adapter must pass (subclasses provide ``world``)."""

    async def test_the_limit_holds_across_runners(self, world: World) -> None:
        takers = [world.a, world.b] * 5
        leases = await asyncio.gather(*(c.acquire("exp", 3, f"r{i}") for i, c in enumerate(takers)))
        held = [lease for lease in leases if lease is not None]
        assert len(held) == 3
        assert len({lease.key for lease in held}) == 3
        assert await world.b.acquire("exp", 3, "late") is None
        # Negative control: releasing one slot lets exactly one more trial in.
        await world.a.release(held[0])
        assert await world.b.acquire("exp", 3, "late") is not None
        assert await world.a.acquire("exp", 3, "later") is None

    async def test_limits_are_per_experiment(self, world: World) -> None:
        assert await world.a.acquire("exp-1", 1, "r1") is not None
        assert await world.a.acquire("exp-1", 1, "r2") is None
        # Negative control: a full experiment leaves another one's slots alone.
        assert await world.b.acquire("exp-2", 1, "r2") is not None

    async def test_an_expired_lease_frees_its_slot(self, world: World) -> None:
        lease = await world.a_holds("dead-runner")
        # Negative control: while the TTL runs, the slot stays taken.
        await world.advance(world.ttl_s / 4)
        assert not await world.b_gets_the_slot()
        await world.expired(lease)
        assert await world.b_gets_the_slot()

    async def test_renewing_keeps_a_lease_past_its_ttl(self, world: World) -> None:
        lease = await world.a_holds()
        await world.advance(world.ttl_s * 0.6)
        renewed = await world.a.renew(lease)
        assert renewed.key == lease.key and renewed.revision > lease.revision
        await world.advance(world.ttl_s * 0.6)  # past the first write's TTL
        assert not await world.b_gets_the_slot()
        # Negative control: unrenewed, the same lease expires.
        await world.expired(renewed)
        assert await world.b_gets_the_slot()

    async def test_releasing_twice_or_after_expiry_is_harmless(self, world: World) -> None:
        lease = await world.a_holds()
        await world.a.release(lease)
        await world.a.release(lease)
        again = await world.b.acquire("exp", 1, "r2")
        assert again is not None and again.key == lease.key

    async def test_attempts_count_starts_per_run_across_runners(self, world: World) -> None:
        counts = await asyncio.gather(
            *(c.next_attempt("t1:resume:1") for c in [world.a, world.b] * 4)
        )
        assert sorted(counts) == list(range(1, 9))
        # Negative control: another run (a resumed re-run, a new trial) starts at 1.
        assert await world.b.next_attempt("t1") == 1
        assert await world.a.next_attempt("t2") == 1
        assert await world.a.next_attempt("t1") == 2

    async def test_a_start_taken_back_is_not_counted_and_is_told_apart(self, world: World) -> None:
        run = "t1:resume:2"
        first = await world.a.begin_attempt(run)
        assert (first.attempt, first.handed_back) == (1, 0)
        # Preempted: taken back by one runner, started again by the other as attempt 1,
        # told apart by the starts taken back before it.
        assert await world.a.take_back_attempt(run) == 1
        again = await world.b.begin_attempt(run)
        assert (again.attempt, again.handed_back) == (1, 1)
        # Racing starts and take-backs are each counted once (one key, compare-and-set).
        # Two more starts first: a take-back never counts below zero, so racing from 1
        # the two take-backs could land first and the second would be clamped.
        for _ in range(2):
            await world.b.begin_attempt(run)
        await asyncio.gather(
            *(c.begin_attempt(run) for c in [world.a, world.b] * 2),
            *(c.take_back_attempt(run) for c in [world.a, world.b]),
        )
        after = await world.a.begin_attempt(run)
        assert (after.attempt, after.handed_back) == (3 + 4 - 2 + 1, 3)
        # Negative control: without a take-back, the next start counts (attempt 2).
        assert (await world.b.begin_attempt("t9")).attempt == 1
        assert await world.a.next_attempt("t9") == 2

    async def test_a_run_ends_once_and_every_runner_sees_its_ending(self, world: World) -> None:
        run = "t1:resume:1"
        # Negative control: a run nobody ended has no ending.
        assert await world.b.ending(run) is None
        endings = [f'{{"runner": "{i}"}}'.encode() for i in range(8)]
        stored = await asyncio.gather(
            *(c.record_ending(run, e) for c, e in zip([world.a, world.b] * 4, endings, strict=True))
        )
        # Whoever raced, one ending was kept and every caller was told which.
        assert len(set(stored)) == 1 and stored[0] in endings
        assert await world.a.ending(run) == stored[0]
        assert await world.b.ending(run) == stored[0]
        assert await world.b.record_ending(run, b"late") == stored[0]
        # Other runs are untouched, and so is this run's attempt counter.
        assert await world.a.ending("t1") is None
        assert await world.b.record_ending("t1", b"mine") == b"mine"
        assert await world.a.next_attempt(run) == 1

    @pytest.mark.parametrize(
        ("flag", "other"),
        [(CANCEL, PAUSE), (PAUSE, CANCEL)],
        ids=["cancel", "pause"],
    )
    async def test_a_flag_is_seen_by_every_runner_and_can_be_lifted(
        self, world: World, flag: Flag, other: Flag
    ) -> None:
        # Negative control: nothing is flagged until someone sets the flag.
        assert not await flag.read(world.b, "exp")
        await flag.set(world.a, "exp")
        assert await flag.read(world.a, "exp", fresh=False)
        assert await flag.read(world.b, "exp")
        assert not await flag.read(world.b, "exp-other")
        # A pause is not a cancellation (runners hand paused work back, not end it), and
        # a cancellation is not a pause.
        assert not await other.read(world.b, "exp")
        await flag.lift(world.a, "exp")
        assert not await flag.read(world.a, "exp", fresh=False)
        assert not await flag.read(world.b, "exp")
        await flag.lift(world.b, "never-flagged")

    async def test_one_trial_paused_is_seen_by_every_runner_and_lifted(self, world: World) -> None:
        # Negative control: no trial is paused until someone pauses it.
        assert not await world.b.is_paused("exp", trial_id="t1", fresh=True)
        await world.a.pause_trial("exp", "t1")
        await world.a.pause_trial("exp", "t2")
        await world.b.pause_trial("exp", "t1")  # twice: still one entry
        assert await world.b.is_paused("exp", trial_id="t1", fresh=True)
        assert await world.a.paused_trials("exp", fresh=True) == {"t1", "t2"}
        # Only that trial: its siblings, the experiment itself and other experiments run.
        assert not await world.b.is_paused("exp", trial_id="t3", fresh=True)
        assert not await world.b.is_paused("exp", fresh=True)
        assert not await world.b.is_paused("exp-other", trial_id="t1", fresh=True)
        # The experiment's pause covers every trial, and lifting it keeps the trial's.
        await world.a.pause("exp")
        assert await world.b.is_paused("exp", trial_id="t3", fresh=True)
        await world.a.resume("exp")
        assert await world.b.is_paused("exp", trial_id="t1", fresh=True)
        assert await world.b.resume_trial("exp", "t1") is True
        assert await world.a.resume_trial("exp", "t1") is False  # was not paused any more
        assert not await world.a.is_paused("exp", trial_id="t1", fresh=True)
        assert await world.b.paused_trials("exp", fresh=True) == {"t2"}
        assert await world.b.resume_trial("exp", "t2") is True
        assert await world.a.paused_trials("exp", fresh=True) == frozenset()

    async def test_an_agent_stop_is_seen_by_every_runner_and_lifted(self, world: World) -> None:
        # Negative control: no agent is stopped until a runner stops it.
        assert await world.b.agent_stop("exp", "agent1", fresh=True) is None
        assert await world.a.stop_agent("exp", "agent1", b"first") == b"first"
        # The first reason wins; the second runner is told the stored one.
        assert await world.b.stop_agent("exp", "agent1", b"second") == b"first"
        assert await world.b.agent_stop("exp", "agent1", fresh=True) == b"first"
        # Per experiment and agent.
        assert await world.b.agent_stop("exp", "agent2", fresh=True) is None
        assert await world.b.agent_stop("exp-other", "agent1", fresh=True) is None
        await world.a.clear_agent_stops("exp", ["agent1", "agent2"])
        assert await world.b.agent_stop("exp", "agent1", fresh=True) is None
        # Lifted, it can be stopped again (with a new reason).
        assert await world.b.stop_agent("exp", "agent1", b"again") == b"again"
        assert await world.a.agent_stop("exp", "agent1", fresh=True) == b"again"

    async def test_budgets_and_spend_are_shared(self, world: World) -> None:
        assert await world.b.budget("exp", fresh=True) is None
        await world.a.set_budget("exp", b'{"max_tokens": 10}')
        assert await world.b.budget("exp", fresh=True) == b'{"max_tokens": 10}'
        assert await world.b.budget("exp-other", fresh=True) is None
        await world.a.set_budget("exp", None)
        assert await world.b.budget("exp", fresh=True) is None
        # Totals add up across runners, also when they add at the same time.
        assert await world.a.spent("exp", fresh=True) == Spend()
        one = Spend(cost_usd=0.25, tokens=100, attempts=1, unpriced=0)
        unpriced = Spend(tokens=10, attempts=1, unpriced=1)
        await asyncio.gather(
            *(
                c.add_spend("exp", s)
                for c, s in [(world.a, one), (world.b, one), (world.a, unpriced)]
            )
        )
        total = await world.b.spent("exp", fresh=True)
        assert total == Spend(cost_usd=0.5, tokens=210, attempts=3, unpriced=1)
        assert await world.a.spent("exp-other", fresh=True) == Spend()

    async def test_team_slots_hold_across_runners_beside_the_experiments(
        self, world: World
    ) -> None:
        takers = [world.a, world.b] * 4
        leases = await asyncio.gather(
            *(c.acquire_team("red.team@x", 3, f"r{i}") for i, c in enumerate(takers))
        )
        held = [lease for lease in leases if lease is not None]
        assert len(held) == 3
        assert all(lease.key.startswith("_team.red=2Eteam=40x.") for lease in held)
        # Negative controls: another team, and an experiment of the same name, have
        # slots of their own; a released team slot lets exactly one more in.
        assert await world.b.acquire_team("blue", 3, "r") is not None
        assert await world.b.acquire("red", 1, "r") is not None
        assert await world.a.acquire_team("red.team@x", 3, "late") is None
        await world.b.release(held[0])
        assert await world.a.acquire_team("red.team@x", 3, "late") is not None
        assert await world.b.acquire_team("red.team@x", 3, "later") is None

    async def test_team_tallies_count_to_their_limit_across_processes(self, world: World) -> None:
        assert await world.a.tally("trials", "red", fresh=True) == 0.0
        # Five submitters race for 10 trials per day, 3 each: exactly three pass.
        got = await asyncio.gather(
            *(c.add_tally("trials", "red", 3, limit=10) for c in [world.a, world.b] * 2 + [world.a])
        )
        assert sorted(added for added, _ in got) == [False, False, True, True, True]
        assert await world.b.tally("trials", "red", fresh=True) == 9.0
        # Giving back is counted too; another team's tally is its own.
        assert await world.b.add_tally("trials", "red", -2) == (True, 9.0)
        assert await world.a.tally("trials", "red", fresh=True) == 7.0
        assert await world.a.tally("trials", "blue", fresh=True) == 0.0
        assert await world.a.add_tally("spend", "red", 0.5) == (True, 0.0)
        assert await world.b.tally("spend", "red", fresh=True) == 0.5

    async def test_an_experiments_share_and_share_marks_are_shared(self, world: World) -> None:
        # Negative control: an experiment submitted without a team has no share.
        assert await world.b.share_of("exp", fresh=True) is None
        await world.a.set_share("exp", TeamShare("red", 3.0))
        assert await world.b.share_of("exp", fresh=True) == TeamShare("red", 3.0)
        await world.a.set_share("exp", None)  # resubmitted without a team
        assert await world.b.share_of("exp", fresh=True) is None
        # A mark is a lease of the run's own key (one put, no probing), renewed and
        # released like any lease, by any runner, harmlessly twice.
        key = "_share.default.normal.red.run-1"
        mark = await world.a.mark_running(key, "r1")
        assert mark.key == key and (await world.a.renew(mark)).key == key
        await world.b.release(mark)
        await world.a.release(mark)

    async def test_published_team_limits_are_shared_and_replaced_whole(self, world: World) -> None:
        # Negative control: nothing published yet, so runners keep the message's copy.
        assert await world.b.team_limits(fresh=True) is None
        red = Quotas(teams={"red": TeamQuota(max_concurrent_trials=2)}, default=None)
        await world.a.set_team_limits(red)
        seen = await world.b.team_limits(fresh=True)
        assert seen is not None and seen.for_team("red") == TeamQuota(max_concurrent_trials=2)
        # Published again without red (and with a default): red's entry is gone.
        await world.a.set_team_limits(Quotas(teams={}, default=TeamQuota(max_spend_usd_per_day=1)))
        seen = await world.b.team_limits(fresh=True)
        assert seen is not None and seen.for_team("red") == TeamQuota(max_spend_usd_per_day=1)
        assert seen.teams == {}


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TestInMemoryCoordinator(CoordinatorContract):
    """The contract against the fake, on a hand-driven clock."""

    @pytest.fixture
    def world(self) -> World:
        clock = Clock()
        shared = InMemoryCoordinator(lease_ttl_s=60.0, clock=clock)

        async def advance(seconds: float) -> None:
            clock.now += seconds

        async def expired(lease: Lease) -> None:
            clock.now += 60.0

        return World(shared, shared, 60.0, advance, expired)


def test_the_fake_probes_as_many_slots_as_the_real_adapter() -> None:
    assert nats_kv.MAX_PROBES == MAX_PROBES
