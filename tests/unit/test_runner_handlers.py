"""The runner's handler against the in-memory fakes: events published, verdicts, leases.

Each test drives ``TrialHandler.handle`` with a real encoded work message, a
RecordingBus, an InMemoryCoordinator and a scripted executor, and checks what a
JetStream consumer would see: the events on the bus and the verdict on the message.
Tests wait on events (the executor running, the handler's result), never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from schemas.events import (
    Envelope,
    ExperimentSubmitted,
    TrialCompleted,
    TrialFailed,
    TrialRequested,
    TrialStarted,
    encode_event,
)
from schemas.objects import ObjectRef
from schemas.runners import RunnerInfo
from services.common.adapters.memory import InMemoryCoordinator, RecordingBus
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.adapters.memory_registry import MemoryRunnerRegistry
from services.common.errors import ACK, TERM, Settle, TransientError
from services.common.fit import Fit
from services.common.ports import AttemptStart, ExecutionOutcome, LogSink
from services.common.trial_folders import DISCARDING_PREFIX, TrialFolders, sweep_set_aside
from services.common.unpack import unpack_trial
from services.runner.admission import SLOT_WAIT_S
from services.runner.fit import Peers
from services.runner.handlers import TrialHandler
from tests.unit.runner_support import (
    ScriptedExecutor,
    completed,
    failed,
    held_completion,
    make_request,
    trial_folders,
)

RETRYABLE = "EnvironmentStartTimeoutError"


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class KeepAlive:
    """Counts in_progress() calls; ``beat`` is set after each."""

    def __init__(self) -> None:
        self.count = 0
        self.beat = asyncio.Event()

    async def __call__(self) -> None:
        self.count += 1
        self.beat.set()

    async def beats(self, n: int) -> None:
        while self.count < n:
            self.beat.clear()
            await self.beat.wait()


class World:
    """One runner's handler over shared fakes."""

    def __init__(
        self,
        executor: ScriptedExecutor,
        *,
        heartbeat_s: float = 30.0,
        ttl_s: float = 60.0,
        coord: InMemoryCoordinator | None = None,
        bus: RecordingBus | None = None,
        runner_id: str = "runner-1",
        admission: int = 32,
        fit: Fit | None = None,
        peers: Peers | None = None,
    ) -> None:
        self.clock = Clock()
        self.bus = bus or RecordingBus()
        self.coord = coord or InMemoryCoordinator(lease_ttl_s=ttl_s, clock=self.clock)
        self.executor = executor
        self.sinks: list[TrialRequested] = []
        self.folders = trial_folders()
        self.handler = TrialHandler(
            self.bus,
            executor,
            self.coord,
            self.folders,
            runner_id=runner_id,
            host="node-a",
            heartbeat_s=heartbeat_s,
            admission=admission,
            fit=fit,
            peers=peers,
            log_sinks=self._sink_for,
            rng=random.Random(7),
        )
        self.keep_alive = KeepAlive()

    def _sink_for(self, request: TrialRequested) -> LogSink:
        self.sinks.append(request)

        async def sink(phase: str, stream: str, text: str) -> None:
            return None

        return sink

    async def handle(self, request: TrialRequested | bytes) -> Settle:
        data = request if isinstance(request, bytes) else encode_event(request)
        return await self.handler.handle(data, self.keep_alive, subject="p.work.exp-1")

    async def start(self, request: TrialRequested) -> asyncio.Task[Settle]:
        """Handle ``request`` in a task of its own, returned once the executor runs it
        (an executor that blocks, e.g. ``held_completion``, keeps it running)."""
        task = asyncio.create_task(self.handle(request))
        await self.executor.running.wait()
        return task


def kinds(bus: RecordingBus) -> list[str]:
    return [getattr(e, "type") for e in bus.published]  # noqa: B009 - Envelope has no tag


