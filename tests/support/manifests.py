"""Manifest files for tests that submit through the CLI or the HTTP API.

``manifest_file(folder, name, ...)`` writes ``folder/<name>.yaml``: the fields every
such test spells out (tasks, agents, repetitions, how many trials at once on the local
environment), plus any other top-level field as given (retry, budget, ...).
``nop_agents(n)`` gives n distinct entries of the same agent, so one task yields n
distinct trials per repetition; ``nop_manifest`` is the usual load test of them: the
hello-file example task, agents x repetitions trials. ``quotas_file`` writes the teams'
quotas file (``TRIALBUS_QUOTAS_FILE``) from a dict rather than hand-written YAML.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cli import ROOT

HELLO_FILE = ROOT / "examples" / "tasks" / "hello-file"


def manifest_file(
    folder: Path,
    name: str,
    *,
    tasks: Sequence[Path | str],
    agents: list[Any],
    repetitions: int,
    concurrency: int,
    **fields: Any,
) -> Path:
    """``folder/<name>.yaml``: ``agents`` x ``tasks`` x ``repetitions`` on the local
    environment, at most ``concurrency`` at once, with ``fields`` added at the top."""
    data: dict[str, Any] = {
        "name": name,
        "tasks": [str(t) for t in tasks],
        "agents": agents,
        "repetitions": repetitions,
        "compute": {"environment": "local", "n_concurrent_trials": concurrency},
        **fields,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def nop_agents(n: int) -> list[dict[str, Any]]:
    """``n`` entries of the nop agent, told apart by label and kwargs."""
    return [{"name": "nop", "label": f"nop-{i}", "kwargs": {"i": i}} for i in range(n)]


def nop_manifest(
    folder: Path, name: str, *, agents: int, repetitions: int, concurrency: int, **fields: Any
) -> Path:
    """``folder/<name>.yaml``: ``agents`` nop agents x ``repetitions`` on hello-file."""
    return manifest_file(
        folder,
        name,
        tasks=[HELLO_FILE],
        agents=nop_agents(agents),
        repetitions=repetitions,
        concurrency=concurrency,
        **fields,
    )


def quotas_file(folder: Path, teams: dict[str, dict[str, float]]) -> Path:
    """``folder/quotas.yaml`` giving each team its limits (``{"red": {"share": 3}}``);
    a second call rewrites it, as an operator edits the file."""
    path = folder / "quotas.yaml"
    path.write_text(yaml.safe_dump({"teams": teams}))
    return path
