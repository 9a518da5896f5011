"""Preemption and stop notices: the pure decisions, and the handler's hand-back.

The decisions (services/runner/preemption.py): which running trials a full runner
preempts for waiting higher-class work, and which cannot finish before a stop
notice's deadline. The hand-back (services/runner/handlers.py) with the in-memory
fakes: the attempt is stopped, recorded as a non-final ``cancelled`` TrialFailed
naming the reason, taken back (the next start is attempt 1 again, with its own dedup
id), and the message is nak'ed with no delay. When (services/runner/handback.py), over
a fake fetch loop: the watch preempts for waiting heavier work and owes it the slot,
and reads nothing while a slot is free; a stop notice stops at once what cannot finish
and the rest at the deadline. Each rule has its negative control.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schemas.events import TrialFailed, TrialRequested, TrialStarted, encode_event
from services.common.adapters.memory import InMemoryCoordinator, RecordingBus
from services.common.errors import ACK, Settle
from services.runner.handback import StopNotice, watch_preemption
from services.runner.handlers import TrialHandler
from services.runner.harbor_executor import SETUP_ALLOWANCE_S, task_time_bound
from services.runner.preemption import (
    Running,
    RunningTrial,
    cannot_finish,
    higher_classes,
    time_limit,
    victims,
)
from tests.unit.runner_support import (
    ScriptedExecutor,
    held_completion,
    make_request,
    trial_folders,
)

WEIGHTS = {"urgent": 8, "normal": 3, "batch": 1}


def trial(
    name: str,
    cls: str = "batch",
    *,
    preemptible: bool = True,
    started: float = 0.0,
    limit: float | None = None,
) -> RunningTrial:
    return RunningTrial(name, cls, preemptible, started, limit)


# -- which trial is preempted -----------------------------------------------------------


def test_the_lowest_class_goes_first_then_the_youngest() -> None:
    running = [
        trial("old-batch", started=1.0),
        trial("young-batch", started=5.0),
        trial("normal", "normal", started=9.0),
    ]
    chosen = victims(running, {"urgent": 1}, WEIGHTS, free_slots=0)
    assert [(t.run_id, c) for t, c in chosen] == [("young-batch", "urgent")]
    # Three urgent waiting: both batch trials (youngest first), then the normal one.
    chosen = victims(running, {"urgent": 3}, WEIGHTS, free_slots=0)
    assert [t.run_id for t, _ in chosen] == ["young-batch", "old-batch", "normal"]


def test_never_more_victims_than_waiting_messages_nor_while_a_slot_is_free() -> None:
    running = [trial(f"b{i}", started=float(i)) for i in range(4)]
    assert len(victims(running, {"urgent": 2}, WEIGHTS, free_slots=0)) == 2
    # Negative control: a free slot takes the waiting work without preempting.
    assert victims(running, {"urgent": 2}, WEIGHTS, free_slots=1) == []
    assert victims(running, {"urgent": 0}, WEIGHTS, free_slots=0) == []


def test_only_a_heavier_class_preempts_and_only_preemptible_trials() -> None:
    running = [trial("normal", "normal")]
    # normal is preempted for urgent, never for batch nor for normal itself.
    assert [t.run_id for t, _ in victims(running, {"urgent": 1}, WEIGHTS, 0)] == ["normal"]
    assert victims(running, {"batch": 5, "normal": 5}, WEIGHTS, 0) == []
    # Negative control: the same trial of an experiment that did not opt in.
    fixed = [trial("normal", "normal", preemptible=False)]
    assert victims(fixed, {"urgent": 1}, WEIGHTS, 0) == []


def test_trials_already_going_count_as_room_being_made() -> None:
    going = trial("going", started=1.0)
    assert going.hand_back("preempted")
    other = trial("other", started=2.0)
    # One urgent waiting, one batch trial already on its way out: nobody else goes.
    assert victims([going, other], {"urgent": 1}, WEIGHTS, 0) == []
    assert [t.run_id for t, _ in victims([going, other], {"urgent": 2}, WEIGHTS, 0)] == ["other"]


def test_which_classes_are_worth_a_look() -> None:
    assert higher_classes([trial("b")], WEIGHTS) == ["urgent", "normal"]
    assert higher_classes([trial("n", "normal"), trial("b")], WEIGHTS) == ["urgent", "normal"]
    assert higher_classes([trial("n", "normal")], WEIGHTS) == ["urgent"]
    # Negative control: nothing preemptible runs, nothing to read.
    assert higher_classes([trial("b", preemptible=False)], WEIGHTS) == []


def test_a_hand_back_is_asked_once_and_stops_a_bound_attempt() -> None:
    stops: list[str] = []
    t = trial("b")
    assert t.hand_back("stop_notice")
    assert not t.hand_back("preempted")  # the first reason stands
    t.bind(lambda: stops.append("stopped"))  # asked before the attempt was bound
    assert stops == ["stopped"] and t.reason == "stop_notice"


# -- which trial cannot finish before a stop notice's deadline ------------------------


def test_trials_that_cannot_finish_before_the_deadline() -> None:
    now, deadline = 100.0, 110.0
    running = [
        trial("unknown", started=99.0, limit=None),  # no time limit: assume it cannot
        trial("long", started=50.0, limit=70.0),  # ends at 120
        trial("short", started=95.0, limit=10.0),  # ends at 105: may finish
        trial("edge", started=90.0, limit=20.0),  # ends at 110: exactly in time
    ]
    assert [t.run_id for t in cannot_finish(running, now, deadline)] == ["unknown", "long"]
    # Negative control: with a later deadline, the long trial may finish too.
    assert [t.run_id for t in cannot_finish(running, now, 130.0)] == ["unknown"]


def test_an_executor_tells_its_time_limit_or_nothing() -> None:
    class Timed:
        def time_limit_s(self, request: TrialRequested) -> float | None:
            return 42.0

    assert time_limit(Timed(), make_request()) == 42.0
    assert time_limit(object(), make_request()) is None


# -- the handler hands a running trial back --------------------------------------------


def handler_of(
    executor: ScriptedExecutor,
    bus: RecordingBus,
    coord: InMemoryCoordinator,
    running: Running,
    **options: Any,
) -> TrialHandler:
    """runner-1's handler on node-a over these fakes; ``options``: further arguments."""
    return TrialHandler(
        bus,
        executor,
        coord,
        trial_folders(),
        runner_id="runner-1",
        host="node-a",
        heartbeat_s=30.0,
        running=running,
        **options,
    )


