"""What one trial changes in its process never reaches the runner or the next trial.

Real Harbor trials (hello-file, local environment) run through HarborExecutor with
tests/support/probe_agent.py, which records the process-wide state it finds and then
changes it: litellm's price table, os.environ, the working directory, logging, its own
module's globals. Before trials ran in their own processes, the second trial found the
first one's changes (and the runner kept them). Also here: the runner's event loop
stays responsive while the first trial starts, and cancelling a run stops its process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from schemas.events import TaskRef, TrialRequested
from schemas.manifest import AgentSpec, ComputeSpec, RetrySpec
from schemas.runners import RunnerPolicy
from services.runner.harbor_executor import HarborExecutor
from services.runner.isolation import TrialProcesses
from services.runner.trial_process import SandboxSettings
from tests.e2e.cli import ROOT
from tests.support.tasks import stored_task

# tests.support.probe_agent.PROBE_ENV, not imported: this process must never load the
# agent's module (one of the checks below).
PROBE_ENV = "TRIALBUS_PROBE_LEAK"

HELLO_FILE = ROOT / "examples" / "tasks" / "hello-file"


def probe_request(trial_id: str, task: TaskRef, agent: str = "ProbeAgent") -> TrialRequested:
    """A work message for the probe agent on hello-file, in the local environment."""
    return TrialRequested(
        experiment_id=f"exp-{trial_id}",
        correlation_id="corr",
        trial_id=trial_id,
        task=task,
        agent=AgentSpec(import_path=f"tests.support.probe_agent:{agent}"),
        repetition=0,
        compute=ComputeSpec(environment="local", n_concurrent_trials=2),
        retry=RetrySpec(max_attempts=1),
    )


def runner_state() -> dict[str, Any]:
    """The runner process's own share of the state the probe changes."""
    root = logging.getLogger()
    return {
        "env": os.environ.get(PROBE_ENV),
        "cwd": os.getcwd(),
        "root_level": root.level,
        "root_handlers": len(root.handlers),
    }


async def probe_executor(
    tmp_path: Path, processes: TrialProcesses | None = None
) -> tuple[HarborExecutor, TaskRef]:
    """A HarborExecutor whose task cache holds hello-file, and the task's ref."""
    task, cache = await stored_task(HELLO_FILE, tmp_path / "task-cache")
    # The runner imports only the agent import paths its policy lists.
    policy = RunnerPolicy(
        agent_import_paths=[
            f"tests.support.probe_agent:{a}"
            for a in ("ProbeAgent", "SleepyAgent", "LingeringAgent")
        ]
    )
    sandbox = SandboxSettings(scratch_dir=tmp_path / "sandboxes")
    executor = HarborExecutor(tmp_path / "jobs", cache, sandbox, processes=processes, policy=policy)
    return executor, task


async def run_probe(executor: HarborExecutor, task: TaskRef, trial_id: str) -> dict[str, Any]:
    outcome = await executor.run(probe_request(trial_id, task), 1, None)
    assert outcome.kind == "completed" and outcome.trial_dir is not None, outcome
    report: dict[str, Any] = json.loads((outcome.trial_dir / "agent" / "probe.json").read_text())
    return report


async def max_loop_lag(started: asyncio.Event, stop: asyncio.Event, tick_s: float = 0.02) -> float:
    """The longest the event loop was late for a tick until ``stop`` (seconds)."""
    worst = 0.0
    started.set()
    while not stop.is_set():
        t0 = time.monotonic()
        await asyncio.sleep(tick_s)
        worst = max(worst, time.monotonic() - t0 - tick_s)
    return worst


async def test_state_changed_by_a_trial_stays_in_that_trial(tmp_path: Path) -> None:
    executor, task = await probe_executor(tmp_path)
    ours = runner_state()
    started, stop = asyncio.Event(), asyncio.Event()
    lag = asyncio.create_task(max_loop_lag(started, stop))
    await started.wait()  # its first tick is armed: any blocking from here shows
    first = await run_probe(executor, task, "probe-1")
    stop.set()
    second = await run_probe(executor, task, "probe-2")

    # Negative control: within one trial the probe does see each change it makes.
    for key in ("price", "env", "cwd", "root_level", "root_handlers", "module_runs"):
        assert first["after"][key] != first["before"][key], key
    # The second trial found the state the first one found, not the first one's changes.
    assert second["before"] == first["before"]
    assert second["before"]["price"] is None and second["before"]["module_runs"] == 0
    assert first["pid"] != second["pid"] != os.getpid()
    # The runner's own process is untouched, and never imported litellm or the agent.
    assert runner_state() == ours
    assert "tests.support.probe_agent" not in sys.modules
    assert "litellm" not in sys.modules
    # Harbor's start-up (imports, agent construction) ran off the runner's event loop.
    assert await lag < 1.0


async def test_cancelling_a_run_stops_its_process(tmp_path: Path) -> None:
    executor, task = await probe_executor(tmp_path)
    request = probe_request("sleepy-1", task, agent="SleepyAgent")
    run = asyncio.create_task(executor.run(request, 1, None))
    started = executor.trial_dir_for(request) / "agent" / "started"
    deadline = time.monotonic() + 120
    while not started.exists():  # the agent announces itself with this file
        assert time.monotonic() < deadline, "the sleepy agent never started"
        assert not run.done(), run
        await asyncio.sleep(0.1)
    pid = int(started.read_text())
    os.kill(pid, 0)  # alive
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_run_returns_its_ending_without_waiting_for_its_process_to_exit(
    tmp_path: Path,
) -> None:
    executor, task = await probe_executor(tmp_path)
    request = probe_request("linger-1", task, agent="LingeringAgent")
    began = time.monotonic()
    outcome = await executor.run(request, 1, None)
    returned_s = time.monotonic() - began
    assert outcome.kind == "completed", outcome
    agent_dir = executor.trial_dir_for(request) / "agent"
    pid = int((agent_dir / "pid").read_text())
    # The process is still there (its lingering thread holds its exit): before, the run
    # waited for its exit, so it could not return while the process lived.
    os.kill(pid, 0)
    assert returned_s < 25.0  # the linger's cap is 30 s
    (agent_dir / "release").write_text("")
    deadline = time.monotonic() + 60
    while True:  # reaped in the background once it exits
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "the trial's process was never reaped"
        await asyncio.sleep(0.05)
