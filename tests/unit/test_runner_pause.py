"""The runner's handler on a paused experiment (docs/scheduling.md), with the fakes.

A paused experiment's work message is handed back (nak, a few seconds' random delay)
without a lease or a counted attempt; a running trial is not stopped by a pause; a
cancellation wins over a pause. Each invariant has its negative control.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from schemas.events import TrialFailed, TrialStarted
from services.common.errors import ACK
from services.runner.admission import PAUSE_WAIT_S
from tests.unit.runner_support import (
    ScriptedExecutor,
    completed,
    failed,
    held_completion,
    make_request,
)
from tests.unit.test_runner_handlers import World, kinds


async def test_paused_work_is_handed_back_unstarted_and_uncounted(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    req = make_request(limit=1)
    await world.coord.pause(req.experiment_id)
    for _ in range(3):  # handed back as often as it comes, never started
        verdict = await world.handle(req)
        assert verdict.action == "nak" and verdict.reason == "handback"
        assert PAUSE_WAIT_S[0] <= verdict.delay_s <= PAUSE_WAIT_S[1]
    assert world.bus.published == [] and world.executor.calls == []
    # No slot was taken: another runner's trial of the experiment can have it.
    assert world.coord.holders(req.experiment_id) == []
    # Negative control: resumed, the same message runs, as attempt 1 (the hand-backs
    # did not count).
    await world.coord.resume(req.experiment_id)
    assert await world.handle(req) == ACK
    assert kinds(world.bus) == ["trial_started", "trial_completed"]
    assert [e.attempt for e in world.bus.of_type(TrialStarted)] == [1]


async def test_the_hand_back_delays_are_spread(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    req = make_request()
    await world.coord.pause(req.experiment_id)
    delays = {(await world.handle(req)).delay_s for _ in range(5)}
    assert len(delays) == 5  # not in lockstep: each waiting message polls at its own time


async def test_a_pause_leaves_other_experiments_alone(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    await world.coord.pause("exp-other")
    assert await world.handle(make_request()) == ACK
    assert kinds(world.bus) == ["trial_started", "trial_completed"]


async def test_a_running_trial_finishes_when_its_experiment_is_paused(tmp_path: Path) -> None:
    executor = held_completion(tmp_path)
    world = World(executor, heartbeat_s=0.01)
    req = make_request()
    task = await world.start(req)
    await world.coord.pause(req.experiment_id)
    await world.keep_alive.beats(3)  # heartbeats ran with the flag set
    assert not task.done() and not executor.was_cancelled
    executor.release.set()
    assert await asyncio.wait_for(task, 10) == ACK
    assert kinds(world.bus) == ["trial_started", "trial_completed"]


async def test_a_cancellation_wins_over_a_pause() -> None:
    world = World(ScriptedExecutor(lambda r, a: failed(None)))
    req = make_request()
    await world.coord.pause(req.experiment_id)
    await world.coord.cancel(req.experiment_id)
    # Cancelled and paused: the run ends (cancelled record), it does not wait forever.
    assert await world.handle(req) == ACK
    (event,) = world.bus.of_type(TrialFailed)
    assert (event.failure_class, event.final) == ("cancelled", True)
    assert world.executor.calls == []


async def test_one_paused_trial_is_handed_back_while_its_siblings_run(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    held, sibling = make_request("hello__0001"), make_request("hello__0002")
    await world.coord.pause_trial(held.experiment_id, held.trial_id)
    verdict = await world.handle(held)
    assert verdict.action == "nak" and verdict.reason == "handback"
    assert PAUSE_WAIT_S[0] <= verdict.delay_s <= PAUSE_WAIT_S[1]
    assert world.bus.published == [] and world.coord.holders(held.experiment_id) == []
    # Control: the sibling trial of the same experiment runs.
    assert await world.handle(sibling) == ACK
    assert [e.trial_id for e in world.bus.of_type(TrialStarted)] == ["hello__0002"]
    # Resumed, the held trial runs as attempt 1 (the hand-back did not count).
    await world.coord.resume_trial(held.experiment_id, held.trial_id)
    assert await world.handle(held) == ACK
    started = [(e.trial_id, e.attempt) for e in world.bus.of_type(TrialStarted)]
    assert started == [("hello__0002", 1), ("hello__0001", 1)]
