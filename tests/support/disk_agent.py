"""A Harbor agent that writes ``megabytes`` MB into its sandbox's /tmp (the disk quota
tests: the agent's own writes, as an agent that fills a disk would make them)."""

from __future__ import annotations

from typing import Any

from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from tests.support.harbor_agent import SupportAgent


class DiskWriterAgent(SupportAgent):
    """Writes ``megabytes`` MB of zeros to /tmp/fill, sleeps ``sleep_s``, then solves
    hello-file."""

    agent_name = "disk-writer"

    def __init__(self, *args: Any, megabytes: int = 1, sleep_s: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.megabytes = megabytes
        self.sleep_s = sleep_s  # then wait: a trial still running when its runner dies

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Fill, then do what the task asks (so that below the quota it scores 1)."""
        await environment.exec(f"head -c {self.megabytes * 1000000} /dev/zero > /tmp/fill")
        if self.sleep_s:
            await environment.exec(f"sleep {self.sleep_s}")
        await environment.exec("echo 'Hello, world!' > /app/hello.txt")