async def test_a_trial_runs_reports_and_is_acked(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    req = make_request()
    assert await world.handle(req) == ACK
    assert kinds(world.bus) == ["trial_started", "trial_completed"]
    started, done = world.bus.published
    assert isinstance(started, TrialStarted) and isinstance(done, TrialCompleted)
    assert (started.attempt, started.runner_id, started.host) == (1, "runner-1", "node-a")
    # It names the task and the agent, for live views (the model: none in the manifest).
    assert (started.task_name, started.agent_label, started.model) == ("hello", "oracle", None)
    assert (done.attempt, done.harbor_version, done.run_id) == (1, "9.9.9", req.dedup_id())
    assert done.task == req.task  # the archive that ran, for the record and a retry
    # The live-log sink was built for this trial and handed to the executor.
    assert world.sinks == [req]
    assert world.executor.calls[0][2] is not None
    # The slot is free again once the trial is settled.
    assert world.coord.holders(req.experiment_id) == []


async def test_without_a_free_slot_the_trial_is_handed_back_unstarted(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    req = make_request(limit=1)
    other = await world.coord.acquire(req.experiment_id, 1, "runner-2")
    assert other is not None
    verdict = await world.handle(req)
    assert verdict.action == "nak" and verdict.reason == "handback"
    assert SLOT_WAIT_S[0] <= verdict.delay_s <= SLOT_WAIT_S[1]
    assert world.bus.published == [] and world.executor.calls == []
    # Negative control: once the slot is free the same message runs, as attempt 1
    # (the hand-back did not count as an attempt).
    await world.coord.release(other)
    assert await world.handle(req) == ACK
    assert [e.attempt for e in world.bus.of_type(TrialStarted)] == [1]


async def test_another_experiments_slots_do_not_block(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    assert await world.coord.acquire("exp-other", 1, "runner-2") is not None
    assert await world.handle(make_request(limit=1)) == ACK


async def test_retries_count_attempts_until_the_policy_gives_up() -> None:
    world = World(ScriptedExecutor(lambda r, a: failed(RETRYABLE)))
    req = make_request(max_attempts=3, backoff_s=1.0)
    verdicts = [await world.handle(req) for _ in range(3)]
    assert [(v.action, v.delay_s) for v in verdicts] == [("nak", 1.0), ("nak", 2.0), ("ack", 0.0)]
    failures = world.bus.of_type(TrialFailed)
    assert [(f.attempt, f.final) for f in failures] == [(1, False), (2, False), (3, True)]
    assert [a for _, a, _ in world.executor.calls] == [1, 2, 3]
    # Negative control: a result that needs no retry is final on the first attempt.
    clean = World(ScriptedExecutor(lambda r, a: failed("AgentTimeoutError")))
    assert await clean.handle(req) == ACK
    assert [(f.attempt, f.final) for f in clean.bus.of_type(TrialFailed)] == [(1, True)]


async def test_a_cancelled_experiment_is_not_started() -> None:
    world = World(ScriptedExecutor(lambda r, a: failed(None)))
    req = make_request()
    await world.coord.cancel(req.experiment_id)
    assert await world.handle(req) == ACK
    assert kinds(world.bus) == ["trial_failed"]
    (event,) = world.bus.of_type(TrialFailed)
    assert (event.failure_class, event.attempt, event.final) == ("cancelled", 1, True)
    assert world.executor.calls == []
    # The cancellation ended the run: redelivered after the lift, the same work
    # message re-publishes it (deduped) rather than running.
    await world.coord.uncancel(req.experiment_id)
    assert await world.handle(req) == ACK
    assert world.executor.calls == [] and world.bus.duplicates == [event.dedup_id()]
    # Negative control: lifted, a new run of the trial (a resubmission's re-run) runs.
    await world.handle(req.model_copy(update={"run_id": f"{req.trial_id}:resume:abc"}))
    assert len(world.executor.calls) == 1


async def test_cancellation_stops_a_running_trial(tmp_path: Path) -> None:
    executor = held_completion(tmp_path)
    world = World(executor, heartbeat_s=0.01)
    req = make_request()
    task = await world.start(req)
    await world.keep_alive.beats(1)
    # Negative control: heartbeats alone do not stop the trial.
    assert not task.done() and not executor.was_cancelled
    await world.coord.cancel(req.experiment_id)
    assert await asyncio.wait_for(task, 10) == ACK
    assert executor.was_cancelled
    assert kinds(world.bus) == ["trial_started", "trial_failed"]
    (event,) = world.bus.of_type(TrialFailed)
    assert (event.failure_class, event.attempt) == ("cancelled", 1)
    assert world.coord.holders(req.experiment_id) == []


async def test_heartbeats_keep_the_lease_past_its_ttl(tmp_path: Path) -> None:
    async def held_after_ttl(heartbeat_s: float) -> list[str]:
        executor = held_completion(tmp_path)
        world = World(executor, heartbeat_s=heartbeat_s, ttl_s=60.0)
        req = make_request()
        task = await world.start(req)
        world.clock.now += 50  # a beat now renews the lease at t+50
        if heartbeat_s < 1:
            await world.keep_alive.beats(2)  # the second beat follows a renew
        world.clock.now += 50  # t+100: past the TTL of the lease taken at t
        holders = world.coord.holders(req.experiment_id)
        executor.release.set()
        assert await asyncio.wait_for(task, 10) == ACK
        return holders

    assert await held_after_ttl(heartbeat_s=0.01) == ["runner-1"]
    # Negative control: without a heartbeat the same lease has expired.
    assert await held_after_ttl(heartbeat_s=3600) == []


class ForgetfulCoordinator(InMemoryCoordinator):
    """A coordinator that keeps no endings: the runner as it was before they existed."""

    async def record_ending(self, run_id: str, event: bytes) -> bytes:
        return event


# None: the experiment's limit binds (a slot is taken beside the ending's read); 1: it
# cannot bind (one trial, limit 2), so the ending is read alone.
@pytest.mark.parametrize("experiment_trials", [None, 1])
async def test_a_run_that_ended_is_not_run_again_when_redelivered(
    tmp_path: Path, experiment_trials: int | None
) -> None:
    async def redelivered(coord: InMemoryCoordinator) -> tuple[World, World]:
        # runner-1 ran the trial and published its completion, then died before the
        # ack: JetStream hands the same message to runner-2.
        first = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)), coord=coord)
        second = World(
            ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)),
            coord=coord,
            bus=first.bus,
            runner_id="runner-2",
        )
        req = make_request(experiment_trials=experiment_trials)
        assert await first.handle(req) == ACK
        assert await second.handle(req) == ACK
        return first, second

    first, second = await redelivered(InMemoryCoordinator(lease_ttl_s=60))
    assert second.executor.calls == []
    (done,) = first.bus.of_type(TrialCompleted)
    assert kinds(first.bus) == ["trial_started", "trial_completed"]
    # The ending was re-published once, with its own dedup id (JetStream drops it).
    assert first.bus.duplicates == [done.dedup_id()]
    # No attempt was counted for the redelivery.
    assert await first.coord.next_attempt(done.run_key) == 2
    # Negative control: without the stored ending the trial runs again and the run
    # ends twice (the defect the chaos run found).
    first, second = await redelivered(ForgetfulCoordinator(lease_ttl_s=60))
    assert len(second.executor.calls) == 1
    assert [e.attempt for e in first.bus.of_type(TrialCompleted)] == [1, 2]


