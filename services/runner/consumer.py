"""The runner's JetStream adapter: a pull loop that fetches only as many trials as it can run.

FastStream's pull subscriber with ``max_workers`` prefetches past ``ack_wait`` and
duplicates work (checked on this machine), so the runner drives nats-py's pull
consumer itself: a free slot is taken *before* a message is fetched, each message is
given to the handler (services.runner.handlers) with its ``in_progress()`` as the
keep-alive, and the handler's verdict is applied to the message here. On drain or
shutdown a message still in flight is handed back (nak) for another runner.

Work comes from one durable per priority class (services.runner.durables). An idle
runner long-polls every class for one message (returned the moment it arrives); once
a class is known to hold work, free slots are shared between the classes that do by
weighted deficit round robin (services.runner.selection), each fetched with a short
pull of its share, so a burst is taken in batches and a lone trial never waits out a
batch's fetch window. docs/scheduling.md gives the rule and what it costs.

A fetch gives up at its window, but the server may still be sending what it asked
for (under load, the replies of a batch pull come after the window): those messages
land in the subscription's buffer, delivered to this runner and not acknowledged.
Left there, one waits until this runner's next fetch, which a runner with every slot
busy does not make for as long as its trials run (30 s in the capacity benchmark,
docs/performance.md). A sweep takes them a few times a second: onto a free slot, or
back to the stream (nak, no delay) for another runner.

Longer than 350 lines because the fetch loop, slot accounting (free, reserved for a
preempting class) and the settling of verdicts share one state (the slots and the
messages in flight); split apart, each piece would reach into the others'.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext

from schemas.subjects import DEFAULT_POOL, Topology
from services.common.adapters.jetstream import apply_settle
from services.common.errors import Settle, settle_error
from services.common.logging import get_logger
from services.common.priority import DEFAULT_PRIORITY_CLASSES, PriorityClasses
from services.runner.attempt import KeepAlive
from services.runner.durables import ensure_runner_durables
from services.runner.handlers import TRANSIENT_RETRY_DELAY_S
from services.runner.selection import plan, yielded

log = get_logger(__name__)


class MessageHandler(Protocol):
    """What the loop calls per message (TrialHandler.handle): the verdict to apply."""

    async def __call__(self, data: bytes, keep_alive: KeepAlive, *, subject: str = "") -> Settle:
        """Handle one message; raises only CancelledError."""


LOOK_AGAIN_S = 1.0
"""A class believed empty is looked at again (its durable's pending counts) at most
this often while other classes keep the runner busy: the most an urgent arrival can
wait for a slot that frees meanwhile. A class with unacknowledged messages (running
somewhere, or handed back to come again) then costs one short, maybe empty, fetch."""
IDLE_FETCH_TIMEOUT_S = 1.0
"""An idle runner's single-message pull: it returns the moment a trial arrives, so
this window only sets how often an idle runner renews its request (once a second)."""
BUSY_FETCH_TIMEOUT_S = 0.05
"""A multi-message pull after the previous one found work: it returns when the batch
is full or after this window, so a trial that is delivered into a batch that never
fills waits at most this long (it waited the whole idle window before)."""
LATE_SWEEP_S = 0.25
"""How often the buffer of a class not being fetched from is looked at for messages
that arrived after their fetch gave up: the most such a message waits."""
HANDOFF_BACKOFF_S = (0.25, 5.0)
"""While the trials a runner fetches are ones it lacks something for (each handed off
to a peer of the pool that has it: ``Settle.reason == "handoff"``), it waits before it
fetches again: the first value after one hand-off, doubling with each in a row, at
most the second. Any other verdict ends the streak. Without it a runner lacking an API
key cycled through the pool's whole queue of keyed work, every message redelivered
every few seconds and held out of the keyed runner's reach meanwhile (benchmark
``handoff``: 200 keyed trials 47 % longer beside a keyless runner than alone, 7.07
hand-offs per trial; with it 1.00 and 0.08; docs/performance.md)."""


async def ensure_runner_consumers(
    js: JetStreamContext,
    topology: Topology,
    ack_wait_s: float,
    pool: str = DEFAULT_POOL,
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES,
) -> None:
    """Create the pool's shared durables (one per priority class) that do not exist yet.

    With per-role NATS users the admin created them when provisioning (and narrowed
    ones left from before pools or classes); then this only looks. Without users, it
    also narrows a durable left from before classes, as provisioning does.
    """
    await ensure_runner_durables(js, topology, ack_wait_s, [pool], classes)


async def apply_verdict(msg: Msg, verdict: Settle) -> None:
    """Settle ``msg`` as the handler decided; the runner's ack waits for the server.

    A trial's ack ends minutes of work: waiting for the server's reply turns a lost
    ack into a logged error here (and a nak) rather than a silent re-run after ack_wait.
    """
    if verdict.action == "ack":
        await msg.ack_sync()
    else:
        await apply_settle(msg, verdict)


@dataclass
class _ClassQueue:
    """What the loop knows of one class's durable."""

    psub: JetStreamContext.PullSubscription
    pending: int = 1  # messages believed waiting; 1 at start: look before assuming none
    seen_at: float = 0.0  # when ``pending`` was last learnt (monotonic)
    poll: asyncio.Task[None] | None = None  # an idle long poll in flight
    fetching: bool = False  # a fetch is reading the subscription's buffer


