"""Fair share between teams, on the runner: may this team's trial start now?

The rule is services/common/fair_share.py (pure). This module gives it its counts
without a round trip per message: a **view** of the runner's pool, read at most once
per ``LOOK_S`` by whichever trial needs it first and shared by the others:

- the work stream's messages per subject of the pool (one ``STREAM.INFO`` with a
  subjects filter): per experiment, its trials queued plus running;
- the share marks of the pool in the leases bucket (one more ``STREAM.INFO``): the
  trials running per (class, team), every runner's;
- per experiment with messages, its team and share (``share.<experiment>``) and its
  pause flag: the coordinator's cached reads (a paused experiment waits for nothing);
- the team limits last published (``quota.limits``, one cached read per look): the
  share each team has **now** (``current_share``), so an operator's change of the
  quotas file's ``share``, once published (``trialbus quotas``), reaches queued work;
  the experiment's share from submit when none is published or it cannot be read.

A trial is handed back only on a view at most ``CONFIRM_S`` old (an older one is read
again first): a trial another runner ended since the last look would otherwise make
its team look over its share.

Between two looks the runner adds its own starts and ends to the counts, so its
decisions in a burst see each other. Other runners' starts since the last look are
not seen: a team may overshoot its share by what the fleet starts in ``LOOK_S``, and
the next look corrects it (docs/scheduling.md says what that costs).

A trial whose experiment has no team (no ``share.<experiment>``) reads nothing more
and takes no mark. A view that cannot be read lets the trial start (fair share is a
scheduling aid; it never stops the fleet).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

from schemas.events import TrialRequested
from schemas.subjects import Topology
from services.common.fair_share import (
    TeamShare,
    current_share,
    held_back,
    mark_key,
    marks_by_class,
    waiting,
)
from services.common.logging import get_logger
from services.common.ports import Coordinator
from services.common.priority import PriorityClasses
from services.common.quotas import Quotas, team_key

log = get_logger(__name__)

LOOK_S = 0.5
"""How old the pool view may be before a teamed trial's decision reads it again."""
READS_AT_ONCE = 16
"""A look reads this many experiments' keys side by side (each is cached for a second)."""
CONFIRM_S = 0.1
"""How old it may be to hand a trial back: a hand-back judged on an older view reads it
again first (a trial another runner ended since makes a team look over its share)."""
HAND_BACK_S = (0.2, 1.0)
"""The shortest span a held-back trial's delay is drawn from. Short: while it is away its
team may fall below its share, and a slot then idles until one of its trials returns."""
RETURNS_PER_S = 50.0
"""About how many of a held-back team's queued trials come back a second, in a pool,
however many it has queued: a team's Q queued trials handed back over a span of mean
``Q / RETURNS_PER_S`` (never shorter than ``HAND_BACK_S``). With the short span alone,
Q held-back trials fell due again Q / 0.6 times a second; a freed slot takes due
redeliveries before new messages, and each is a delivery that holds the slot while it
is handed back, so on a loaded runner a start cost dozens of deliveries (the
scheduling benchmark's quick mode: 60 per start, 3 of 8 slots idle; docs/scheduling.md)."""


def hand_back_span(queued: int) -> tuple[float, float]:
    """The span a held-back trial's delay is drawn from when its team has ``queued``
    trials waiting in the pool and class: ``HAND_BACK_S``, widened so the team's trials
    come back about ``RETURNS_PER_S`` a second (a uniform draw over [lo, hi] returns Q
    trials at Q / ((lo + hi) / 2) a second)."""
    lo, hi = HAND_BACK_S
    return lo, max(hi, 2 * queued / RETURNS_PER_S - lo)


class PoolLoad(Protocol):
    """The two counts fair share reads from the bus (services.common.adapters.nats_pool_load)."""

    async def work_counts(self, pool: str) -> Mapping[str, int]:
        """Messages per work subject of ``pool`` (queued plus running)."""

    async def share_marks(self, pool: str) -> Mapping[str, int]:
        """Share marks of ``pool`` in the leases bucket: key (relative to the bucket,
        ``_share.<pool>.<class>.<team key>.<run key>``) -> messages (1 while held)."""


@dataclass(frozen=True, slots=True)
class HeldBack:
    """A trial over its team's share while another team waits: why, in words, and the
    span its hand-back delay is drawn from (``hand_back_span``)."""

    reason: str
    wait_s: tuple[float, float] = HAND_BACK_S


@dataclass
class _View:
    at: float
    messages: dict[str, dict[str, int]] = field(default_factory=dict)
    """class -> team -> work messages of its unpaused experiments."""
    shares: dict[str, float] = field(default_factory=dict)
    """team -> share, of the teams with messages."""
    running: dict[tuple[str, str], int] = field(default_factory=dict)
    """(class, team key) -> share marks."""
    limits: Quotas | None = None
    """The team limits (shares included) last published; None: none, or unreadable."""


def _run_key(request: TrialRequested) -> str:
    # One key token: trial ids may hold '.', run ids ':' (team_key escapes both).
    return team_key(request.dedup_id())