class CompletionLostOnce(RecordingBus):
    """A bus whose first TrialCompleted publish goes unconfirmed (a TransientError)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = False

    async def publish(self, event: Envelope, *, msg_id: str | None = None) -> bool:
        if isinstance(event, TrialCompleted) and not self.lost:
            self.lost = True
            raise TransientError("no ack from JetStream")
        return await super().publish(event, msg_id=msg_id)


async def test_an_ending_stored_but_not_published_is_published_on_redelivery(
    tmp_path: Path,
) -> None:
    async def lost_then_redelivered(coord: InMemoryCoordinator) -> World:
        world = World(
            ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)),
            coord=coord,
            bus=CompletionLostOnce(),
        )
        req = make_request()
        verdict = await world.handle(req)  # the ending is stored, its publish is lost
        assert (verdict.action, verdict.reason) == ("nak", "transient")
        assert kinds(world.bus) == ["trial_started"]
        assert await world.handle(req) == ACK
        return world

    world = await lost_then_redelivered(InMemoryCoordinator(lease_ttl_s=60))
    # Redelivered: the stored completion of attempt 1 goes out; nothing runs again.
    assert kinds(world.bus) == ["trial_started", "trial_completed"]
    assert [e.attempt for e in world.bus.of_type(TrialCompleted)] == [1]
    assert len(world.executor.calls) == 1
    # Negative control: without the stored ending, the redelivery runs attempt 2.
    world = await lost_then_redelivered(ForgetfulCoordinator(lease_ttl_s=60))
    assert [e.attempt for e in world.bus.of_type(TrialCompleted)] == [2]
    assert len(world.executor.calls) == 2


async def test_when_another_runner_ended_the_run_first_its_ending_is_published(
    tmp_path: Path,
) -> None:
    executor = held_completion(tmp_path)
    world = World(executor)
    req = make_request()
    task = await world.start(req)
    # Meanwhile another runner, handed the same message after ack_wait, finished it.
    theirs = TrialCompleted(
        experiment_id=req.experiment_id,
        trial_id=req.trial_id,
        result=ObjectRef(bucket="RESULTS", name="theirs", size=1, sha256="ee" * 32),
        trial_name=req.trial_id,
        attempt=2,
        run_id=req.dedup_id(),
    )
    assert await world.coord.record_ending(req.dedup_id(), encode_event(theirs)) == (
        encode_event(theirs)
    )
    executor.release.set()
    assert await asyncio.wait_for(task, 10) == ACK
    # Ours (attempt 1) is not published: the run ends once, as the other runner said.
    assert [(e.attempt, e.result) for e in world.bus.of_type(TrialCompleted)] == [
        (2, theirs.result)
    ]
    # Negative control: alone, the same handler publishes its own ending.
    alone = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    assert await alone.handle(req) == ACK
    assert [e.attempt for e in alone.bus.of_type(TrialCompleted)] == [1]


async def test_a_final_failure_ends_the_run_a_retry_does_not() -> None:
    world = World(ScriptedExecutor(lambda r, a: failed(RETRYABLE)))
    req = make_request(max_attempts=2)
    assert (await world.handle(req)).action == "nak"
    # Negative control: a retryable failure with attempts left stored no ending.
    assert await world.coord.ending(req.dedup_id()) is None
    assert await world.handle(req) == ACK
    stored = await world.coord.ending(req.dedup_id())
    (final,) = [f for f in world.bus.of_type(TrialFailed) if f.final]
    assert stored is not None and stored == encode_event(final)
    assert await world.handle(req) == ACK
    assert len(world.executor.calls) == 2


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b'{"type": "trial_requested"}',
        encode_event(
            ExperimentSubmitted(experiment_id="e", name="n", n_trials=1, n_published=1, manifest={})
        ),
    ],
)
async def test_poison_is_terminated_without_side_effects(data: bytes) -> None:
    world = World(ScriptedExecutor(lambda r, a: failed(None)))
    assert await world.handle(data) == TERM
    assert world.bus.published == [] and world.executor.calls == []


async def test_an_unconfirmed_publish_hands_the_trial_back_soon(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    req = make_request()
    world.bus.fail_next = [TransientError("no ack from JetStream")]
    verdict = await world.handle(req)
    assert (verdict.action, verdict.reason, verdict.delay_s) == ("nak", "transient", 5.0)
    assert world.coord.holders(req.experiment_id) == []
    # Negative control: the redelivery succeeds, as attempt 2.
    assert await world.handle(req) == ACK
    assert [e.attempt for e in world.bus.of_type(TrialCompleted)] == [2]


async def test_a_crashed_attempt_is_a_failed_one_retried_then_final() -> None:
    def crash(request: TrialRequested, attempt: int) -> ExecutionOutcome:
        raise RuntimeError("executor bug")

    world = World(ScriptedExecutor(crash))
    req = make_request(max_attempts=2)
    first = await world.handle(req)
    assert (first.action, first.reason) == ("nak", "retry")  # the retry policy's backoff
    assert world.coord.holders(req.experiment_id) == []
    assert await world.handle(req) == ACK  # the last attempt the policy allows
    failed = world.bus.of_type(TrialFailed)
    assert [(e.attempt, e.final, e.error_type) for e in failed] == [
        (1, False, "RunnerCrashedError"),
        (2, True, "RunnerCrashedError"),
    ]
    assert failed[-1].failure_class == "infrastructure"  # unscored, never a zero
    assert failed[-1].message == (
        "the runner's attempt crashed: RuntimeError: executor bug (see the runner's log)"
    )
    # Control: a runner bug outside the attempt (here, reading the stored ending) is
    # still redelivered later, nothing published: no attempt ran.
    world = World(ScriptedExecutor(crash))
    world.coord.ending = _raises  # type: ignore[method-assign, assignment]
    verdict = await world.handle(make_request())
    assert (verdict.action, verdict.reason, verdict.delay_s) == ("nak", "bug", 10.0)
    assert world.bus.published == [] and world.executor.calls == []


async def _raises(*_args: object) -> bytes | None:
    raise RuntimeError("coordinator bug")


async def test_shutdown_cancels_the_handler_and_frees_the_slot(tmp_path: Path) -> None:
    executor = held_completion(tmp_path)
    world = World(executor)
    req = make_request()
    task = await world.start(req)
    # Negative control: while running, the trial holds its slot.
    assert world.coord.holders(req.experiment_id) == ["runner-1"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert executor.was_cancelled
    # Nothing final was reported: the consumer hands the message back.
    assert kinds(world.bus) == ["trial_started"]
    assert world.coord.holders(req.experiment_id) == []


async def test_the_recording_bus_dedups_by_msg_id_like_jetstream() -> None:
    bus = RecordingBus()
    req = make_request()
    first = TrialStarted(
        experiment_id=req.experiment_id,
        trial_id=req.trial_id,
        runner_id="r",
        host="h",
        attempt=1,
        run_id=req.dedup_id(),
    )
    replay = first.model_copy(update={"event_id": "another-event-id"})
    assert await bus.publish(first) is True
    # A re-sent report of the same attempt (new event id, same natural key) is dropped.
    assert await bus.publish(replay) is False
    assert bus.published == [first] and bus.duplicates == [first.dedup_id()]
    # Negative control: the next attempt is a new message; an explicit msg id wins.
    second = first.model_copy(update={"attempt": 2})
    assert await bus.publish_many([second, replay]) == [True, False]
    assert await bus.publish(replay, msg_id="explicit") is True
    assert len(bus.published) == 3


# -- the trial folder travels in the results bucket, not as a path ----------------------


async def test_a_completed_trial_points_at_its_stored_folder_and_the_local_copy_goes(
    tmp_path: Path,
) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    req = make_request()
    assert await world.handle(req) == ACK
    [event] = world.bus.of_type(TrialCompleted)
    assert event.result.name == f"{req.experiment_id}/{req.dedup_id()}/1.tar.gz"
    assert (event.trial_name, event.repetition) == (req.trial_id, req.repetition)
    data = await world.folders.store.get(event.result)
    unpacked = unpack_trial(data, tmp_path / "unpacked")
    assert json.loads((unpacked / "result.json").read_text()) == {"trial_name": req.trial_id}
    # The runner's folder is a cache: gone once the ending is published.
    await world.handler.discarded()
    assert not (tmp_path / "job" / req.trial_id).exists()


class GatedFolders(TrialFolders):
    """Trial folders whose local deletion waits for ``gate``; records, at each
    deletion, whether the ending pointing at the stored folder was out."""

    gate: asyncio.Event
    stored_first: list[bool]
    bus: RecordingBus
    batches: list[int]  # folders per deletion hand-off

    def __init__(self, folders: TrialFolders, bus: RecordingBus) -> None:
        super().__init__(folders.store, folders.cap_bytes, retry_delays_s=())
        object.__setattr__(self, "gate", asyncio.Event())
        object.__setattr__(self, "stored_first", [])
        object.__setattr__(self, "bus", bus)
        object.__setattr__(self, "batches", [])

    async def discard_all(self, folders: list[Path]) -> None:
        events = self.bus.of_type(TrialCompleted)
        self.stored_first.append(
            [await self.store.get(e.result) is not None for e in events] == [True] * len(events)
        )
        self.batches.append(len(folders))
        await self.gate.wait()
        await super().discard_all(folders)


async def test_the_verdict_does_not_wait_for_the_local_folder_to_be_deleted(
    tmp_path: Path,
) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    gated = GatedFolders(world.folders, world.bus)
    world.handler._folders = gated
    req = make_request()
    folder = tmp_path / "job" / req.trial_id
    # Before: the deletion ran before the verdict, so the slot (and the ack) waited
    # for it; a held deletion then held the verdict too and this timed out.
    assert await asyncio.wait_for(world.handle(req), 10) == ACK
    # The trial's path is free at once (a next attempt may use it); its content is
    # set aside beside it, its deletion held.
    assert not folder.exists()
    [aside] = folder.parent.glob(f"{DISCARDING_PREFIX}{req.trial_id}.*")
    assert (aside / "result.json").is_file()
    gated.gate.set()
    await world.handler.discarded()
    assert list(folder.parent.iterdir()) == []
    # Deleted only once stored and the ending pointing at it published.
    assert gated.stored_first == [True]


async def test_folders_of_a_burst_of_endings_are_deleted_together(tmp_path: Path) -> None:
    # Each deletion is a hand-off to a worker thread (a future and a wake-up of the
    # loop): endings that arrive while one runs are deleted by the next, together.
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    gated = GatedFolders(world.folders, world.bus)
    world.handler._folders = gated
    reqs = [make_request(f"hello__{i:04d}") for i in range(6)]
    for req in reqs:  # the first deletion starts and is held; five more endings queue
        assert await asyncio.wait_for(world.handle(req), 10) == ACK
    assert gated.batches == [1]
    gated.gate.set()
    await world.handler.discarded()
    assert gated.batches == [1, 5] and list((tmp_path / "job").iterdir()) == []
    # Control: endings apart (each deletion done before the next ending) go one by one.
    for i in range(6, 8):
        assert await world.handle(make_request(f"hello__{i:04d}")) == ACK
        await world.handler.discarded()
    assert gated.batches == [1, 5, 1, 1]


async def test_kept_trial_folders_stay(tmp_path: Path) -> None:
    # Negative control of the deletion above: the setting keeps them.
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    world.handler._folders = replace(world.folders, keep_local=True)
    assert await world.handle(make_request()) == ACK
    assert (tmp_path / "job" / make_request().trial_id / "result.json").is_file()


async def test_an_upload_that_is_not_confirmed_hands_the_trial_back(tmp_path: Path) -> None:
    world = World(ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)))
    full = InMemoryObjectStore("RESULTS", max_bytes=10)  # refuses every archive
    world.handler._folders = replace(world.folders, store=full)
    verdict = await world.handle(make_request())
    assert (verdict.action, verdict.reason) == ("nak", "transient")
    # Nothing claims the run ended: no ending stored, none published.
    assert world.bus.of_type(TrialCompleted) == []
    assert await world.coord.ending(make_request().dedup_id()) is None


# -- a runner that cannot run a trial ends it with one clear message ---------------------


def peer(runner_id: str, offers: list[str], keys: list[str] | None) -> RunnerInfo:
    """Another runner of the default pool, as it announces itself."""
    return RunnerInfo(
        runner_id=runner_id, host="node-b", capabilities=offers, concurrency=1, secrets_set=keys
    )


async def peers_of(*runners: RunnerInfo, clock: Clock | None = None) -> Peers:
    """What runner-1 (World's) learns of ``runners`` from a registry they announced in."""
    registry = MemoryRunnerRegistry(clock=clock or Clock())
    for runner in runners:
        await registry.announce(runner)
    return Peers(registry, "runner-1", ttl_s=2.0, clock=clock or Clock())


def keyed_request() -> TrialRequested:
    """make_request's trial (docker), its agent needing ANTHROPIC_API_KEY."""
    request = make_request()
    agent = request.agent.model_copy(update={"api_key_env": ["ANTHROPIC_API_KEY"]})
    return request.model_copy(update={"agent": agent})


LOCAL_ONLY = Fit(frozenset({"local"}), frozenset({"ANTHROPIC_API_KEY"}))


@pytest.mark.parametrize(
    ("fit", "error_type", "lacks"),
    [
        pytest.param(LOCAL_ONLY, "RunnerLacksCapability", "does not offer 'docker'", id="env"),
        pytest.param(
            Fit(frozenset({"local", "docker"}), frozenset()),
            "MissingSecretError",
            "has no ANTHROPIC_API_KEY set (api_key_env of agent 'oracle')",
            id="agent-key",
        ),
        pytest.param(
            Fit(frozenset({"local", "docker"}), frozenset(), frozenset({"OTHER_KEY"})),
            "PolicyRefused",
            "may not pass ANTHROPIC_API_KEY to a trial (api_key_env of agent 'oracle'; not in "
            "its policy's secret_names: add it to extra_secret_names on the runners to allow it)",
            id="key-not-allowed",
        ),
    ],
)
async def test_a_trial_this_runner_cannot_run_is_left_for_a_peer_that_can(
    tmp_path: Path, fit: Fit, error_type: str, lacks: str
) -> None:
    req = keyed_request()
    able = peer("runner-2", ["local", "docker"], ["ANTHROPIC_API_KEY"])
    executor = ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id))
    world = World(executor, fit=fit, peers=await peers_of(able))

    verdict = await world.handle(req)

    # Back in the queue, nothing started, published or counted.
    assert (verdict.action, verdict.reason) == ("nak", "handoff")
    assert executor.calls == [] and world.bus.published == []
    assert await world.coord.next_attempt(req.run_key) == 1  # the first one counted

    # Control: with no live peer that has it, the trial ends at once, naming the lack.
    for peers in (
        await peers_of(),
        await peers_of(peer("runner-3", ["local"], ["ANTHROPIC_API_KEY"])),  # no docker
        await peers_of(peer("runner-3", ["local", "docker"], [])),  # no key
        await peers_of(peer("runner-3", ["local", "docker"], None)),  # does not say
        await peers_of(able.model_copy(update={"pool": "gpu"})),  # another pool
    ):
        alone = World(
            ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)), fit=fit, peers=peers
        )
        assert await alone.handle(req) == ACK
        [failed_event] = alone.bus.of_type(TrialFailed)
        assert (failed_event.error_type, failed_event.final) == (error_type, True)
        assert failed_event.message.startswith(
            f"runner on node-a (pool 'default') {lacks}, nor does any other live runner of "
            "pool 'default'; start a runner of the pool"
        ), failed_event.message
        assert alone.executor.calls == []


