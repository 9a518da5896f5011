"""A Harbor agent that reports the process-wide state it finds, then changes all of it.

Used by tests/unit/test_trial_isolation.py through ``import_path``
(``tests.support.probe_agent:ProbeAgent``). Each run writes ``probe.json`` into its
agent log folder (``<trial_dir>/agent/``) with two snapshots: ``before`` (what the
trial found) and ``after`` (after its own changes, which shows the probe can see a
change at all). What it changes, like a careless agent or library would:

- litellm's process-wide price table (``register_model``, as terminus-2 does with
  ``model_info``), under the model name ``PROBE_MODEL``;
- ``os.environ`` (``PROBE_ENV``);
- the working directory (into the agent's log folder);
- logging: the root logger's level and a handler on it;
- its own module's globals (``RUNS``), as a patched or stateful agent module would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from typing import Any

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from tests.support.harbor_agent import SupportAgent

PROBE_MODEL = "probe/isolation-model"
PROBE_ENV = "TRIALBUS_PROBE_LEAK"
RUNS = 0


def snapshot() -> dict[str, Any]:
    """The process-wide state this agent changes, as it is now."""
    import litellm

    root = logging.getLogger()
    return {
        "price": (litellm.model_cost.get(PROBE_MODEL) or {}).get("input_cost_per_token"),
        "env": os.environ.get(PROBE_ENV),
        "cwd": os.getcwd(),
        "root_level": root.level,
        "root_handlers": len(root.handlers),
        "module_runs": RUNS,
    }


class ProbeAgent(SupportAgent):
    """Reports, then pollutes, the process it runs in (see the module docstring)."""

    agent_name = "isolation-probe"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Snapshot, change every piece of state, snapshot again, write probe.json."""
        global RUNS
        import litellm

        before = snapshot()
        litellm.register_model(
            {PROBE_MODEL: {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}}
        )
        os.environ[PROBE_ENV] = str(self.logs_dir)
        os.chdir(self.logs_dir)
        logging.getLogger().setLevel(logging.CRITICAL)
        logging.getLogger().addHandler(logging.NullHandler())
        RUNS += 1
        report = {"before": before, "after": snapshot(), "pid": os.getpid()}
        (self.logs_dir / "probe.json").write_text(json.dumps(report))


class SleepyAgent(ProbeAgent):
    """Writes ``started`` into its log folder, then waits forever (cancellation tests)."""

    agent_name = "sleepy-probe"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Announce the start with a file, then never finish."""
        (self.logs_dir / "started").write_text(str(os.getpid()))
        await asyncio.Event().wait()


LINGER_CAP_S = 30.0


class LingeringAgent(ProbeAgent):
    """Finishes at once but leaves a thread that keeps its process from exiting until
    ``release`` appears in its log folder (at most ``LINGER_CAP_S``): a trial whose
    process outlives its ending."""

    agent_name = "lingering-probe"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Write ``pid``, start the lingering (non-daemon) thread, return."""
        release = self.logs_dir / "release"

        def linger() -> None:
            deadline = time.monotonic() + LINGER_CAP_S
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.02)

        (self.logs_dir / "pid").write_text(str(os.getpid()))
        threading.Thread(target=linger, name="lingering", daemon=False).start()
