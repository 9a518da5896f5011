"""9. The runner's path to a trial's start: before the issue-12 change and now.

What the runner's handler awaits between taking a work message and handing the trial
to the executor, replayed on a fresh nats-server without the rest of the runner:

- **before** (the KV calls as they were, kept here as the reference): the ending check
  (KV get), the experiment's lease (KV create on a slot key that an earlier trial
  released by KV purge: nats-py's create then fails, reads the purge marker and
  updates, three round trips), the attempt counter (KV get, then create), and the
  TrialStarted publish, awaited before the trial starts;
- **now** (trialbus's own ``NatsCoordinator``, in the order of
  services/runner/admission.py): the ending check and the lease together
  (``asyncio.gather``); a lease taken by one conditional write per probed slot and
  released by a stream purge of its subject (no marker left behind); the attempt
  counted by a conditional write first; the trial starts while TrialStarted's publish
  is in flight (awaited before the trial's ending would be published).

- **team** (issue 14's team quotas): **now** for a trial whose team has a concurrency
  quota, the team's slot taken beside the experiment's (``acquire_team`` in the same
  ``gather``) and released with it. A trial without such a quota runs **now**.

Each is measured on an idle event loop and on one kept busy the way Harbor's
synchronous work keeps the runner's loop busy (a task that blocks it for
``HOG_BLOCK_S`` out of every ``HOG_PERIOD_S``), with ``CONCURRENT`` trials starting
at once, which is where the overhead benchmark's slots lose their time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections.abc import Awaitable, Callable

import nats
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from benchmarks.harness import BenchResult, Context, Figure, fresh_dir, median, percentile
from infra.embedded import NatsServer
from schemas.subjects import Topology
from services.common.adapters.nats_kv import NatsCoordinator
from services.common.ports import Lease

CONCURRENT = 8
HOG_BLOCK_S = 0.010
HOG_PERIOD_S = 0.020
LIMIT = 16


class Paths:
    """Both dispatch paths over one coordinator, one events stream and one client."""

    def __init__(self, js: JetStreamContext, coord: NatsCoordinator, topo: Topology) -> None:
        self.js = js
        self.coord = coord
        self.topo = topo
        self.exp = "exp-" + secrets.token_hex(3)
        self.pending: set[asyncio.Future[object]] = set()

    def _started(self, run_id: str) -> bytes:
        return b'{"type":"trial_started","run_id":"' + run_id.encode() + b'"}'

    async def before(self, run_id: str) -> float:
        """Seconds to the trial's start; the lease is released afterwards (not timed)."""
        t0 = time.perf_counter()
        await self.coord.ending(run_id)
        await self.coord.is_cancelled(self.exp)
        lease = None
        while lease is None:
            lease = await self._create_lease()
        await self._attempt_get_first(run_id)
        await self.js.publish(f"{self.topo.prefix}.events.started.x", self._started(run_id))
        started = time.perf_counter() - t0
        await self.coord.leases.purge(lease.key)  # a KV purge: leaves a marker
        return started

    async def now(self, run_id: str) -> float:
        """The same with the coordinator's calls, in the handler's order."""
        t0 = time.perf_counter()
        _cancelled = await self.coord.is_cancelled(self.exp)
        _ended, lease = await asyncio.gather(
            self.coord.ending(run_id), self.coord.acquire(self.exp, LIMIT, "runner")
        )
        while lease is None:
            lease = await self.coord.acquire(self.exp, LIMIT, "runner")
        await self.coord.next_attempt(run_id)
        ack = asyncio.ensure_future(
            self.js.publish(f"{self.topo.prefix}.events.started.x", self._started(run_id))
        )
        started = time.perf_counter() - t0
        await ack  # before the ending would be published
        await self.coord.release(lease)
        return started

    async def team(self, run_id: str) -> float:
        """**now** with a team slot taken beside the experiment's, as the handler does."""
        t0 = time.perf_counter()
        _cancelled = await self.coord.is_cancelled(self.exp)
        while True:
            _ended, lease, team = await asyncio.gather(
                self.coord.ending(run_id),
                self.coord.acquire(self.exp, LIMIT, "runner"),
                self.coord.acquire_team("bench-team", LIMIT, "runner"),
            )
            if lease is not None and team is not None:
                break
            for held in (lease, team):
                if held is not None:
                    await self.coord.release(held)
        await self.coord.next_attempt(run_id)
        ack = asyncio.ensure_future(
            self.js.publish(f"{self.topo.prefix}.events.started.x", self._started(run_id))
        )
        started = time.perf_counter() - t0
        await ack
        await asyncio.gather(self.coord.release(lease), self.coord.release(team))
        return started

    async def _create_lease(self) -> Lease | None:
        """The lease as it was taken: nats-py's ``create`` per probed slot."""
        leases = self.coord.leases  # the coordinator's own bucket handle
        start = random.randrange(LIMIT)
        for step in range(LIMIT):
            key = f"{self.exp}.{(start + step) % LIMIT}"
            try:
                return Lease(key, await leases.create(key, b"runner"))
            except KeyWrongLastSequenceError:
                continue
        return None

    async def _attempt_get_first(self, run_id: str) -> int:
        """The attempt counter as it was: a get, then a create for a first attempt."""
        control = self.coord.control  # the coordinator's own bucket handle
        key = f"runs.{run_id}"
        try:
            entry = await control.get(key)
        except KeyNotFoundError:
            await control.create(key, b"1")
            return 1
        n = int(entry.value or b"0") + 1
        await control.update(key, str(n).encode(), last=entry.revision)
        return n