@pytest.mark.parametrize(
    ("fit", "error_type", "lacks"),
    [
        pytest.param(
            Fit(frozenset({"docker"}), frozenset()),
            "MissingSecretError",
            "has no DB_TOKEN set (task.toml of task {task!r})",
            id="unset",
        ),
        pytest.param(
            Fit(frozenset({"docker"}), frozenset({"DB_TOKEN"}), frozenset({"OTHER_KEY"})),
            "PolicyRefused",
            "may not pass DB_TOKEN to a trial (task.toml of task {task!r}; not in its policy's",
            id="not-allowed",
        ),
    ],
)
async def test_a_task_s_variable_this_runner_lacks_is_left_for_a_peer_that_has_it(
    tmp_path: Path, fit: Fit, error_type: str, lacks: str
) -> None:
    req = make_request().model_copy(update={"task_variables": ["DB_TOKEN"]})
    lacks = lacks.format(task=req.task.name)
    failed_event = await handed_off_then_ended(
        tmp_path,
        req,
        fit,
        able=peer("runner-2", ["docker"], ["DB_TOKEN"]),
        unable=peer("runner-2", ["docker"], ["OTHER_KEY"]),  # lacks it too
    )
    assert failed_event.error_type == error_type
    assert lacks in failed_event.message, failed_event.message


