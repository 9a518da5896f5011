"""A Harbor agent that writes ``megabytes`` MB into its sandbox's /tmp (the disk quota
tests: the agent's own writes, as an agent that fills a disk would make them), and
the manifest those tests submit."""

from __future__ import annotations

from typing import Any

import yaml
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


IMPORT_PATH = f"{__name__}:{DiskWriterAgent.__name__}"
"""The agent's import path (in a manifest and in the runner policy that allows it)."""


def disk_writer_manifest(name: str, **agents: dict[str, int]) -> str:
    """A manifest (YAML text) running hello-file in the local environment once per
    agent: each keyword is an agent's label, its value the agent's kwargs
    (``filler={"megabytes": 100}``)."""
    manifest = {
        "name": name,
        "tasks": ["hello-file"],
        "agents": [
            {"import_path": IMPORT_PATH, "label": label, "kwargs": kwargs}
            for label, kwargs in agents.items()
        ],
        "compute": {"environment": "local"},
    }
    return yaml.safe_dump(manifest, sort_keys=False)
