"""In-memory runner registry for unit tests: the contract of nats_registry, no server.

Records expire ``ttl_s`` after their last announcement, measured on an injectable
clock so a test can let time pass without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from schemas.runners import RunnerInfo, registry_key


class MemoryRunnerRegistry:
    """:class:`~services.common.adapters.nats_registry.RunnerRegistry` in a dict."""

    def __init__(self, ttl_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._records: dict[str, tuple[float, RunnerInfo]] = {}

    async def announce(self, info: RunnerInfo) -> None:
        """Write the runner's record; it lives ``ttl_s`` from now."""
        self._records[registry_key(info.pool, info.runner_id)] = (self._clock(), info)

    async def withdraw(self, info: RunnerInfo) -> None:
        """Remove the runner's record (no error when it is already gone)."""
        self._records.pop(registry_key(info.pool, info.runner_id), None)

    async def live_runners(self) -> list[RunnerInfo]:
        """Records announced within ``ttl_s``, sorted by pool and runner id."""
        now = self._clock()
        live = [info for at, info in self._records.values() if now - at < self.ttl_s]
        return sorted(live, key=lambda r: (r.pool, r.runner_id))
