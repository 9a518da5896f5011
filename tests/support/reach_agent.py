"""A Harbor agent that reads every file it can under one host folder, from its sandbox.

Used by tests/security/test_runner_files_in_trials.py through ``import_path``
(``tests.support.reach_agent:ReachAgent``, with the agent kwarg ``probe_root``): in
the trial's sandbox it prints ``<path>:<line>`` for every line of every file below
``probe_root`` (``grep -r``), then the process list of its ``/proc``, and keeps the
output in ``agent/reach.txt`` (the stored trial folder), as a curious task would.
"""

from __future__ import annotations

import shlex
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext


class ReachAgent(BaseAgent):  # type: ignore[misc]  # Harbor ships no types
    """Reads what it can under ``probe_root`` (see the module docstring)."""

    def __init__(self, *args: Any, probe_root: str = "/var/tmp", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._root = probe_root

    @staticmethod
    def name() -> str:
        """Harbor's agent name."""
        return "reach-probe"

    def version(self) -> str:
        """Agent version (recorded by Harbor)."""
        return "1.0.0"

    async def setup(self, environment: BaseEnvironment) -> None:
        """Nothing to install."""

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Read everything below the root; keep the output in reach.txt."""
        result = await environment.exec(
            f"echo '== files'; grep -r -s . {shlex.quote(self._root)}; "
            "echo '== processes'; ls /proc | grep -cE '^[0-9]+$'; echo '== end'"
        )
        (self.logs_dir / "reach.txt").write_text(f"{result.stdout}\n{result.stderr}\n")