async def handed_off_then_ended(
    tmp_path: Path, req: TrialRequested, fit: Fit, *, able: RunnerInfo, unable: RunnerInfo
) -> TrialFailed:
    """Check that a runner holding ``fit`` hands ``req`` back, nothing started or
    published, while ``able`` is live; and, the control, that with only ``unable`` live
    it ends the trial at once: returns that final TrialFailed."""
    world = World(
        ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)),
        fit=fit,
        peers=await peers_of(able),
    )
    verdict = await world.handle(req)
    assert (verdict.action, verdict.reason) == ("nak", "handoff")
    assert world.executor.calls == [] and world.bus.published == []
    alone = World(
        ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)),
        fit=fit,
        peers=await peers_of(unable),
    )
    assert await alone.handle(req) == ACK
    assert alone.executor.calls == []
    [failed_event] = alone.bus.of_type(TrialFailed)
    assert failed_event.final
    return failed_event


async def test_a_task_s_allowlist_is_left_for_a_runner_that_enforces_it(tmp_path: Path) -> None:
    """A runner that is not root does not offer ``local.allowlist``; a root peer does."""
    request = make_request()
    compute = request.compute.model_copy(update={"environment": "local"})
    req = request.model_copy(update={"compute": compute, "task_requires": ["local.allowlist"]})
    failed_event = await handed_off_then_ended(
        tmp_path,
        req,
        Fit(frozenset({"local"}), frozenset()),  # not root
        able=peer("runner-2", ["local", "local.allowlist"], []),
        unable=peer("runner-2", ["local"], []),
    )
    assert failed_event.error_type == "RunnerLacksCapability"
    assert (
        "does not offer 'local.allowlist' (task 'hello': its task.toml asks for a network "
        "allowlist, which the local environment enforces only on a runner that runs as root)"
    ) in failed_event.message, failed_event.message
    # And a runner that offers it runs the trial.
    able = World(
        ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)),
        fit=Fit(frozenset({"local", "local.allowlist"}), frozenset()),
        peers=await peers_of(),
    )
    assert await able.handle(req) == ACK and len(able.executor.calls) == 1


