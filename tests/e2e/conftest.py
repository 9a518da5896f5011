"""Stack fixtures for every end-to-end test, in one place.

Each test gets its own names inside the session's servers (a topology prefix and a
database, from tests/conftest.py) and its own data folder under ``tmp_path``, so tests
never see each other's streams, records or job folders. Stacks and event taps a test
opens are stopped when it ends, whatever happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest

from infra.stack import EmbeddedStack
from tests.e2e.cli import Cli
from tests.e2e.events import EventTap
from tests.support.servers import Servers


class Started(NamedTuple):
    """A started stack, an event tap on it and the ``trialbus`` command pointed at it."""

    stack: EmbeddedStack
    tap: EventTap
    cli: Cli


@dataclass
class Stacks:
    """Builds this test's stacks (own data folder each) and remembers them for teardown."""

    servers: Servers
    """The test's names in the session's servers; its stacks connect to them."""
    made: list[EmbeddedStack] = field(default_factory=list)
    taps: list[EventTap] = field(default_factory=list)

    def make(self, **kw: Any) -> EmbeddedStack:
        """An EmbeddedStack on the test's names and servers (not started); ``kw`` overrides."""
        s = self.servers
        options: dict[str, Any] = {
            "prefix": s.prefix,
            "ledger_db": s.ledger_db,
            "nats_url": s.nats_url,
            "ledger_url": s.ledger_url,
            **kw,
        }
        stack = EmbeddedStack(s.tmp_path / f"stack{len(self.made)}", **options)
        self.made.append(stack)
        return stack

    async def start(self, **kw: Any) -> EmbeddedStack:
        """:meth:`make`, then start it (start() blocks until every service is ready)."""
        stack = self.make(**kw)
        await asyncio.to_thread(stack.start)
        return stack

    def cli(self, stack: EmbeddedStack, **extra_env: str) -> Cli:
        """The ``trialbus`` command pointed at ``stack``."""
        return Cli(
            nats_url=stack.nats_url or "",
            ledger_url=stack.ledger_url or "",
            prefix=stack.prefix,
            ledger_db=stack.ledger_db,
            stack_file=self.servers.tmp_path / "no-stack.json",
            extra_env=tuple(extra_env.items()),
        )

    async def tap(self, stack: EmbeddedStack) -> EventTap:
        """An EventTap on ``stack``'s events stream (closed at teardown)."""
        tap = await EventTap(stack.nats_url or "", self.servers.topology).start()
        self.taps.append(tap)
        return tap

    async def started(self, **kw: Any) -> Started:
        """:meth:`start` (``kw`` as there), then its :meth:`tap` and :meth:`cli`: what
        most end-to-end tests begin with."""
        stack = await self.start(**kw)
        return Started(stack, await self.tap(stack), self.cli(stack))


@pytest.fixture
async def stacks(servers: Servers) -> AsyncIterator[Stacks]:
    """Start stacks and taps for this test; all are stopped at its end."""
    made = Stacks(servers)
    try:
        yield made
    finally:
        for tap in made.taps:
            await tap.close()
        for stack in made.made:
            await asyncio.to_thread(stack.stop)


@pytest.fixture
def stack(stacks: Stacks) -> EmbeddedStack:
    """One started stack with the default settings (4 trial slots, real Harbor runner)."""
    s = stacks.make(concurrency=4)
    s.start()  # stopped by ``stacks`` at teardown
    return s


@pytest.fixture
def cli(stacks: Stacks, stack: EmbeddedStack) -> Cli:
    """The ``trialbus`` command pointed at :func:`stack`."""
    return stacks.cli(stack)
