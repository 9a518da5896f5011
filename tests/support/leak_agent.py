"""A Harbor agent that prints the secrets it can see, as a careless or hostile agent would.

Used by tests/integration/test_live_logs_harbor.py through ``import_path``
(``tests.support.leak_agent:LeakAgent``). In its environment it runs commands whose
output holds: the variables its ``api_key_env`` hands it (``$NAME``), one of them in
base64, and a value it read from the process environment itself (an import-path agent
runs in the trial's process, which inherits the runner's environment). It also writes
what it saw into ``agent/leak.txt`` in its log folder.
"""

from __future__ import annotations

import os

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from tests.support.harbor_agent import SupportAgent

SHOWN = ("OPENAI_API_KEY", "MYLLM_CRED")
"""Variables the agent prints from its environment (the test's api_key_env)."""
FROM_PROCESS = "LEDGER_URL"
"""Read from the process environment by the agent's own code, then printed."""


class LeakAgent(SupportAgent):
    """Prints its secrets (see the module docstring)."""

    @staticmethod
    def name() -> str:
        """Harbor's agent name."""
        return "leak-agent"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Print the secrets into the live output; keep a copy in the log folder."""
        commands = [f'echo "{name}=${name}"' for name in SHOWN]
        commands.append(f'printf %s "${SHOWN[0]}" | base64')
        commands.append(f"echo 'runner {FROM_PROCESS}: {os.environ.get(FROM_PROCESS, '')}'")
        result = await environment.exec("; ".join(commands))
        (self.logs_dir / "leak.txt").write_text(f"{result.stdout}\n{result.stderr}\n")
