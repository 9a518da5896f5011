"""The base of the Harbor agents the tests load by ``import_path``.

Each agent in tests/support is a few lines of behaviour in ``run``; what Harbor asks
of every agent besides (a version, a setup step) is the same for all, and kept here.
"""

from __future__ import annotations

from typing import ClassVar

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment


class SupportAgent(BaseAgent):  # type: ignore[misc]  # Harbor ships no types
    """An agent with nothing to install; subclasses give ``agent_name`` and ``run``."""

    agent_name: ClassVar[str]
    """Harbor's agent name (what ``name()`` answers)."""

    @classmethod
    def name(cls) -> str:
        """Harbor's agent name."""
        return cls.agent_name

    def version(self) -> str:
        """Agent version (recorded by Harbor)."""
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        """Nothing to install."""
