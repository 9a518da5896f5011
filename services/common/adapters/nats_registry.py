"""The runner registry over a NATS KV bucket: who is alive, in which pool, able to run what.

Each runner keeps one :class:`~schemas.runners.RunnerInfo` (JSON) under the key
``<pool>.<runner_id>`` of ``Topology.runners_bucket``. The bucket's max age (set by
the admin when provisioning, infra.nats_provision) is the record's time to live: a
runner rewrites its record every ``ttl / HEARTBEATS_PER_TTL`` seconds
(:func:`heartbeat`), so a runner that dies silently drops out after at most one TTL
and one that stops cleanly deletes its record at once. Keys start with the pool so a
runner user's write right is one pool's keys (infra/nats_permissions.py); a pool's
runners share one user, so one runner could overwrite another of the SAME pool's
record, not another pool's.

The port is services.common.ports.RunnerRegistry (the submitter reads, the runner
writes). services.common.adapters.memory_registry is the fake with the same contract
(tests/integration/test_runner_registry.py runs one suite against both).

Listing reads the bucket's subjects with ``STREAM.INFO`` (a subjects filter) and each
record with a direct get: both rights the submitter and runners already have, so no
role needs to create consumers on the bucket (which ``kv.keys()`` would).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from nats.js import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from schemas.runners import RunnerInfo, RunnerLoad, registry_key
from schemas.subjects import Topology
from services.common.adapters.jetstream import LEADER_WAIT_S, UNANSWERED, kv_config, open_kv
from services.common.errors import TransientError
from services.common.logging import get_logger
from services.common.ports import RunnerRegistry
from services.common.service import running_beside

log = get_logger(__name__)

HEARTBEATS_PER_TTL = 3
"""A record is rewritten this many times per TTL: two lost heartbeats drop no runner."""

LOAD_CHECK_S = 1.0
"""How often a heartbeat looks whether the runner's load changed (then it rewrites)."""

DEFAULT_TTL_S = 60.0
"""The bucket's max age when a runner has to create it (no provisioned stack)."""


class NatsRunnerRegistry:
    """:class:`RunnerRegistry` over the KV bucket ``Topology.runners_bucket``."""

    def __init__(self, js: JetStreamContext, kv: KeyValue, bucket: str, ttl_s: float) -> None:
        self._js = js
        self._kv = kv
        self._bucket = bucket
        self.ttl_s = ttl_s

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        topology: Topology,
        *,
        create_ttl_s: float = DEFAULT_TTL_S,
        replicas: int = 1,
    ) -> NatsRunnerRegistry:
        """Bind the bucket; create it (TTL ``create_ttl_s``, ``replicas`` copies: the
        streams' replication, so one node down never empties the registry) only where
        it is missing.

        On a stack with per-role users it exists (the admin provisioned it) and only
        its status is read, which runners and the submitter may do.
        """
        name = topology.runners_bucket
        kv = await open_kv(js, kv_config(name, ttl_s=create_ttl_s, replicas=replicas))
        ttl = (await kv.status()).ttl
        return cls(js, kv, name, float(ttl) if ttl else create_ttl_s)

    @property
    def heartbeat_s(self) -> float:
        """How often a runner should rewrite its record."""
        return self.ttl_s / HEARTBEATS_PER_TTL

    async def announce(self, info: RunnerInfo) -> None:
        """Write the runner's record under ``<pool>.<runner_id>``."""
        await self._kv.put(registry_key(info.pool, info.runner_id), info.model_dump_json().encode())

    async def withdraw(self, info: RunnerInfo) -> None:
        """Delete the runner's record (a delete marker; it expires with the TTL)."""
        await self._kv.delete(registry_key(info.pool, info.runner_id))

    async def live_runners(self) -> list[RunnerInfo]:
        """Every record not expired nor deleted; a malformed one is logged and skipped."""
        prefix = f"$KV.{self._bucket}."
        state = (await self._js.stream_info(f"KV_{self._bucket}", subjects_filter=">")).state
        out: list[RunnerInfo] = []
        for subject in sorted(state.subjects or {}):
            key = subject.removeprefix(prefix)
            try:
                entry = await self._kv.get(key)
            except (KeyNotFoundError, KeyDeletedError):
                continue  # withdrawn, or expired since the listing
            try:
                out.append(RunnerInfo.model_validate_json(entry.value or b""))
            except ValidationError as exc:
                log.warning("malformed runner record skipped", key=key, errors=exc.error_count())
        return sorted(out, key=lambda r: (r.pool, r.runner_id))


async def announce_first(
    registry: RunnerRegistry, info: RunnerInfo, wait_s: float = LEADER_WAIT_S
) -> None:
    """Announce ``info``, retrying for up to ``wait_s`` while no stream leader answers.

    A runner starting while the bucket's nodes elect a leader (a node restarting, a
    bucket just created on a loaded cluster) meets "no response from stream" for a
    moment; that must not stop it. TransientError after ``wait_s``; a refusal (e.g. a
    missing right) is raised at once.
    """
    deadline = asyncio.get_running_loop().time() + wait_s
    delay = 0.1
    while True:
        try:
            await registry.announce(info)
            return
        except UNANSWERED as exc:
            error = f"{type(exc).__name__}: {exc}"
            if asyncio.get_running_loop().time() >= deadline:
                raise TransientError(
                    f"the runner registry did not answer for {wait_s:.0f} s ({error})"
                ) from exc
            log.warning("runner announcement unanswered; retrying", error=error)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


@contextlib.asynccontextmanager
async def heartbeat(
    registry: RunnerRegistry,
    info: RunnerInfo,
    interval_s: float,
    load: Callable[[], RunnerLoad] | None = None,
) -> AsyncIterator[None]:
    """Keep ``info`` announced while the block runs; withdraw it when the block ends.

    The first announcement happens before the block starts (:func:`announce_first`:
    a runner the registry does not answer within its wait should not start). Later
    ones that fail are logged and retried at the next beat (a NATS blip must not stop
    a runner).

    ``load`` (the runner's trials in flight, done and failed) goes into each record;
    when it changes the record is rewritten within ``LOAD_CHECK_S`` rather than at the
    next beat, so the fleet view follows a runner's work without waiting a whole beat
    (at most one write per ``LOAD_CHECK_S``, and none while nothing changes).
    """
    current = load() if load is not None else None
    await announce_first(registry, info.seen_now(current))

    async def beat() -> None:
        nonlocal current
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(interval_s, LOAD_CHECK_S) if load else interval_s)
            now_load = load() if load is not None else None
            if now_load == current and time.monotonic() - last < interval_s:
                continue
            # Taken as written even when the write fails: the next try is at the next
            # beat, not every LOAD_CHECK_S (one warning per beat while NATS is away).
            current, last = now_load, time.monotonic()
            try:
                await registry.announce(info.seen_now(now_load))
            except Exception as exc:  # noqa: BLE001 - reconnecting; try at the next beat
                log.warning("runner heartbeat failed", error=f"{type(exc).__name__}: {exc}")

    try:
        async with running_beside(beat()):
            yield
    finally:
        try:
            await registry.withdraw(info)
        except Exception as exc:  # noqa: BLE001 - the record expires with the TTL anyway
            log.warning("runner withdrawal failed", error=f"{type(exc).__name__}: {exc}")
