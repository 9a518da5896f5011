"""An agent name the runner's Harbor does not ship ends the trial at once, final.

Harbor itself raises a bare ValueError from ``Trial.create``, which trialbus would
read as an infrastructure failure and retry; the runner names the problem instead.
A real HarborExecutor (trial process, Harbor, the local environment) runs both the
typo and, as the control, the name it was meant to be.
"""

from __future__ import annotations

from pathlib import Path

from schemas.events import TaskRef, TrialRequested
from schemas.manifest import AgentSpec, ComputeSpec, RetrySpec
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.failures import classify, is_retryable
from services.common.task_cache import TaskCache, upload_task
from services.runner.harbor_executor import HarborExecutor
from services.runner.trial_process import SandboxSettings
from tests.e2e.cli import ROOT


def _request(task: TaskRef, agent: str) -> TrialRequested:
    return TrialRequested(
        experiment_id=f"exp-{agent}",
        correlation_id="corr",
        trial_id=f"hello-file__{agent}",
        task=task,
        agent=AgentSpec(name=agent),
        repetition=0,
        compute=ComputeSpec(environment="local"),
        retry=RetrySpec(max_attempts=3),
    )


async def test_a_misspelt_agent_fails_once_naming_the_closest_name(tmp_path: Path) -> None:
    store = InMemoryObjectStore("TASKS")
    folder = ROOT / "examples" / "tasks" / "hello-file"
    task = TaskRef(name=folder.name, checksum=(await upload_task(store, folder)).name)
    cache = TaskCache(tmp_path / "task-cache", store, budget_bytes=1 << 30)
    run = HarborExecutor(tmp_path / "jobs", cache, SandboxSettings(scratch_dir=tmp_path / "sb"))

    typo = _request(task, "orcale")
    outcome = await run.run(typo, 1, None)
    assert (outcome.kind, outcome.exception_type) == ("failed", "UnknownAgent"), outcome
    assert outcome.message is not None
    assert outcome.message.startswith(
        "agent.name: 'orcale' is not an agent Harbor ships (did you mean 'oracle'?"
    ), outcome.message
    assert not is_retryable(outcome.exception_type)  # final: no second attempt
    assert classify(outcome.exception_type) == "infrastructure"  # unscored, never a zero
    assert not run.trial_dir_for(typo).exists()  # Harbor never started it
    # Control: the name meant runs to a result.
    meant = await run.run(_request(task, "oracle"), 1, None)
    assert meant.kind == "completed", meant