def _pending_after(msgs: list[Msg], asked: int) -> int:
    """Messages left in the class after a fetch: the server's count in the last
    message's metadata; 0 when the fetch came back short."""
    if len(msgs) < asked:
        return 0
    try:
        return int(msgs[-1].metadata.num_pending)
    except Exception:  # noqa: BLE001 - not a JetStream reply: assume more, look again
        return 1


def buffered(psub: JetStreamContext.PullSubscription) -> list[Msg]:
    """The work messages waiting in ``psub``'s buffer, taken out without a request to
    the server; the status replies among them (a pull's end) are dropped.

    What nats-py's own fetch does with the buffer before it pulls; done here without
    the pull, which on a runner with no free slot would only bring more work to hand
    back. nats-py keeps the buffer private (``pending_msgs`` is its public size).
    """
    sub = psub._sub  # private: see above
    found: list[Msg] = []
    while psub.pending_msgs:
        msg = sub._pending_queue.get_nowait()
        sub._pending_size -= len(msg.data)
        if not JetStreamContext.is_status_msg(msg):
            found.append(msg)
    return found


@dataclass(eq=False)
class WorkConsumer:
    """Fetches work messages for free slots only, from the priority classes by weight,
    and hands each to the handler."""

    js: JetStreamContext
    topology: Topology
    handle: MessageHandler
    _: KW_ONLY
    concurrency: int
    runner_id: str = ""
    pool: str = DEFAULT_POOL
    classes: PriorityClasses = DEFAULT_PRIORITY_CLASSES
    in_flight: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    _weights: dict[str, int] = field(init=False)
    _slots: asyncio.Semaphore = field(init=False)
    _credit: dict[str, int] = field(init=False, default_factory=dict)
    _queues: dict[str, _ClassQueue] = field(init=False, default_factory=dict)
    _stopping: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    # slots owed to a class (preemption made room)
    _reserved: dict[str, int] = field(init=False, default_factory=dict)
    # classes preempted here for a heavier class
    _yielding: set[str] = field(init=False, default_factory=set)
    # trials handed off to a peer in a row (HANDOFF_BACKOFF_S)
    _handoffs: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._weights = dict(self.classes.weights)
        self._slots = asyncio.Semaphore(self.concurrency)

    async def run(self) -> None:
        """Fetch and handle trials until ``stop()`` (in-flight trials go on).

        With free slots: classes known to hold work are fetched from by weight
        (services.runner.selection), each with a short pull; a class believed empty is
        looked at again (its durable's pending count, one API request) at most once a
        second. When no class is known to hold work, every class gets a long poll
        that returns the moment a message arrives, so a lone class costs no latency.
        """
        topo, classes = self.topology, self.classes
        for name in classes.names:
            durable = topo.runner_durable_for(self.pool, classes.durable_class(name))
            psub = await self.js.pull_subscribe_bind(durable, stream=topo.work_stream)
            self._queues[name] = _ClassQueue(psub)
        log.info(
            "runner ready",
            runner_id=self.runner_id,
            pool=self.pool,
            concurrency=self.concurrency,
            classes=dict(classes.weights),
        )
        stopped = asyncio.create_task(self._stopping.wait())
        sweep = asyncio.create_task(self._sweep_late())
        try:
            while not self._stopping.is_set():
                await self._slots.acquire()
                free = 1
                # Take every other free slot too, without waiting, to fetch in one go.
                while free < self.concurrency and not self._slots.locked():
                    await self._slots.acquire()
                    free += 1
                if self._reserved:
                    taken = await self._fetch_reserved(free)
                    for _ in range(free - taken):
                        self._slots.release()
                    continue
                if self._handoffs:
                    await self._back_off()
                await self._look_again()
                waiting = {
                    c: q.pending for c, q in self._queues.items() if q.pending and q.poll is None
                }
                # A class preempted here waits while a heavier class is known to wait.
                waiting, self._yielding = yielded(self._weights, waiting, self._yielding)
                if waiting:
                    taken = await self._fetch_planned(waiting, free)
                    for _ in range(free - taken):
                        self._slots.release()
                    continue
                # Nothing known to wait: give the slots back (a poll takes one when its
                # message arrives) and long-poll every class not already polled.
                for _ in range(free):
                    self._slots.release()
                for name, queue in self._queues.items():
                    if queue.poll is None:
                        queue.poll = asyncio.create_task(self._poll(name))
                polls = {q.poll for q in self._queues.values() if q.poll is not None}
                await asyncio.wait({*polls, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            await sweep
            # A poll in flight ends within its window; what it brings is handed back.
            await asyncio.gather(
                *(q.poll for q in self._queues.values() if q.poll is not None),
                return_exceptions=True,
            )
            for queue in self._queues.values():
                with contextlib.suppress(Exception):
                    await queue.psub.unsubscribe()

    async def _look_again(self) -> None:
        """Refresh the pending count of classes believed empty for over LOOK_AGAIN_S."""
        now = time.monotonic()
        stale = [
            q
            for q in self._queues.values()
            if not q.pending and q.poll is None and now - q.seen_at >= LOOK_AGAIN_S
        ]
        if not stale or self._stopping.is_set():
            return

        async def look(queue: _ClassQueue) -> None:
            try:
                info = await queue.psub.consumer_info()
            except Exception as exc:  # noqa: BLE001 - reconnecting: look next time
                log.warning("could not read a class's pending count", error=str(exc))
                return
            # num_pending counts messages never delivered. A message handed back (nak
            # with a delay: a full experiment lease, a pause, a retry's backoff) waits
            # among the unacknowledged ones instead, with the running trials: then the
            # class may hold work, and one short fetch finds out.
            pending = int(info.num_pending or 0)
            if not pending and info.num_ack_pending:
                pending = 1
            queue.pending, queue.seen_at = pending, time.monotonic()

        await asyncio.gather(*(look(q) for q in stale))

    async def _fetch_planned(self, waiting: dict[str, int], free: int) -> int:
        """Fetch ``free`` messages by weight from the ``waiting`` classes, start each on
        one of the held slots; return how many slots were used."""
        picks, self._credit = plan(self._weights, self._credit, waiting, free)
        if len(picks) == 1:  # the usual case, one class with work: no task per fetch
            ((name, n),) = picks
            fetched = [await self._fetch(self._queues[name], n, BUSY_FETCH_TIMEOUT_S)]
        else:
            fetched = await asyncio.gather(
                *(self._fetch(self._queues[c], n, BUSY_FETCH_TIMEOUT_S) for c, n in picks)
            )
        taken = 0
        for (name, asked), msgs in zip(picks, fetched, strict=True):
            queue = self._queues[name]
            queue.pending, queue.seen_at = _pending_after(msgs, asked), time.monotonic()
            for msg in msgs:
                self._start(msg)
            taken += len(msgs)
        return taken

    async def _fetch_reserved(self, free: int) -> int:
        """Fetch for the classes owed slots (preemption freed them for these classes),
        before the weighted share; return how many slots were used."""
        owed, self._reserved = self._reserved, {}
        taken = 0
        for name, n in owed.items():
            want = min(n, free - taken)
            if want <= 0:
                break
            queue = self._queues[name]
            if queue.poll is not None:
                continue  # its long poll brings the message and takes the freed slot
            msgs = await self._fetch(queue, want, BUSY_FETCH_TIMEOUT_S)
            queue.pending, queue.seen_at = _pending_after(msgs, want), time.monotonic()
            for msg in msgs:
                self._start(msg)
            taken += len(msgs)
        return taken

    async def _back_off(self) -> None:
        """Wait while the trials fetched last were handed off (``HANDOFF_BACKOFF_S``),
        the slots held meanwhile; ``stop()`` ends the wait."""
        first, most = HANDOFF_BACKOFF_S
        wait_s = min(most, first * 2 ** min(self._handoffs - 1, 16))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), wait_s)

    @property
    def free_slots(self) -> int:
        """Slots not running a trial (nor taking one in)."""
        return self.concurrency - len(self.in_flight)

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called."""
        return self._stopping.is_set()

    async def pending_of(self, names: Sequence[str]) -> dict[str, int]:
        """Messages never delivered yet in each class of ``names`` (one CONSUMER.INFO
        each, at once); a class whose count cannot be read is left out."""

        async def look(name: str) -> tuple[str, int | None]:
            try:
                info = await self._queues[name].psub.consumer_info()
            except Exception as exc:  # noqa: BLE001 - reconnecting: look next time
                log.warning("could not read a class's pending count", error=str(exc))
                return name, None
            return name, int(info.num_pending or 0)

        looked = await asyncio.gather(*(look(n) for n in names if n in self._queues))
        found = {name: n for name, n in looked if n is not None}
        now = time.monotonic()
        for name, n in found.items():
            queue = self._queues[name]
            queue.pending, queue.seen_at = n, now
        return found

    def reserve(self, name: str, instead_of: str | None = None) -> None:
        """Owe class ``name`` the next free slot (a trial of class ``instead_of`` is
        being preempted for it); ``instead_of`` then yields free slots to heavier
        waiting classes (services.runner.selection ``yielded``)."""
        self._reserved[name] = self._reserved.get(name, 0) + 1
        if instead_of is not None:
            self._yielding.add(instead_of)

    async def _poll(self, name: str) -> None:
        """One long poll of class ``name``: its message takes a free slot, or goes back
        at once (no delay, no attempt) when the slots filled meanwhile."""
        queue = self._queues[name]
        try:
            msgs = await self._fetch(queue, 1, IDLE_FETCH_TIMEOUT_S, stopping_ok=True)
            handed_back = False
            for msg in msgs:
                if self._stopping.is_set() or self._slots.locked():
                    handed_back = True
                    with contextlib.suppress(Exception):
                        await msg.nak()
                    continue
                await self._slots.acquire()  # free: returns at once
                self._start(msg)  # first: the trial's start is what an idle runner owes
            pending = _pending_after(msgs, 1)
            queue.pending = max(pending, 1) if handed_back else pending
            queue.seen_at = time.monotonic()
        finally:
            queue.poll = None

    def _start(self, msg: Msg) -> None:
        task = asyncio.create_task(self._process(msg))
        self.in_flight.add(task)
        task.add_done_callback(self._done)

    async def _fetch(
        self, queue: _ClassQueue, n: int, window_s: float, *, stopping_ok: bool = False
    ) -> list[Msg]:
        """At most ``n`` messages of ``queue``'s class (the slots held for them)."""
        if self._stopping.is_set() and not stopping_ok:
            return []
        queue.fetching = True
        try:
            msgs = await queue.psub.fetch(batch=n, timeout=window_s)
        except (NatsTimeoutError, TimeoutError):
            return []
        except Exception as exc:  # noqa: BLE001 - reconnecting; keep the loop alive
            log.warning("fetch failed; retrying", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(1.0)
            return []
        finally:
            queue.fetching = False
        # nats-py returns its whole buffer first (late arrivals of earlier fetches),
        # whatever the batch: more than ``n`` would run more trials than slots.
        for extra in msgs[n:]:
            await self._hand_back(extra)
        return msgs[:n]

    async def _sweep_late(self) -> None:
        """Take messages that reached a subscription's buffer after their fetch gave up
        (see the module's docstring), until ``stop()``; then hand any back."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), LATE_SWEEP_S)
            for queue in self._queues.values():
                if queue.fetching or queue.poll is not None:
                    continue  # a fetch or poll in flight reads the buffer itself
                for msg in buffered(queue.psub):
                    if self._stopping.is_set() or self._slots.locked():
                        await self._hand_back(msg)
                        queue.pending = max(queue.pending, 1)
                    else:
                        await self._slots.acquire()  # free: returns at once
                        self._start(msg)
            if self._stopping.is_set():
                return

    async def _hand_back(self, msg: Msg) -> None:
        """Give a message this runner has no slot for back to the stream at once."""
        log.info("work message handed back: no free slot", subject=msg.subject)
        with contextlib.suppress(Exception):
            await msg.nak()

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._slots.release()

    def stop(self) -> None:
        """Stop fetching new work (in-flight trials go on)."""
        self._stopping.set()

    async def drain(self, grace_s: float) -> None:
        """Stop fetching, let in-flight trials finish for ``grace_s``, hand back the rest."""
        self.stop()
        tasks = list(self.in_flight)
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _process(self, msg: Msg) -> None:
        keep_alive: KeepAlive = msg.in_progress
        try:
            verdict = await self.handle(msg.data, keep_alive, subject=msg.subject)
            self._handoffs = self._handoffs + 1 if verdict.reason == "handoff" else 0
        except asyncio.CancelledError:
            # Draining or shutting down: hand the trial back to another runner now.
            with contextlib.suppress(Exception):
                await msg.nak()
            raise
        try:
            await apply_verdict(msg, verdict)
        except Exception as exc:  # noqa: BLE001 - the message must not stay unsettled
            # Same rule as a failed handler: nak rather than wait for ack_wait. A nak
            # after an ack the server did receive changes nothing.
            fallback = settle_error(exc, transient_delay_s=TRANSIENT_RETRY_DELAY_S)
            log.warning(
                "could not settle work message",
                subject=msg.subject,
                verdict=verdict.action,
                error=f"{type(exc).__name__}: {exc}",
            )
            with contextlib.suppress(Exception):
                await apply_verdict(msg, fallback)
