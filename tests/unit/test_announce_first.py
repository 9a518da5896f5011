"""A runner's first registry announcement waits out a stream without a leader.

The registry here is the in-memory fake made to fail as nats-py does while a
replicated bucket elects its leader (``NoStreamResponseError``); the real cluster
side is tests/integration/test_stream_leaders.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from nats.js.errors import NoStreamResponseError

from schemas.runners import RunnerInfo
from services.common.adapters.memory_registry import MemoryRunnerRegistry
from services.common.adapters.nats_registry import announce_first, heartbeat
from services.common.errors import TransientError

INFO = RunnerInfo(runner_id="r-1", host="h", concurrency=1)


@dataclass
class Unanswered(MemoryRunnerRegistry):
    """Fails its first ``failures`` announcements with ``error``."""

    failures: int = 0
    error: Exception = field(default_factory=NoStreamResponseError)
    tries: int = 0

    def __post_init__(self) -> None:
        super().__init__()

    async def announce(self, info: RunnerInfo) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise self.error
        await super().announce(info)


async def test_an_unanswered_first_announcement_is_tried_again() -> None:
    registry = Unanswered(failures=3)
    await announce_first(registry, INFO, wait_s=30.0)
    assert registry.tries == 4
    assert [r.runner_id for r in await registry.live_runners()] == ["r-1"]


async def test_the_heartbeat_starts_once_the_registry_answers() -> None:
    registry = Unanswered(failures=2)
    async with heartbeat(registry, INFO, interval_s=60.0):
        assert [r.runner_id for r in await registry.live_runners()] == ["r-1"]
    assert await registry.live_runners() == []


async def test_a_registry_that_never_answers_stops_the_runner_with_a_named_cause() -> None:
    registry = Unanswered(failures=10**6)
    with pytest.raises(TransientError, match=r"registry did not answer for 0 s .*NoStreamResponse"):
        await announce_first(registry, INFO, wait_s=0.3)
    assert registry.tries >= 2  # it did try again before giving up


async def test_a_refusal_is_not_retried() -> None:
    registry = Unanswered(failures=10**6, error=PermissionError("not yours"))
    with pytest.raises(PermissionError):
        await announce_first(registry, INFO, wait_s=30.0)
    assert registry.tries == 1
