"""The inputs: one description of the trials, written out for each side.

A :class:`Workload` is tasks x agents x repetitions. ``trialbus_manifest`` writes it
as a trialbus manifest, ``harbor_job_config`` as a Harbor JobConfig for
``harbor run -c``; both name the same task folders, agents, repetitions and
environment, so both sides run exactly the same trials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness import EXAMPLE_TASKS
from schemas.manifest import LOCAL_ENVIRONMENT_IMPORT_PATH


@dataclass(frozen=True, slots=True)
class Agent:
    """A Harbor agent name plus kwargs (distinct kwargs make distinct trials)."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Workload:
    """tasks x agents x repetitions, run with ``concurrency`` trials at once."""

    name: str
    tasks: tuple[Path, ...]
    agents: tuple[Agent, ...]
    repetitions: int
    concurrency: int = 8

    @property
    def n_trials(self) -> int:
        return len(self.tasks) * len(self.agents) * self.repetitions

    def trialbus_manifest(self, path: Path, *, max_in_flight: int | None = None) -> Path:
        """Write the trialbus manifest (local bubblewrap environment) to ``path``.

        ``compute.n_concurrent_trials`` is the experiment's limit across all runners
        (``max_in_flight``, default ``concurrency``): with several runners it must be
        their total, or the limit, not the runners, decides the throughput.
        """
        data: dict[str, Any] = {
            "name": self.name,
            "tasks": [str(t) for t in self.tasks],
            "agents": [
                {"name": a.name, **({"kwargs": a.kwargs} if a.kwargs else {})} for a in self.agents
            ],
            "repetitions": self.repetitions,
            "compute": {
                "environment": "local",
                "n_concurrent_trials": max_in_flight or self.concurrency,
            },
            # No retries: `harbor run` does not retry either (its default max_retries is 0).
            "retry": {"max_attempts": 1},
        }
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def harbor_job_config(self, path: Path, jobs_dir: Path, sandbox_dir: Path) -> Path:
        """Write a Harbor JobConfig running the same trials in the same environment."""
        data: dict[str, Any] = {
            "job_name": self.name,
            "jobs_dir": str(jobs_dir),
            "n_attempts": self.repetitions,
            "n_concurrent_trials": self.concurrency,
            "quiet": True,
            "environment": {
                "import_path": LOCAL_ENVIRONMENT_IMPORT_PATH,
                # The runner passes the same scratch root (TRIALBUS_SANDBOX_DIR).
                "kwargs": {"scratch_dir": str(sandbox_dir)},
            },
            "agents": [
                {"name": a.name, **({"kwargs": a.kwargs} if a.kwargs else {})} for a in self.agents
            ],
            "tasks": [{"path": str(t)} for t in self.tasks],
        }
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


def quick_trials(repetitions: int, concurrency: int = 8) -> Workload:
    """Real, quick Harbor trials: hello-file and count-words x nop and oracle."""
    return Workload(
        name="bench-harbor",
        tasks=(EXAMPLE_TASKS / "hello-file", EXAMPLE_TASKS / "count-words"),
        agents=(Agent("nop"), Agent("oracle")),
        repetitions=repetitions,
        concurrency=concurrency,
    )


def many_trials(n_trials: int, name: str = "bench-pipeline") -> Workload:
    """About ``n_trials`` trials for the instant executor (never run by Harbor).

    4 example tasks x k agent variants x up to 100 repetitions (the manifest's
    limit); the count is exact when ``n_trials`` is a multiple of 400 or below 400
    and a multiple of 4.
    """
    tasks = tuple(
        EXAMPLE_TASKS / t for t in ("hello-file", "count-words", "multi-metric", "broken-verifier")
    )
    per_task = max(1, n_trials // len(tasks))
    repetitions = min(100, per_task)
    n_agents = max(1, per_task // repetitions)
    agents = tuple(Agent("nop", {"variant": i}) for i in range(n_agents))
    return Workload(name=name, tasks=tasks, agents=agents, repetitions=repetitions)
