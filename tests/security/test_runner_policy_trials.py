"""The runner's policy holds in the trial's own process (manifest author → runner).

Real trials (hello-file, local environment) through HarborExecutor, each in its
forkserver child as a runner runs them. One request is allowed by the policy and runs
to completion: the probe agent (an import path the policy lists), a scratch folder in
a folder the policy allows, an ``api_base`` on an allowed host. Each refused request
differs from it by one field: a scratch folder at a host path, an import path not
listed, a runner variable in ``api_key_env``, an ``api_base`` on another host, a task
templating a runner variable. Each refusal is a final ``PolicyRefused`` naming the
field and the rule, and nothing of the trial happened: no trial folder, no folder at
the requested path, no agent run. Before the policy, every one of them ran.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from schemas.events import TaskRef, TrialRequested
from schemas.manifest import AgentSpec, ComputeSpec, RetrySpec
from schemas.runners import RunnerPolicy
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.failures import is_retryable
from services.common.runner_policy import compute_refusals
from services.common.task_cache import TaskCache, upload_task
from services.runner.harbor_executor import HarborExecutor
from services.runner.trial_process import SandboxSettings
from tests.e2e.cli import ROOT

HELLO_FILE = ROOT / "examples" / "tasks" / "hello-file"
PROBE = "tests.support.probe_agent:ProbeAgent"
ALLOWED_HOST = "llm.allowed.example"
HOST_PATH = Path("/etc/trialbus-owned")
# A runner variable, as the runner's bus credentials would be; never on a trial's side.
RUNNER_SECRET = "NATS_PASSWORD"
RUNNER_SECRET_VALUE = "runner-secret-value-5e1f"


def policy(tmp_path: Path) -> RunnerPolicy:
    """The operator's choice: the probe agent, scratch folders under tmp/allowed,
    one model host, one extra key name."""
    return RunnerPolicy(
        agent_import_paths=[PROBE],
        environments={"local": {"path_kwargs": {"scratch_dir": [str(tmp_path / "allowed")]}}},
        endpoint_hosts=[ALLOWED_HOST],
        extra_secret_names=["POLICY_TEST_API_KEY"],
    )


def request(
    tmp_path: Path, task: TaskRef, trial_id: str, agent: dict[str, Any], env: dict[str, Any]
) -> TrialRequested:
    allowed_agent: dict[str, Any] = {
        "import_path": PROBE,
        "kwargs": {"api_base": f"http://{ALLOWED_HOST}/v1"},
    }
    allowed_env = {"scratch_dir": str(tmp_path / "allowed" / "scratch")}
    return TrialRequested(
        experiment_id=f"exp-{trial_id}",
        correlation_id="corr",
        trial_id=trial_id,
        task=task,
        agent=AgentSpec(**(allowed_agent | agent)),
        repetition=0,
        compute=ComputeSpec(environment="local", environment_kwargs=allowed_env | env),
        retry=RetrySpec(max_attempts=1),
    )


@pytest.fixture
async def executor(tmp_path: Path) -> tuple[HarborExecutor, TaskRef, TaskRef]:
    """The executor under the policy, hello-file, and a copy whose task.toml
    templates the runner's secret into the trial's environment."""
    templated = hello_with_env(tmp_path, "hello-templated", "environment", RUNNER_SECRET)
    run, (task, bad_task) = await executor_for(tmp_path, HELLO_FILE, templated)
    return run, task, bad_task


def hello_with_env(tmp_path: Path, name: str, table: str, variable: str) -> Path:
    """A copy of hello-file whose task.toml [``table``.env] templates ``variable``."""
    folder = tmp_path / "src" / name
    shutil.copytree(HELLO_FILE, folder)
    with (folder / "task.toml").open("a") as f:
        f.write(f'\n[{table}.env]\nLEAKED = "${{{variable}}}"\n')
    return folder


async def executor_for(tmp_path: Path, *folders: Path) -> tuple[HarborExecutor, list[TaskRef]]:
    """A HarborExecutor under the test policy, and ``folders`` stored as its tasks."""
    store = InMemoryObjectStore("TASKS")
    tasks = [
        TaskRef(name=folder.name, checksum=(await upload_task(store, folder)).name)
        for folder in folders
    ]
    cache = TaskCache(tmp_path / "task-cache", store, budget_bytes=1 << 30)
    sandbox = SandboxSettings(scratch_dir=tmp_path / "sandboxes")
    return HarborExecutor(tmp_path / "jobs", cache, sandbox, policy=policy(tmp_path)), tasks


async def test_the_allowed_request_runs(
    executor: tuple[HarborExecutor, TaskRef, TaskRef], tmp_path: Path
) -> None:
    run, task, _ = executor
    outcome = await run.run(request(tmp_path, task, "allowed", {}, {}), 1, None)
    assert outcome.kind == "completed", outcome
    assert outcome.trial_dir is not None and (outcome.trial_dir / "agent" / "probe.json").is_file()
    assert (tmp_path / "allowed" / "scratch").is_dir()  # the scratch folder asked for


REFUSED: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "scratch-dir-at-a-host-path": (
        {},
        {"scratch_dir": str(HOST_PATH)},
        "compute.environment_kwargs.scratch_dir: a path outside the folders",
    ),
    "import-path-not-listed": (
        {"import_path": "tests.support.leak_agent:LeakAgent"},
        {},
        "agent.import_path: 'tests.support.leak_agent:LeakAgent' is not in the runner "
        "policy's agent_import_paths",
    ),
    "runner-secret-in-api-key-env": (
        {"api_key_env": [RUNNER_SECRET]},
        {},
        f"agent.api_key_env[0]: {RUNNER_SECRET} is one of the runner's own variables",
    ),
    "api-base-on-another-host": (
        {"kwargs": {"api_base": "http://evil.example/v1"}},
        {},
        "agent.kwargs.api_base: host 'evil.example' is not in the runner policy's endpoint_hosts",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
async def test_a_refused_request_ends_before_anything_runs(
    case: str,
    executor: tuple[HarborExecutor, TaskRef, TaskRef],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(RUNNER_SECRET, RUNNER_SECRET_VALUE)
    run, task, _ = executor
    agent, env, rule = REFUSED[case]
    req = request(tmp_path, task, case, agent, env)
    outcome = await run.run(req, 1, None)
    assert (outcome.kind, outcome.exception_type) == ("failed", "PolicyRefused"), outcome
    assert outcome.message is not None and rule in outcome.message, outcome.message
    assert RUNNER_SECRET_VALUE not in outcome.message
    assert not is_retryable(outcome.exception_type)  # final: a retry meets the same policy
    # Nothing of the trial happened.
    assert not run.trial_dir_for(req).exists()
    assert not HOST_PATH.exists()
    assert not (tmp_path / "allowed" / "scratch").exists()


async def test_a_task_templating_a_runner_variable_is_refused(
    executor: tuple[HarborExecutor, TaskRef, TaskRef], tmp_path: Path
) -> None:
    run, _, templated = executor
    req = request(tmp_path, templated, "templated", {}, {})
    outcome = await run.run(req, 1, None)
    assert (outcome.kind, outcome.exception_type) == ("failed", "PolicyRefused"), outcome
    assert (
        f"task hello-templated: task.toml environment.env.LEAKED: ${{{RUNNER_SECRET}}} names "
        "a runner variable the runner policy does not allow"
    ) in (outcome.message or "")
    assert not run.trial_dir_for(req).exists()


async def test_an_allowed_secret_name_passes_the_policy(
    executor: tuple[HarborExecutor, TaskRef, TaskRef], tmp_path: Path
) -> None:
    # Control for the api_key_env rule: a name the policy adds passes it, and the
    # runner goes on to look the variable up (it has none here: a configuration error).
    run, task, _ = executor
    req = request(tmp_path, task, "named", {"api_key_env": ["POLICY_TEST_API_KEY"]}, {})
    outcome = await run.run(req, 1, None)
    assert (outcome.kind, outcome.exception_type) == ("failed", "MissingSecretError"), outcome
    assert "POLICY_TEST_API_KEY" in (outcome.message or "")


async def test_a_task_variable_the_runner_lacks_ends_the_trial_before_harbor(
    tmp_path: Path,
) -> None:
    # An allowed name the runner has no value for: before, Harbor raised a bare
    # ValueError, read as a retryable infrastructure failure, on every attempt.
    judged = hello_with_env(tmp_path, "hello-judged", "verifier", "POLICY_TEST_API_KEY")
    run, [task] = await executor_for(tmp_path, judged)
    outcome = await run.run(request(tmp_path, task, "judged", {}, {}), 1, None)
    assert (outcome.kind, outcome.exception_type) == ("failed", "MissingSecretError"), outcome
    assert outcome.message == (
        "runner has no environment variable POLICY_TEST_API_KEY (task hello-judged: "
        "task.toml [verifier.env] LEAKED)"
    )
    assert not is_retryable(outcome.exception_type)


async def test_a_link_inside_an_allowed_folder_cannot_lead_out_of_it(
    executor: tuple[HarborExecutor, TaskRef, TaskRef], tmp_path: Path
) -> None:
    run, task, _ = executor
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "allowed").mkdir(exist_ok=True)
    (tmp_path / "allowed" / "link").symlink_to(outside)
    env = {"scratch_dir": str(tmp_path / "allowed" / "link" / "scratch")}
    # Control: lexically the path is inside the allowed folder (the submitter, on
    # another host, can only judge so): only resolving the link on the runner refuses.
    lexical = ComputeSpec(environment="local", environment_kwargs=env)
    assert compute_refusals(policy(tmp_path), lexical) == []
    req = request(tmp_path, task, "through-a-link", {}, env)
    outcome = await run.run(req, 1, None)
    assert (outcome.kind, outcome.exception_type) == ("failed", "PolicyRefused"), outcome
    assert outcome.message is not None
    assert "compute.environment_kwargs.scratch_dir: a path outside" in outcome.message
    assert list(outside.iterdir()) == []  # nothing created through the link