async def test_a_runner_that_has_what_the_trial_needs_runs_it(tmp_path: Path) -> None:
    fit = Fit(frozenset({"local", "docker"}), frozenset({"ANTHROPIC_API_KEY"}))
    executor = ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id))
    world = World(executor, fit=fit, peers=await peers_of())
    assert await world.handle(keyed_request()) == ACK and len(executor.calls) == 1


async def test_the_registry_is_read_at_most_every_ttl(tmp_path: Path) -> None:
    clock = Clock()
    able = peer("runner-2", ["local", "docker"], ["ANTHROPIC_API_KEY"])
    peers = await peers_of(able, clock=clock)
    req = keyed_request()
    assert await peers.another_can_run(req)
    await peers.registry.withdraw(able)
    assert await peers.another_can_run(req)  # read less than ttl_s ago: still there
    clock.now += 2.0
    assert not await peers.another_can_run(req)


async def test_no_slot_is_taken_when_the_limit_cannot_bind(tmp_path: Path) -> None:
    async def holders_while_running(experiment_trials: int | None) -> list[str]:
        executor = held_completion(tmp_path)
        world = World(executor)
        req = make_request(limit=2, experiment_trials=experiment_trials)
        task = await world.start(req)
        holders = world.coord.holders(req.experiment_id)
        executor.release.set()
        assert await asyncio.wait_for(task, 10) == ACK
        assert kinds(world.bus) == ["trial_started", "trial_completed"]
        return holders

    # Two trials under a limit of two: the limit cannot bind, no slot is needed.
    assert await holders_while_running(experiment_trials=2) == []
    # Negative controls: three trials (it binds), or a count the submitter did not give.
    assert await holders_while_running(experiment_trials=3) == ["runner-1"]
    assert await holders_while_running(experiment_trials=None) == ["runner-1"]


