"""Real Harbor trial folders, produced by Harbor itself once per test session.

The importer's fixtures are never hand-written result.json files: each session runs
real Harbor trials (``Trial.create(...).run()``) with trialbus's local bubblewrap
environment on the example tasks, into one Harbor-style job folder. Tests that need a
malformed variant copy a trial folder into their own tmp_path and corrupt the copy;
the session folders are shared and must not be modified.

Load with ``pytest_plugins = ["tests.harbor_fixtures"]`` in a conftest.py.

One run builds the folders once, whatever imports the fixture: several modules re-export
it (each re-export is its own session fixture) and each pytest-xdist worker is its own
session, so the first to need them builds them under the run's temp root while holding a
lock, and the others wait for it and reuse them.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from schemas.manifest import LOCAL_ENVIRONMENT_IMPORT_PATH

if TYPE_CHECKING:
    from harbor.models.trial.config import TrialConfig

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_TASKS = REPO / "examples" / "tasks"
JOB_ID = "0b7d4a6e-3c1f-4d38-9f6a-2f2a5f0d9c11"
"""Harbor job id written into every session trial's config (as `harbor run` does)."""
JOB_FOLDER = "2026-01-02__03-04-05"
"""Name of the fixture job folder (Harbor's timestamp form)."""


def harbor_trial(
    name: str, task: Path, agent: str, *, agent_timeout_multiplier: float | None = None
) -> TrialConfig:
    """Harbor's config of one trial for :func:`run_trials`: the folder ``name``
    (``<task>__<agent>__<n>``), the task folder, a Harbor agent name, and Harbor's agent
    timeout factor (None: the task's own timeout), in trialbus's local environment."""
    # Imported here so that merely collecting tests does not import Harbor.
    from harbor.models.trial.config import (
        AgentConfig,
        EnvironmentConfig,
        TaskConfig,
        TrialConfig,
    )

    return TrialConfig(
        task=TaskConfig(path=task),
        trial_name=name,
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(import_path=LOCAL_ENVIRONMENT_IMPORT_PATH),
        agent_timeout_multiplier=agent_timeout_multiplier,
        job_id=uuid.UUID(JOB_ID),
    )


@dataclass(frozen=True, slots=True)
class HarborTrials:
    """The session's Harbor job folder and its trial folders by short name.

    Trials (task / agent -> what Harbor recorded):

    - ``oracle``: hello-file / oracle -> reward.txt 1
    - ``nop``: hello-file / nop -> reward.txt 0
    - ``multi``: multi-metric / oracle -> reward.json {reward, file_a, file_b, file_c}
    - ``multi_nop``: multi-metric / nop -> same keys, all 0
    - ``broken``: broken-verifier / oracle -> no reward, RewardFileNotFoundError
    - ``timeout``: a hello-file copy whose solution never ends -> AgentTimeoutError,
      the verifier still runs and gives reward 0
    """

    job_dir: Path
    trials: Mapping[str, Path]

    def __getitem__(self, name: str) -> Path:
        return self.trials[name]

    def copy(self, name: str, dest_parent: Path, new_name: str | None = None) -> Path:
        """Copy one trial folder under ``dest_parent`` (to corrupt it safely)."""
        dest = dest_parent / (new_name or self.trials[name].name)
        shutil.copytree(self.trials[name], dest)
        return dest


def _never_ending_task(dest: Path) -> Path:
    """hello-file with a solution that never finishes, to make Harbor time the agent out."""
    shutil.copytree(EXAMPLE_TASKS / "hello-file", dest)
    solve = dest / "solution" / "solve.sh"
    # The agent must still be running when Harbor's (shortened) agent timeout fires;
    # `exec sleep infinity` is the cheapest process that never ends by itself.
    solve.write_text("#!/bin/bash\nexec sleep infinity\n")
    solve.chmod(0o755)
    return dest


async def run_trials(job_dir: Path, trials: list[TrialConfig]) -> None:
    """Run ``trials`` (:func:`harbor_trial`) at once into the job folder ``job_dir``."""
    from harbor.trial.trial import Trial

    async def run(config: TrialConfig) -> None:
        trial = await Trial.create(config.model_copy(update={"trials_dir": job_dir}))
        await trial.run()

    await asyncio.gather(*(run(c) for c in trials))


@pytest.fixture(scope="session")
def harbor_trials(tmp_path_factory: pytest.TempPathFactory) -> HarborTrials:
    """Run the run's Harbor trials once (about 1 s in total) and return their folders."""
    base = tmp_path_factory.getbasetemp()
    # An xdist worker's temp root is <run's temp root>/popen-gwN: share the run's.
    run_root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = run_root / "harbor-trials"
    with (run_root / "harbor-trials.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = root / "built"  # written last: a build that failed is done again
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)
            _build(root)
            done.touch()
    return _load(root)


def _specs(root: Path) -> list[TrialConfig]:
    return [
        harbor_trial("hello-file__oracle", EXAMPLE_TASKS / "hello-file", "oracle"),
        harbor_trial("hello-file__nop", EXAMPLE_TASKS / "hello-file", "nop"),
        harbor_trial("multi-metric__oracle", EXAMPLE_TASKS / "multi-metric", "oracle"),
        harbor_trial("multi-metric__nop", EXAMPLE_TASKS / "multi-metric", "nop"),
        harbor_trial("broken-verifier__oracle", EXAMPLE_TASKS / "broken-verifier", "oracle"),
        # hello-file's agent timeout is 60 s; x0.005 = 0.3 s.
        harbor_trial(
            "never-ending__oracle",
            root / "tasks" / "never-ending",
            "oracle",
            agent_timeout_multiplier=0.005,
        ),
    ]


def _build(root: Path) -> None:
    """Run the fixture trials into ``root`` (a Harbor job folder and the slow task)."""
    job_dir = root / JOB_FOLDER
    job_dir.mkdir(parents=True)
    _never_ending_task(root / "tasks" / "never-ending")
    asyncio.run(run_trials(job_dir, _specs(root)))


def _load(root: Path) -> HarborTrials:
    """The trial folders :func:`_build` made under ``root``, each checked for its result."""
    job_dir = root / JOB_FOLDER
    specs = _specs(root)
    names = ["oracle", "nop", "multi", "multi_nop", "broken", "timeout"]
    trials = {short: job_dir / spec.trial_name for short, spec in zip(names, specs, strict=True)}
    for short, path in trials.items():
        if not (path / "result.json").is_file():
            raise RuntimeError(f"Harbor wrote no result.json for the {short!r} fixture trial")
    return HarborTrials(job_dir=job_dir, trials=trials)
