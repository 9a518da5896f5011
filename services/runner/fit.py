"""Whether another live runner of the pool can run a trial this one cannot (``Peers``).

A pool is meant to be a set of like runners, and often is not: one machine holds an
API key another lacks, or has docker, or bubblewrap. The submitter accepts a manifest
when one live runner of its pool has what it needs (services/common/pools.py), but
every runner of the pool takes work from the same durable. So a runner that lacks
what a trial needs (an environment or label it does not offer, an agent's
``api_key_env`` variable it does not have: services.common.fit) hands the trial back
for another live runner of its pool that has it (the registry says who: ``Peers``), with no
attempt counted; it ends the trial (final ``RunnerLacksCapability``) only when no
other live runner has it, since then waiting would hold the trial forever.

A task's own ``${NAME}`` variables count the same way when the work message names them
(``TrialRequested.task_variables``: the submitter read them from task.toml). A task
given by checksum names none; its variables are known only once its archive is
unpacked, and the trial process checks them (MissingSecretError, final), as it checks
the agent's keys and the task's again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from schemas.events import TrialRequested
from schemas.runners import RunnerInfo
from services.common.fit import can_run
from services.common.logging import get_logger
from services.common.ports import RunnerRegistry

log = get_logger(__name__)

PEERS_TTL_S = 2.0
"""The live runners are read again after this long (one KV listing per runner then,
however many trials it hands back meanwhile)."""


@dataclass(slots=True)
class Peers:
    """The other live runners, read through the registry at most every ``ttl_s``."""

    registry: RunnerRegistry
    runner_id: str
    ttl_s: float = PEERS_TTL_S
    clock: Callable[[], float] = time.monotonic
    _runners: list[RunnerInfo] | None = None
    _read_at: float = 0.0

    async def another_can_run(self, request: TrialRequested) -> bool:
        """Whether a live runner other than this one has what ``request`` needs. A
        registry that cannot be read counts as yes: the trial waits in the queue (and
        this is asked again) rather than failing for a moment's outage."""
        try:
            runners = await self._live()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("runner registry unreadable", error=f"{type(exc).__name__}: {exc}")
            return True
        return any(r.runner_id != self.runner_id and can_run(r, request) for r in runners)

    async def _live(self) -> list[RunnerInfo]:
        now = self.clock()
        if self._runners is None or now - self._read_at >= self.ttl_s:
            self._runners = await self.registry.live_runners()
            self._read_at = now
        return self._runners
