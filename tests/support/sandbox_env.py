"""The local sandbox as the runner drives it: ``LocalEnvironment`` start, exec, stop.

Shared by the integration tests of the local environment and the sandbox security
tests. Tests that need it skip only without root or the host tools (under CI=true the
session's conftest turns such a skip into a failure). A test module uses the fixtures
by importing them (``from tests.support.sandbox_env import layers, make_env``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from services.localenv.environment import LocalEnvironment
from services.localenv.sandbox import missing_host_tools

UBUNTU = "FROM ubuntu:24.04\nWORKDIR /app\n"
EnvFactory = Callable[..., LocalEnvironment]
needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or bool(missing_host_tools(network=True)),
    reason="needs root and bwrap/slirp4netns/util-linux (make setup)",
)


@pytest.fixture(scope="module")
def layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image layer cache, shared by the tests of one module (builds are slow)."""
    return tmp_path_factory.mktemp("layers")


@pytest.fixture
def make_env(tmp_path: Path, layers: Path) -> EnvFactory:
    """Write a task environment folder and return a LocalEnvironment over it."""

    def make(
        dockerfile: str = UBUNTU,
        *,
        files: dict[str, str] | None = None,
        links: dict[str, str] | None = None,
        network: bool = False,
        cpus: float | None = None,
        memory_mb: int | None = None,
        **kwargs: Any,
    ) -> LocalEnvironment:
        name = uuid.uuid4().hex[:8]
        env_dir = tmp_path / "tasks" / name / "environment"
        env_dir.mkdir(parents=True)
        (env_dir / "Dockerfile").write_text(dockerfile)
        for rel, text in (files or {}).items():
            (env_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (env_dir / rel).write_text(text)
        for rel, target in (links or {}).items():
            (env_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (env_dir / rel).symlink_to(target)
        paths = TrialPaths(tmp_path / "trials" / name)
        paths.mkdir()
        mode = NetworkMode.PUBLIC if network else NetworkMode.NO_NETWORK
        return LocalEnvironment(
            environment_dir=env_dir,
            environment_name=name,
            session_id=f"{name}__env",
            trial_paths=paths,
            task_env_config=TaskEnvironmentConfig(cpus=cpus, memory_mb=memory_mb),
            network_policy=NetworkPolicy(network_mode=mode),
            **{"scratch_dir": str(tmp_path / "sandboxes"), "cache_dir": str(layers), **kwargs},
        )

    return make


@asynccontextmanager
async def running(env: LocalEnvironment) -> AsyncIterator[LocalEnvironment]:
    """The environment started, and stopped (folders removed) on the way out."""
    await env.start(force_build=False)
    try:
        yield env
    finally:
        await env.stop(delete=True)


async def sh(trial: LocalEnvironment, command: str, **kwargs: Any) -> str:
    """Run ``command`` in the trial; it must succeed; its stripped stdout."""
    result = await trial.exec(command, **kwargs)
    assert result.return_code == 0, (command, result.stdout, result.stderr)
    return (result.stdout or "").strip()


def host_processes(pattern: str) -> list[str]:
    """Command lines of the host's processes that contain ``pattern`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue  # the process ended while we looked
            if pattern in cmdline:
                found.append(cmdline)
    return found
