"""A Harbor agent that shows every runner variable it can find, as a curious agent would.

Used by tests/security/test_trial_environment.py through ``import_path``
(``tests.support.environ_agent:EnvironAgent``; an import-path agent runs in the
trial's own process). It prints, into its live output and ``agent/environ.txt``:

- ``os.environ`` of the trial's process (what Harbor, agents and their child
  programs read), one ``NAME=value`` line each;
- the process's environment block (``/proc/self/environ``) and its parent's (the
  runner's forkserver), which ``os.environ`` changes do not touch;
- the environment of a command in its sandbox (``env``: what a task's commands see);
- for each variable named in ``api_key_env``, the sha256 of the value it sees: the
  value itself is redacted on its way out, the digest shows it was the real one.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from tests.support.harbor_agent import SupportAgent

GRANTED = "ENVIRON_PROBE_CRED"
"""The variable the test's manifest names in api_key_env."""


def _block(path: str) -> list[str]:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        return [f"(unreadable: {exc.strerror})"]
    return [e.decode(errors="replace") for e in raw.split(b"\0") if e]


def dump() -> str:
    """Every variable this process can see, as text (module docstring)."""
    lines = ["== os.environ"]
    lines += [f"{k}={v}" for k, v in sorted(os.environ.items())]
    lines.append("== /proc/self/environ")
    lines += _block("/proc/self/environ")
    lines.append("== /proc/parent/environ")
    lines += _block(f"/proc/{os.getppid()}/environ")
    value = os.environ.get(GRANTED)
    digest = hashlib.sha256(value.encode()).hexdigest() if value else "absent"
    lines.append(f"== granted {GRANTED} sha256={digest}")
    return "\n".join(lines)


class EnvironAgent(SupportAgent):
    """Shows its environment (see the module docstring)."""

    agent_name = "environ-probe"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Print the dump and the sandbox's environment; keep both in environ.txt."""
        text = dump()
        result = await environment.exec(
            "cat <<'TRIALBUS_EOF'\n" + text + "\nTRIALBUS_EOF\necho '== sandbox env'; env"
        )
        (self.logs_dir / "environ.txt").write_text(f"{result.stdout}\n{result.stderr}\n")
