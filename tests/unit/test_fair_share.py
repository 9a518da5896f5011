"""Fair share between teams: the rule (pure), the stored share, and the runner's view
(services/common/fair_share.py, services/runner/fair_share.py; docs/scheduling.md)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

import pytest

from schemas.events import TrialRequested, TrialStarted
from schemas.manifest import AgentSpec, ComputeSpec
from schemas.subjects import Topology
from services.common.adapters.memory import InMemoryCoordinator
from services.common.errors import ACK
from services.common.fair_share import (
    TeamShare,
    entitled,
    held_back,
    mark_key,
    marks_by_class,
    waiting,
)
from services.common.ports import Lease
from services.common.priority import PriorityClasses
from services.common.quotas import QuotaConfigError, parse_quotas
from services.runner.fair_share import (
    HAND_BACK_S,
    RETURNS_PER_S,
    FairShare,
    HeldBack,
    hand_back_span,
)
from services.runner.handlers import TrialHandler
from tests.support.work_requests import hello_file_request
from tests.unit.runner_support import ScriptedExecutor, completed, make_request
from tests.unit.test_runner_handlers import World, kinds

TOPO = Topology("fs")
CLASSES = PriorityClasses.parse("urgent=8,normal=3,batch=1", "normal")


def fill(shares: Mapping[str, float], running: dict[str, int], free: int) -> None:
    """Give ``free`` slots away as runners do: candidates in stream order (the first
    team's messages come first), each started unless the rule holds it back."""
    everyone = dict(shares)
    for _ in range(free):
        for team in shares:  # stream order: the first team's trials are delivered first
            if held_back(team, shares[team], running, everyone) is None:
                running[team] += 1
                break


def churn(shares: Mapping[str, float], slots: int, rounds: int, seed: int) -> list[dict[str, int]]:
    """Both teams always wait; a random running trial ends and its slot is refilled,
    ``rounds`` times: the running counts after each refill."""
    rng = random.Random(seed)
    running = dict.fromkeys(shares, 0)
    fill(shares, running, slots)
    seen = [dict(running)]
    for _ in range(rounds):
        ending = rng.choice([t for t, n in running.items() for _ in range(n)])
        running[ending] -= 1
        fill(shares, running, 1)
        seen.append(dict(running))
    return seen


def test_three_to_one_on_four_slots_settles_at_three_and_one() -> None:
    for counts in churn({"red": 3.0, "blue": 1.0}, 4, 200, seed=1):
        assert counts == {"red": 3, "blue": 1}


def test_shares_hold_within_one_slot_on_larger_pools() -> None:
    for shares, slots in (({"a": 3.0, "b": 1.0}, 10), ({"a": 2.0, "b": 1.0, "c": 1.0}, 9)):
        target = entitled(shares, slots)
        for counts in churn(shares, slots, 300, seed=2):
            assert sum(counts.values()) == slots
            for team, n in counts.items():
                assert abs(n - target[team]) <= 1, (shares, counts)


def test_negative_control_equal_shares_split_evenly_not_three_to_one() -> None:
    for counts in churn({"red": 1.0, "blue": 1.0}, 4, 100, seed=3):
        assert counts == {"red": 2, "blue": 2}  # ties start: 2 and 2, never 3 and 1


def test_a_team_alone_takes_every_slot() -> None:
    running = {"red": 7}
    assert held_back("red", 1.0, running, {"red": 1.0}) is None  # only itself waits
    assert held_back("red", 1.0, running, {}) is None
    # Another team with nothing queued does not count: it waits for nothing.
    assert waiting({"red": 12, "blue": 2}, {"red": 7, "blue": 2}) == {"red"}


def test_held_back_names_both_teams_and_their_shares() -> None:
    why = held_back("red", 3.0, {"red": 3, "blue": 0}, {"red": 3.0, "blue": 1.0})
    assert why is not None
    assert "team 'red' runs 3 at share 3" in why and "team 'blue' waits" in why
    # Control: one fewer red running and blue already running one: red may start.
    assert held_back("red", 3.0, {"red": 2, "blue": 1}, {"red": 3.0, "blue": 1.0}) is None


def test_team_share_round_trips_and_bad_values_are_no_team() -> None:
    share = TeamShare("t.x@y", 2.5)
    assert TeamShare.decode(share.encode()) == share
    for bad in (b"", b"{", b"[]", b'{"team": "red"}', b'{"team": "", "share": 1}',
                b'{"team": "red", "share": 0}', b'{"team": "red", "share": "nan"}'):  # fmt: skip
        assert TeamShare.decode(bad) is None, bad


def test_marks_count_per_class_and_team_of_one_pool() -> None:
    keys = {
        mark_key("gpu", "batch", "red", "run-1"): 1,
        mark_key("gpu", "batch", "red", "a.b=3Aretry"): 1,  # a run key of several tokens
        mark_key("gpu", "batch", "red", "run-2"): 1,
        mark_key("gpu", "urgent", "t.x@y", "run-3"): 1,
        mark_key("cpu", "batch", "red", "run-4"): 1,  # another pool
        mark_key("gpu", "batch", "blue", "run-5"): 0,  # released
        "exp-1.0": 1,  # an experiment lease
    }
    assert marks_by_class(keys, "gpu") == {("batch", "red"): 3, ("urgent", "t=2Ex=40y"): 1}


def test_quotas_file_share_default_and_refusal() -> None:
    quotas = parse_quotas("q.yaml", b"teams:\n  red: {share: 3}\n  blue: {}\n")
    assert quotas.share_of("red") == 3.0
    assert quotas.share_of("blue") == 1.0  # listed without a share: equal shares
    assert quotas.share_of("green") == 1.0  # not listed, no default
    assert parse_quotas("q", b"default: {share: 2}\n").share_of("green") == 2.0
    with pytest.raises(QuotaConfigError, match=r"q.yaml: teams.red.share"):
        parse_quotas("q.yaml", b"teams:\n  red: {share: 0}\n")


class FakeLoad:
    """The two bus counts, set by the test."""

    def __init__(self, coord: InMemoryCoordinator) -> None:
        self.work: dict[str, int] = {}
        self.coord = coord
        self.reads = 0

    async def work_counts(self, pool: str) -> dict[str, int]:
        self.reads += 1
        return dict(self.work)

    async def share_marks(self, pool: str) -> dict[str, int]:
        return self.coord.marks()


async def _setup(look_s: float = 0.0) -> tuple[InMemoryCoordinator, FakeLoad, FairShare]:
    """Red (share 3) has 20 batch trials queued; blue (share 1) is known but has none
    yet (the test queues its work when it wants blue waiting)."""
    coord = InMemoryCoordinator(lease_ttl_s=60)
    load = FakeLoad(coord)
    fair = FairShare(coord, load, TOPO, "default", CLASSES, look_s=look_s, confirm_s=look_s)
    await coord.set_share("exp-red", TeamShare("red", 3.0))
    await coord.set_share("exp-blue", TeamShare("blue", 1.0))
    load.work = {TOPO.work_subject("exp-red", "default", "batch"): 20}
    return coord, load, fair


BLUE = TOPO.work_subject("exp-blue", "default", "batch")


def _request(experiment_id: str, n: int) -> TrialRequested:
    return hello_file_request(
        f"{experiment_id}-t{n}",
        AgentSpec(name="nop"),
        experiment_id=experiment_id,
        correlation_id="c",
        compute=ComputeSpec(priority_class="batch"),
    )


async def _start(coord: InMemoryCoordinator, fair: FairShare, exp: str, n: int) -> Lease:
    key = await fair.admit(_request(exp, n))
    assert isinstance(key, str), key
    return await coord.mark_running(key, "r1")


async def test_runner_view_holds_back_the_team_over_its_share() -> None:
    coord, load, fair = await _setup()
    marks = [await _start(coord, fair, "exp-red", n) for n in range(5)]  # red alone: any
    load.work[BLUE] = 10  # blue waits now, none of it running
    held = await fair.admit(_request("exp-red", 5))
    assert isinstance(held, HeldBack) and "team 'blue' waits" in held.reason
    await _start(coord, fair, "exp-blue", 0)  # blue is furthest below its share
    # Two of red's end (3 left, blue 1: 3:1): red's next ties and may start.
    for mark in marks[:2]:
        await coord.release(mark)
        fair.released(mark.key)
    assert isinstance(await fair.admit(_request("exp-red", 6)), str)


async def test_runner_view_negative_controls_paused_rival_and_no_team() -> None:
    coord, load, fair = await _setup()
    for n in range(3):
        await _start(coord, fair, "exp-red", n)
    load.work[BLUE] = 10
    await coord.pause("exp-blue")  # blue's work waits for nothing: red is not held back
    assert isinstance(await fair.admit(_request("exp-red", 3)), str)
    await coord.resume("exp-blue")  # control: blue waits again, red is held back
    assert isinstance(await fair.admit(_request("exp-red", 4)), HeldBack)
    del load.work[BLUE]  # nothing of blue queued any more: red runs on
    assert isinstance(await fair.admit(_request("exp-red", 5)), str)
    # A trial of an experiment without a team reads no view and takes no mark.
    reads = load.reads
    assert await fair.admit(_request("exp-none", 0)) is None
    assert load.reads == reads


async def test_a_trial_id_with_dots_makes_one_mark_token() -> None:
    coord, _load, fair = await _setup()
    request = _request("exp-red", 0).model_copy(update={"trial_id": "task.v2__0001"})
    key = await fair.admit(request)
    assert isinstance(key, str)
    await coord.mark_running(key, "r1")
    assert marks_by_class(coord.marks(), "default") == {("batch", "red"): 1}


async def test_runner_counts_its_own_starts_between_looks() -> None:
    coord, load, fair = await _setup(look_s=3600.0)  # one look for the whole test
    load.work[BLUE] = 10
    await coord.mark_running(mark_key("default", "batch", "blue", "b0"), "r2")  # blue runs 1
    # Red's marks are never written: only the runner's own count stops red at 4
    # (3/3 ties blue's 1/1 and starts, 4/3 does not).
    started = [await fair.admit(_request("exp-red", n)) for n in range(5)]
    assert [isinstance(s, str) for s in started] == [True, True, True, True, False]
    assert load.reads == 1
    fair.released(str(started[0]))
    assert isinstance(await fair.admit(_request("exp-red", 9)), str)


async def test_the_handler_hands_back_a_trial_over_share_uncounted(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    load = FakeLoad(world.coord)
    fair = FairShare(world.coord, load, TOPO, "default", CLASSES, look_s=0.0)
    world.handler = TrialHandler(
        world.bus,
        world.executor,
        world.coord,
        world.folders,
        runner_id="runner-1",
        host="node-a",
        heartbeat_s=30.0,
        fair_share=fair,
    )
    await world.coord.set_share("exp-red", TeamShare("red", 3.0))
    await world.coord.set_share("exp-blue", TeamShare("blue", 1.0))
    load.work = {TOPO.work_subject("exp-red"): 10, TOPO.work_subject("exp-blue"): 5}
    red_marks = [
        await world.coord.mark_running(mark_key("default", "normal", "red", f"x{i}"), "r2")
        for i in range(4)
    ]
    red = make_request("red__0001", experiment_id="exp-red")
    for _ in range(2):  # red runs 4 while blue waits with none: back, as often as it comes
        verdict = await world.handle(red)
        assert verdict.action == "nak" and verdict.reason == "handback"
        assert HAND_BACK_S[0] <= verdict.delay_s <= HAND_BACK_S[1]  # red has 6 queued
    assert world.bus.published == [] and world.executor.calls == []
    # Blue starts, holding its mark while it runs, released at its end.
    assert await world.handle(make_request("blue__0001", experiment_id="exp-blue")) == ACK
    assert kinds(world.bus) == ["trial_started", "trial_completed"]
    assert set(world.coord.marks()) == {m.key for m in red_marks}
    # Control: two of red's end and blue runs one elsewhere (red 2/3 below blue's
    # 1/1): the same red message starts, as attempt 1.
    for mark in red_marks[:2]:
        await world.coord.release(mark)
    await world.coord.mark_running(mark_key("default", "normal", "blue", "y0"), "r2")
    assert await world.handle(red) == ACK
    assert [e.attempt for e in world.bus.of_type(TrialStarted) if e.trial_id == red.trial_id] == [1]


def test_a_deep_queue_comes_back_at_a_bounded_rate_not_all_at_once() -> None:
    # Q queued trials drawn uniformly over [lo, hi] return Q / mean a second.
    def returns_per_s(queued: int) -> float:
        lo, hi = hand_back_span(queued)
        return queued / ((lo + hi) / 2)

    for queued in (1_000, 10_000):
        assert returns_per_s(queued) == pytest.approx(RETURNS_PER_S)
    # A short queue keeps the short span: its team must not idle a freed slot for long.
    assert hand_back_span(6) == HAND_BACK_S
    assert hand_back_span(0) == HAND_BACK_S and hand_back_span(-3) == HAND_BACK_S
    # Negative control: the short span alone returns 10,000 trials 16,667 times a second.
    assert 10_000 / (sum(HAND_BACK_S) / 2) > 300 * RETURNS_PER_S


async def test_the_runner_widens_the_hand_back_of_a_team_with_a_deep_queue() -> None:
    coord, load, fair = await _setup()
    load.work[TOPO.work_subject("exp-red", "default", "batch")] = 2_000
    for n in range(3):
        await _start(coord, fair, "exp-red", n)
    load.work[BLUE] = 10
    held = await fair.admit(_request("exp-red", 3))
    # Red runs 3 of its 2,000 messages: 1,997 queued come back over about 80 s.
    assert isinstance(held, HeldBack) and held.wait_s == hand_back_span(1_997)
    assert held.wait_s[1] > 70
    # Control: with 6 messages (3 running, 3 queued) the span stays short.
    load.work[TOPO.work_subject("exp-red", "default", "batch")] = 6
    held = await fair.admit(_request("exp-red", 4))
    assert isinstance(held, HeldBack) and held.wait_s == HAND_BACK_S
