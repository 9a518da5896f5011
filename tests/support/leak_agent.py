"""A Harbor agent that prints the secrets it can see, as a careless or hostile agent would.

Used by tests/integration/test_live_logs_harbor.py through ``import_path``
(``tests.support.leak_agent:LeakAgent``). In its environment it runs commands whose
output holds: the variables its ``api_key_env`` hands it (``$NAME``), one of them in
base64, and a runner variable its own code found: the trial's process no longer holds
the runner's environment (services.runner.trial_env), so it reads the block of the
nearest process up the tree that shows it (``/proc/<pid>/environ``: the test's runner,
as a same-user agent still can). It also writes what it saw into ``agent/leak.txt``
in its log folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from tests.support.harbor_agent import SupportAgent

SHOWN = ("OPENAI_API_KEY", "MYLLM_CRED")
"""Variables the agent prints from its environment (the test's api_key_env)."""
FROM_PROCESS = "LEDGER_URL"
"""Read by the agent's own code from a process up the tree, then printed."""


def runner_variable(name: str) -> str:
    """``name``'s value in the nearest process up the tree whose environment block
    (``/proc/<pid>/environ``) holds it; empty when none does."""
    prefix = f"{name}=".encode()
    pid = os.getpid()
    while pid > 1:
        try:
            block = Path(f"/proc/{pid}/environ").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return ""
        for entry in block.split(b"\0"):
            if entry.startswith(prefix):
                return entry[len(prefix) :].decode(errors="replace")
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return ""


class LeakAgent(SupportAgent):
    """Prints its secrets (see the module docstring)."""

    agent_name = "leak-agent"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Print the secrets into the live output; keep a copy in the log folder."""
        commands = [f'echo "{name}=${name}"' for name in SHOWN]
        commands.append(f'printf %s "${SHOWN[0]}" | base64')
        commands.append(f"echo 'runner {FROM_PROCESS}: {runner_variable(FROM_PROCESS)}'")
        result = await environment.exec("; ".join(commands))
        (self.logs_dir / "leak.txt").write_text(f"{result.stdout}\n{result.stderr}\n")