async def keep_alive() -> None:
    """The fetch loop's progress signal, a no-op: these tests need no redelivery bound."""
    return None


def preemptible_request() -> TrialRequested:
    request = make_request(max_attempts=1)
    compute = request.compute.model_copy(update={"preemptible": True, "priority_class": "batch"})
    return request.model_copy(update={"compute": compute})


async def test_a_handed_back_trial_is_recorded_uncounted_and_nakd_at_once(
    tmp_path: Path,
) -> None:
    executor = held_completion(tmp_path)
    bus, coord, running = RecordingBus(), InMemoryCoordinator(lease_ttl_s=60.0), Running()
    handler = handler_of(executor, bus, coord, running, rng=random.Random(7))
    request = preemptible_request()

    async def start() -> asyncio.Task[object]:
        task: asyncio.Task[object] = asyncio.create_task(
            handler.handle(encode_event(request), keep_alive)
        )
        await asyncio.wait_for(executor.running.wait(), 5)
        executor.running.clear()
        return task

    first = await start()
    (listed,) = running.snapshot()
    assert listed.priority_class == "batch" and listed.preemptible
    assert listed.hand_back("preempted")
    verdict = await asyncio.wait_for(first, 5)
    assert verdict == Settle("nak", 0.0, "handback")
    assert executor.was_cancelled and len(running) == 0
    failed = bus.of_type(TrialFailed)
    assert len(failed) == 1
    event = failed[0]
    assert (event.failure_class, event.error_type, event.final) == ("cancelled", "Preempted", False)
    assert event.message.startswith("preempted:") and event.attempt == 1

    # The start was taken back: with max_attempts 1, the trial still runs and completes
    # as attempt 1, its TrialStarted keeping a dedup id of its own.
    second = await start()
    executor.release.set()
    assert await asyncio.wait_for(second, 5) == ACK
    starts = bus.of_type(TrialStarted)
    assert [(s.attempt, s.handed_back) for s in starts] == [(1, 0), (1, 1)]
    assert bus.duplicates == []  # no event of the second start was dropped as a replay
    assert (await coord.begin_attempt(request.dedup_id())).attempt == 2


async def test_without_a_hand_back_the_attempt_counts(tmp_path: Path) -> None:
    """Negative control: a trial stopped by its experiment's cancellation is no
    hand-back; one that runs to the end counts its attempt."""
    executor = held_completion(tmp_path)
    coord, running = InMemoryCoordinator(lease_ttl_s=60.0), Running()
    handler = handler_of(executor, RecordingBus(), coord, running)
    request = preemptible_request()

    task = asyncio.create_task(handler.handle(encode_event(request), keep_alive))
    await asyncio.wait_for(executor.running.wait(), 5)
    executor.release.set()
    assert await asyncio.wait_for(task, 5) == ACK
    assert (await coord.begin_attempt(request.dedup_id())).attempt == 2


# -- when: the preemption watch and the stop notice, over a fake fetch loop ------------


