"""When a runner hands running trials back: the preemption watch and the stop notice.

services.runner.preemption decides which trials go (pure); this module decides when,
over the fetch loop (services.runner.consumer.WorkConsumer) and the registry of
running trials the handler fills:

- ``watch_preemption``: once a second (``PREEMPT_LOOK_S``), and only while the runner
  has no free slot and runs a preemptible trial, it reads the pending count of the
  classes heavier than that trial (one CONSUMER.INFO each; never per message) and asks
  the chosen trials to go, owing each freed slot to the class it was freed for;
- ``StopNotice``: on SIGTERM the loop stops fetching, and with a notice period set
  (``TRIALBUS_STOP_NOTICE_S``) every trial that cannot finish before the deadline is
  handed back at once, the others may finish, and at the deadline whatever still runs
  is handed back; without one, the runner drains as before (``drain_grace_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from services.common.logging import get_logger
from services.runner.preemption import Running, cannot_finish, higher_classes, victims

log = get_logger(__name__)

PREEMPT_LOOK_S = 1.0
"""How often (on average; each look 0.5-1.5 times this) a full runner holding a
preemptible trial looks for heavier waiting work: about the most an urgent trial waits
for a preemption, beyond the victim's stop."""
SETTLE_S = 10.0
"""After a stop notice's deadline, how long handed-back trials get to record their
hand-back and nak before the process cancels them outright (nak, attempt counted)."""
RELOOK_S = 0.25
"""How often a stop notice looks again at trials that started after it."""


class Slots(Protocol):
    """What the watch and the notice need of the fetch loop (WorkConsumer)."""

    in_flight: set[asyncio.Task[None]]

    @property
    def free_slots(self) -> int:
        """Slots not running a trial."""

    @property
    def stopping(self) -> bool:
        """Whether fetching stopped."""

    async def pending_of(self, names: Sequence[str]) -> dict[str, int]:
        """Messages waiting in each class of ``names``."""

    def reserve(self, name: str, instead_of: str | None = None) -> None:
        """Owe class ``name`` the next free slot, taken from class ``instead_of``."""

    def stop(self) -> None:
        """Stop fetching."""

    async def drain(self, grace_s: float) -> None:
        """Let in-flight trials finish for ``grace_s``, then cancel them."""


async def watch_preemption(
    slots: Slots, running: Running, weights: Mapping[str, int], every_s: float = PREEMPT_LOOK_S
) -> None:
    """Preempt lower-class preemptible trials for waiting higher-class work, until the
    loop stops fetching (see the module docstring)."""
    while not slots.stopping:
        # A random phase per look: the full runners of a pool read the same pending
        # count, and the first to preempt and fetch lowers it for those looking later.
        await asyncio.sleep(every_s * random.uniform(0.5, 1.5))
        if slots.stopping or slots.free_slots > 0:
            continue
        snapshot = running.snapshot()
        heavier = higher_classes(snapshot, weights)
        if not heavier:
            continue  # no preemptible trial runs: nothing to read
        waiting = await slots.pending_of(heavier)
        for trial, for_class in victims(snapshot, waiting, weights, slots.free_slots):
            if trial.hand_back("preempted"):
                slots.reserve(for_class, trial.priority_class)
                log.info(
                    "preempting a trial",
                    run_id=trial.run_id,
                    priority_class=trial.priority_class,
                    for_class=for_class,
                    waiting=waiting[for_class],
                )


class StopNotice:
    """SIGTERM handling of a runner: stop fetching, then hand back or drain."""

    def __init__(self, slots: Slots, running: Running, notice_s: float | None) -> None:
        self._slots = slots
        self._running = running
        self._notice_s = notice_s
        self._task: asyncio.Task[None] | None = None
        self.noticed_at: float | None = None

    def signal(self) -> None:
        """The stop signal's handler: stop fetching; with a notice period, start
        handing back at once (not after the fetch loop's last poll returns)."""
        if self.noticed_at is not None:
            return
        self.noticed_at = time.monotonic()
        self._slots.stop()
        if self._notice_s is not None:
            deadline = self.noticed_at + self._notice_s
            log.warning("stop notice", deadline_s=self._notice_s, running=len(self._running))
            self._task = asyncio.create_task(self._hand_back_until(deadline))

    async def finish(self, drain_grace_s: float) -> None:
        """After the fetch loop ended: the notice's hand-backs, or the plain drain."""
        if self._task is None and self._notice_s is not None:
            self.signal()  # the loop ended without a signal: treat it as one
        if self._task is None:
            await self._slots.drain(drain_grace_s)
            return
        await self._task

    async def _hand_back_until(self, deadline: float) -> None:
        in_flight = self._slots.in_flight
        while in_flight and time.monotonic() < deadline:
            # Trials that started after the notice (their message was being taken in)
            # are judged too, on the next look.
            running = self._running.snapshot()
            for trial in running:
                trial.refresh_limit()
            for trial in cannot_finish(running, time.monotonic(), deadline):
                if trial.hand_back("stop_notice"):
                    log.info("handing back: cannot finish before the deadline", run_id=trial.run_id)
            await _wait_any(in_flight, min(RELOOK_S, max(0.0, deadline - time.monotonic())))
        left = [t for t in self._running.snapshot() if t.hand_back("stop_notice")]
        if left:
            log.warning("stop notice deadline: handing back what still runs", trials=len(left))
        # Handed-back trials record their reason and nak; anything still taking a
        # message in is cancelled (nak) once they had their time.
        await self._slots.drain(SETTLE_S if in_flight else 0.0)


async def _wait_any(tasks: set[asyncio.Task[None]], timeout_s: float) -> None:
    """Until one of ``tasks`` ends, or ``timeout_s``."""
    if not tasks or timeout_s <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait(set(tasks), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