async def _hog(stop: asyncio.Event) -> None:
    """Block the loop for HOG_BLOCK_S every HOG_PERIOD_S (synchronous work on the loop)."""
    while not stop.is_set():
        time.sleep(HOG_BLOCK_S)  # noqa: ASYNC251 - blocking the loop is the point
        await asyncio.sleep(HOG_PERIOD_S - HOG_BLOCK_S)


async def _measure(path: Callable[[str], Awaitable[float]], n: int, *, busy: bool) -> list[float]:
    stop = asyncio.Event()
    hog = asyncio.create_task(_hog(stop)) if busy else None
    out: list[float] = []
    try:
        for i in range(0, n, CONCURRENT):
            ids = [f"run-{secrets.token_hex(6)}" for _ in range(min(CONCURRENT, n - i))]
            out += await asyncio.gather(*(path(r) for r in ids))
    finally:
        stop.set()
        if hog is not None:
            await hog
    return out


async def measure(nats_url: str, n: int) -> dict[str, list[float]]:
    """Milliseconds to start, per path and loop state."""
    nc = await nats.connect(nats_url, name="bench-dispatch")
    try:
        js = nc.jetstream()
        topo = Topology("micro" + secrets.token_hex(2))
        await js.add_stream(StreamConfig(name=topo.events_stream, subjects=[f"{topo.prefix}.>"]))
        coord = await NatsCoordinator.open(js, topo, lease_ttl_s=60)
        out: dict[str, list[float]] = {}
        for name in ("before", "now", "team"):
            # Each path on its own experiment's slot keys, warmed by itself: the old
            # releases leave purge markers, which the new lease never reuses (they go
            # with the leases bucket's TTL after a switch-over).
            paths = Paths(js, coord, topo)
            path = {"before": paths.before, "now": paths.now, "team": paths.team}[name]
            await _measure(path, 2 * LIMIT, busy=False)
            for busy in (False, True):
                key = f"{name}_{'busy' if busy else 'idle'}"
                out[key] = [1000 * s for s in await _measure(path, n, busy=busy)]
                with contextlib.suppress(Exception):
                    await js.purge_stream(topo.events_stream)
        return out
    finally:
        await nc.close()


def run(ctx: Context) -> BenchResult:
    n = 16 if ctx.quick else 400
    per_run: list[dict[str, list[float]]] = []
    for r in range(ctx.runs):
        ctx.log(f"dispatch run {r + 1}/{ctx.runs}: {n} starts per path")
        with NatsServer(fresh_dir(ctx.path(f"dispatch-{r}")) / "nats") as server:
            per_run.append(asyncio.run(measure(server.url, n)))

    def p(key: str, q: float) -> float:
        return median([percentile(run[key], q) for run in per_run])

    keys = ("before_idle", "now_idle", "team_idle", "before_busy", "now_busy", "team_busy")
    peers = [Figure(f"{k}_p50", p(k, 50), "ms") for k in keys]
    peers += [Figure(f"{k}_p99", p(k, 99), "ms") for k in keys]
    ratio = [median(run["now_busy"]) / median(run["before_busy"]) for run in per_run]
    peers.append(
        Figure(
            "idle_ratio",
            p("now_idle", 50) / p("before_idle", 50),
            "ratio",
            "now / before, p50, idle loop",
        )
    )
    peers.append(
        Figure(
            "team_idle_ratio",
            p("team_idle", 50) / p("now_idle", 50),
            "ratio",
            "a team-quota'd start / an unquota'd one, p50, idle loop",
        )
    )
    return BenchResult.ratio(
        "dispatch",
        "Runner's path to a trial's start, busy loop: now / before (p50)",
        ratio,
        0.5,
        peers,
        {
            "starts_per_path": n,
            "concurrent": CONCURRENT,
            "hog": f"{HOG_BLOCK_S * 1000:g} ms of every {HOG_PERIOD_S * 1000:g} ms",
            "slots": LIMIT,
            "runs": ctx.runs,
        },
    )