class GatedAttempts(InMemoryCoordinator):
    """Holds every ``begin_attempt`` until ``gate`` is set; counts the callers waiting."""

    def __init__(self) -> None:
        super().__init__(lease_ttl_s=60.0)
        self.gate = asyncio.Event()
        self.waiting = 0
        self.arrived = asyncio.Event()

    async def begin_attempt(self, run_id: str) -> AttemptStart:
        self.waiting += 1
        self.arrived.set()
        self.arrived = asyncio.Event()
        await self.gate.wait()
        return await super().begin_attempt(run_id)


async def test_admission_bounds_the_trials_starting_at_once_and_keeps_the_rest_alive(
    tmp_path: Path,
) -> None:
    async def starting_at_once(admission: int) -> tuple[int, int]:
        coord = GatedAttempts()
        world = World(
            ScriptedExecutor(lambda r, a: completed(tmp_path, r.trial_id)),
            coord=coord,
            heartbeat_s=0.01,
            admission=admission,
        )
        reqs = [make_request(f"hello__000{i}", limit=8) for i in range(3)]
        tasks = [asyncio.create_task(world.handle(r)) for r in reqs]
        while coord.waiting < admission:
            await asyncio.wait_for(coord.arrived.wait(), 10)
        if admission < len(reqs):
            # The ones waiting for admission keep their messages alive meanwhile.
            await asyncio.wait_for(world.keep_alive.beats(3), 10)
        at_once = coord.waiting
        coord.gate.set()
        assert await asyncio.wait_for(asyncio.gather(*tasks), 10) == [ACK] * 3
        assert len(world.bus.of_type(TrialCompleted)) == 3
        return at_once, world.keep_alive.count

    at_once, beats = await starting_at_once(admission=1)
    assert at_once == 1 and beats >= 3
    # Negative control: with room for all three, all three reach the attempt counter.
    at_once, _ = await starting_at_once(admission=3)
    assert at_once == 3