@dataclass(eq=False)
class FairShare:
    """Decides whether a teamed trial may start (the module docstring), and tracks this
    runner's own marks between looks."""

    coordinator: Coordinator
    load: PoolLoad
    topology: Topology
    pool: str
    classes: PriorityClasses
    _: KW_ONLY
    look_s: float = LOOK_S
    """How old the pool view may be before a decision reads it again (``LOOK_S``)."""
    confirm_s: float = CONFIRM_S
    """How old it may be to hand a trial back (``CONFIRM_S``); capped at ``look_s``."""
    clock: Callable[[], float] = time.monotonic
    _view: _View | None = field(init=False, default=None)
    _lock: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)
    # This runner's starts minus ends since the last look, per (class, team key),
    # and the marks it holds (key -> (class, team key)).
    _delta: dict[tuple[str, str], int] = field(init=False, default_factory=dict)
    _mine: dict[str, tuple[str, str]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.confirm_s = min(self.confirm_s, self.look_s)

    async def admit(self, request: TrialRequested) -> str | HeldBack | None:
        """None: the trial's experiment has no team (start, no mark). HeldBack: its team
        is over its share while another waits (hand it back). Else the share mark key
        the trial must hold while it runs (counted as started from now on)."""
        team = await self.coordinator.share_of(request.experiment_id)
        if team is None:
            return None
        cls = self.classes.resolve(request.compute.priority_class)
        view = await self._current(self.look_s)
        held = self._judge(view, cls, team) if view is not None else None
        if held is not None and view is not None and self.clock() - view.at >= self.confirm_s:
            view = await self._current(self.confirm_s)
            held = self._judge(view, cls, team) if view is not None else None
        if held is not None:
            return held
        key = mark_key(self.pool, cls, team.team, _run_key(request))
        slot = (cls, team_key(team.team))
        self._mine[key] = slot
        self._delta[slot] = self._delta.get(slot, 0) + 1
        return key

    def released(self, key: str) -> None:
        """A mark this runner held is given back (or was never taken): uncount it."""
        slot = self._mine.pop(key, None)
        if slot is not None:
            self._delta[slot] = self._delta.get(slot, 0) - 1

    def _judge(self, view: _View, cls: str, stored: TeamShare) -> HeldBack | None:
        team = current_share(stored, view.limits)
        msgs = view.messages.get(cls, {})
        names = {team.team, *msgs}
        running = {
            n: max(
                0,
                view.running.get((cls, team_key(n)), 0) + self._delta.get((cls, team_key(n)), 0),
            )
            for n in names
        }
        rivals = waiting(msgs, running)
        reason = held_back(team.team, team.share, running, {t: view.shares[t] for t in rivals})
        if reason is None:
            return None
        queued = msgs.get(team.team, 0) - running[team.team]
        return HeldBack(reason, hand_back_span(queued))

    async def _current(self, max_age_s: float) -> _View | None:
        view = self._view
        if view is not None and self.clock() - view.at < max_age_s:
            return view
        async with self._lock:
            view = self._view
            if view is not None and self.clock() - view.at < max_age_s:
                return view  # another trial looked meanwhile
            try:
                fresh = await self._read()
            except Exception as exc:  # noqa: BLE001 - fail open: see the module docstring
                error = f"{type(exc).__name__}: {exc}"
                log.warning("fair share: pool view unreadable", error=error)
                return view
            self._view = fresh
            return fresh

    async def _read(self) -> _View:
        at = self.clock()
        # The look counts this runner's marks itself: what it adds from here on is new.
        self._delta = {}
        work, marks, limits = await asyncio.gather(
            self.load.work_counts(self.pool),
            self.load.share_marks(self.pool),
            self._published_limits(),
        )
        view = _View(at=at, running=marks_by_class(marks, self.pool), limits=limits)
        queued: list[tuple[str, str, int]] = []  # (class, experiment, messages)
        for subject, n in work.items():
            parsed = self.topology.parse_work_subject(subject)
            if parsed is not None and n > 0 and parsed[0] == self.pool:
                queued.append((self.classes.resolve(parsed[1]), parsed[2], n))

        at_once = asyncio.Semaphore(READS_AT_ONCE)

        async def about(exp: str) -> TeamShare | None:
            async with at_once:
                team = await self.coordinator.share_of(exp)
                return None if team is None or await self.coordinator.is_paused(exp) else team

        teams = await asyncio.gather(*(about(exp) for _, exp, _ in queued))
        for (cls, _exp, n), team in zip(queued, teams, strict=True):
            if team is None:
                continue  # no team, or paused: waits for nothing here
            per_team = view.messages.setdefault(cls, {})
            per_team[team.team] = per_team.get(team.team, 0) + n
            view.shares[team.team] = current_share(team, limits).share
        return view

    async def _published_limits(self) -> Quotas | None:
        try:
            return await self.coordinator.team_limits()
        except Exception as exc:  # noqa: BLE001 - fail open to the shares stored at submit
            log.warning("fair share: team limits unreadable", error=type(exc).__name__)
            return None
