"""A Harbor agent that prints its secrets (LeakAgent), then fails quoting them.

Used by tests/integration/test_redaction_harbor.py. The exception it raises is a
RuntimeError (retryable by Harbor's error policy, so the runner publishes its
message in a TrialFailed) whose message holds a secret Harbor does not scrub (the
value of ``MYLLM_CRED``, whose name is not KEY/SECRET/TOKEN-like), the base64 form of
``OPENAI_API_KEY`` and the runner's ledger password; Harbor writes that message into
result.json, and LeakAgent's ``agent/leak.txt`` holds the values too.
"""

from __future__ import annotations

import base64
import os
from urllib.parse import urlsplit

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from tests.support.leak_agent import FROM_PROCESS, SHOWN, LeakAgent, runner_variable


class RaisingLeakAgent(LeakAgent):
    """LeakAgent, then a RuntimeError quoting the secrets (module docstring)."""

    agent_name = "raising-leak-agent"

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Print the secrets, keep them in agent/leak.txt, then fail quoting them."""
        await super().run(instruction, environment, context)
        cred = os.environ.get(SHOWN[1], "")
        key64 = base64.b64encode(os.environ.get(SHOWN[0], "").encode()).decode()
        password = urlsplit(runner_variable(FROM_PROCESS)).password or ""
        raise RuntimeError(f"provider said no: cred={cred} auth=Basic {key64} db={password}")