class StartNotConfirmed(RecordingBus):
    """Every TrialStarted publish fails as one JetStream did not confirm."""

    async def publish(self, event: Envelope, *, msg_id: str | None = None) -> bool:
        if isinstance(event, TrialStarted):
            await asyncio.sleep(0)
            raise TransientError("no ack from JetStream")
        return await super().publish(event, msg_id=msg_id)


async def test_a_start_that_cannot_be_announced_stops_the_run_at_once(tmp_path: Path) -> None:
    executor = held_completion(tmp_path)
    world = World(executor, bus=StartNotConfirmed())
    req = make_request()
    verdict = await asyncio.wait_for(world.handle(req), 10)
    assert (verdict.action, verdict.reason) == ("nak", "transient")
    # The blocked run did not go on to its end: it was stopped, nothing final reported.
    assert executor.was_cancelled
    assert world.bus.published == []
    assert world.coord.holders(req.experiment_id) == []


def test_folders_set_aside_by_a_stopped_runner_are_swept_and_nothing_else(
    tmp_path: Path,
) -> None:
    folders = trial_folders()
    job = tmp_path / "exp-1"
    for name in ("t1", "t2"):
        (job / name).mkdir(parents=True)
        (job / name / "result.json").write_text("{}")
    aside = folders.set_aside(job / "t1")  # the runner stopped before deleting it
    assert aside is not None and aside.parent == job and not (job / "t1").exists()
    assert sweep_set_aside(tmp_path) == 1
    # Negative control: the trial folder never set aside is kept.
    assert [p.name for p in job.iterdir()] == ["t2"]
    # Kept by setting: nothing is set aside.
    assert replace(folders, keep_local=True).set_aside(job / "t2") is None
    assert (job / "t2" / "result.json").is_file()
