"""Run commands in one local-environment trial from a separate process.

``python -m tests.security.sandbox_driver WORKDIR DOCKERFILE COMMAND...`` starts a
trial the way the runner does (``LocalEnvironment`` start, exec, stop), runs each
command in turn and prints one JSON line: ``{"results": [[rc, stdout, stderr], ...]}``.
Tests use it when the *host* must look different from the test process's own (a
private mount namespace with planted host secrets, another uid).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from services.localenv.environment import LocalEnvironment


async def run(workdir: Path, dockerfile: str, commands: list[str]) -> list[list[object]]:
    """Start a trial under ``workdir``, run ``commands``, stop it; their outcomes."""
    env_dir = workdir / "task" / "environment"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "Dockerfile").write_text(dockerfile)
    paths = TrialPaths(workdir / "trial")
    paths.mkdir()
    env = LocalEnvironment(
        environment_dir=env_dir,
        environment_name="driver",
        session_id="driver__sec",
        trial_paths=paths,
        task_env_config=TaskEnvironmentConfig(),
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
        scratch_dir=str(workdir / "sandboxes"),
    )
    await env.start(force_build=False)
    try:
        results: list[list[object]] = []
        for command in commands:
            r = await env.exec(command)
            results.append([r.return_code, r.stdout or "", r.stderr or ""])
        return results
    finally:
        await env.stop(delete=True)


if __name__ == "__main__":
    outcome = asyncio.run(run(Path(sys.argv[1]), sys.argv[2], sys.argv[3:]))
    print(json.dumps({"results": outcome}))