class FakeSlots:
    """The fetch loop as the watch and the notice see it; trials are tasks that run
    until their attempt is stopped."""

    def __init__(self, free: int = 0, waiting: dict[str, int] | None = None) -> None:
        self.in_flight: set[asyncio.Task[None]] = set()
        self.free = free
        self.waiting = waiting or {}
        self.looks = 0
        self.reads = 0
        self.reserved: list[str] = []
        self.instead_of: list[str | None] = []
        self.looked = asyncio.Event()
        self._stopping = False

    @property
    def free_slots(self) -> int:
        self.looks += 1
        self.looked.set()
        return self.free

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def pending_of(self, names: Sequence[str]) -> dict[str, int]:
        self.reads += 1
        return {n: self.waiting.get(n, 0) for n in names}

    def reserve(self, name: str, instead_of: str | None = None) -> None:
        self.reserved.append(name)
        self.instead_of.append(instead_of)

    def stop(self) -> None:
        self._stopping = True

    async def drain(self, grace_s: float) -> None:
        self.stop()
        if self.in_flight:
            await asyncio.wait(set(self.in_flight), timeout=grace_s)

    def run(
        self, running: Running, trial: RunningTrial, stops: dict[str, float] | None = None
    ) -> asyncio.Event:
        """Start ``trial`` as a task that ends when its attempt is stopped (noting when
        in ``stops``)."""
        stopped = asyncio.Event()

        def stop() -> None:
            if stops is not None:
                stops[trial.run_id] = time.monotonic()
            stopped.set()

        trial.bind(stop)
        running.add(trial)

        async def attempt() -> None:
            await stopped.wait()
            running.remove(trial)

        task = asyncio.create_task(attempt())
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)
        return stopped


async def test_the_watch_preempts_for_waiting_heavier_work_and_owes_it_the_slot() -> None:
    slots, running = FakeSlots(free=0, waiting={"urgent": 1}), Running()
    victim = trial("victim", started=time.monotonic())
    fixed = trial("fixed", preemptible=False, started=time.monotonic())
    stopped = slots.run(running, victim)
    slots.run(running, fixed)
    watch = asyncio.create_task(watch_preemption(slots, running, WEIGHTS, every_s=0.01))
    await asyncio.wait_for(stopped.wait(), 5)
    assert victim.reason == "preempted" and fixed.reason is None
    assert slots.reserved == ["urgent"]
    assert slots.instead_of == [victim.priority_class]  # that class yields from now on
    slots.stop()
    await asyncio.wait_for(watch, 5)
    fixed.hand_back("stop_notice")  # ends the fake attempt


async def test_the_watch_reads_nothing_while_a_slot_is_free() -> None:
    """Negative control: a free slot (or no preemptible trial) costs no read."""
    slots, running = FakeSlots(free=1, waiting={"urgent": 5}), Running()
    victim = trial("victim", started=time.monotonic())
    slots.run(running, victim)
    watch = asyncio.create_task(watch_preemption(slots, running, WEIGHTS, every_s=0.01))
    while slots.looks < 5:
        slots.looked.clear()
        await asyncio.wait_for(slots.looked.wait(), 5)
    assert slots.reads == 0 and victim.reason is None
    slots.stop()
    await asyncio.wait_for(watch, 5)
    victim.hand_back("stop_notice")


async def test_a_stop_notice_hands_back_at_once_what_cannot_finish_the_rest_at_the_deadline() -> (
    None
):
    slots, running = FakeSlots(), Running()
    now = time.monotonic()
    unknown = trial("unknown", started=now, limit=None)
    # Says it ends in 0.05 s, but overruns: it may stay until the deadline, no later.
    overrun = trial("overrun", started=now, limit=0.05)
    stops: dict[str, float] = {}
    for t in (unknown, overrun):
        slots.run(running, t, stops)
    notice = StopNotice(slots, running, notice_s=1.0)
    notice.signal()
    assert slots.stopping
    await asyncio.wait_for(notice.finish(drain_grace_s=30), 5)
    assert notice.noticed_at is not None
    assert stops["unknown"] - notice.noticed_at < 0.5
    # Negative control: the trial that could finish was not stopped before the deadline.
    assert stops["overrun"] - notice.noticed_at >= 1.0
    assert (unknown.reason, overrun.reason) == ("stop_notice", "stop_notice")
    assert not slots.in_flight


# -- the Harbor executor's time limit --------------------------------------------------


def test_a_harbor_task_is_bounded_by_its_timeouts(tmp_path: Path) -> None:
    (tmp_path / "task.toml").write_text(
        "[agent]\ntimeout_sec = 100\n[verifier]\ntimeout_sec = 50\n"
        "[environment]\nbuild_timeout_sec = 30\n"
    )
    assert task_time_bound(tmp_path, 2.0) == (30 + 100 + 50) * 2.0 + SETUP_ALLOWANCE_S
    # Negative controls: no agent timeout, or no readable task.toml: unknown.
    (tmp_path / "task.toml").write_text("[verifier]\ntimeout_sec = 50\n")
    assert task_time_bound(tmp_path, 1.0) is None
    (tmp_path / "task.toml").write_text("[agent\n")
    assert task_time_bound(tmp_path, 1.0) is None


def test_a_limit_learnt_after_the_start_is_taken_by_a_refresh() -> None:
    learnt: list[float | None] = [None]
    t = RunningTrial("r", "batch", True, 0.0, None, limit_of=lambda: learnt[0])
    t.refresh_limit()
    assert t.time_limit_s is None
    learnt[0] = 30.0
    t.refresh_limit()
    assert t.time_limit_s == 30.0
