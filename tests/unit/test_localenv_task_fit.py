"""What of a task the local environment cannot host: refused at submit (from the task's
folder) and by the environment itself (for a task given by checksum), never retried."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from schemas.manifest import ExperimentManifest
from services.common.errors import ManifestError
from services.common.failures import is_retryable
from services.localenv.environment import LocalEnvironment
from services.localenv.errors import UnsupportedEnvironmentError
from services.localenv.task_fit import local_requirements, unhostable
from services.submitter.submit import prepare

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples" / "tasks").iterdir() if p.is_dir())
FIXTURES = sorted(p for p in (ROOT / "tests" / "fixtures" / "tasks").iterdir() if p.is_dir())


def _task(tmp_path: Path, toml_extra: str = "", dockerfile: str | None = None) -> Path:
    """A copy of the hello-file example, with ``toml_extra`` appended to its task.toml
    and, when given, another Dockerfile."""
    task = tmp_path / "task"
    shutil.copytree(ROOT / "examples" / "tasks" / "hello-file", task)
    if toml_extra:
        toml = task / "task.toml"
        toml.write_text(toml.read_text() + toml_extra)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    return task


@pytest.mark.parametrize("task", EXAMPLES + FIXTURES, ids=lambda p: p.name)
def test_the_project_s_tasks_are_hostable(task: Path) -> None:
    # The control of every refusal below: the check refuses nothing the demo runs.
    assert unhostable(task) == []


def test_a_compose_file_is_named(tmp_path: Path) -> None:
    task = _task(tmp_path)
    (task / "environment" / "compose.yaml").write_text("services: {main: {}}\n")
    [why] = unhostable(task)
    assert why.startswith("environment/compose.yaml: a multi-container (docker compose) task")


ALLOWLIST = 'network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'


@pytest.mark.parametrize("table", ["[agent]", "[verifier]", "[steps.agent]", "[environment]"])
def test_an_allowlist_anywhere_in_task_toml_is_hostable(tmp_path: Path, table: str) -> None:
    # The sandbox's egress proxy enforces it (services/localenv/egress.py).
    task = _task(tmp_path, '\n[[steps]]\nname = "one"\n[steps.agent]\n')
    toml = task / "task.toml"
    text = toml.read_text().replace('network_mode = "no-network"\n', "")
    toml.write_text(text.replace(f"{table}\n", f"{table}\n{ALLOWLIST}", 1))
    assert ALLOWLIST in toml.read_text()
    assert unhostable(task) == []


@pytest.mark.parametrize("table", ["[agent]", "[verifier]", "[steps.agent]", "[environment]"])
def test_an_allowlist_anywhere_requires_a_runner_that_enforces_it(
    tmp_path: Path, table: str
) -> None:
    task = _task(tmp_path, '\n[[steps]]\nname = "one"\n[steps.agent]\n')
    toml = task / "task.toml"
    text = toml.read_text().replace('network_mode = "no-network"\n', "")
    toml.write_text(text.replace(f"{table}\n", f"{table}\n{ALLOWLIST}", 1))
    assert local_requirements(task) == ["local.allowlist"]


@pytest.mark.parametrize("task", EXAMPLES + FIXTURES, ids=lambda p: p.name)
def test_only_the_allowlist_task_requires_more_than_local(task: Path) -> None:
    # The control: a task without an allowlist (public, none, switched phases) requires
    # nothing; a task.toml Harbor cannot read requires nothing either (it is refused).
    wanted = ["local.allowlist"] if task.name == "allowlist-network" else []
    assert local_requirements(task) == wanted


def test_an_unreadable_task_toml_requires_nothing(tmp_path: Path) -> None:
    task = _task(tmp_path, '\n[environment]\nnetwork_mode = "allowlist"\n')  # a second table
    assert unhostable(task) and local_requirements(task) == []


def test_the_environment_table_s_gpus_and_os_are_named(tmp_path: Path) -> None:
    task = _task(tmp_path)
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace('network_mode = "no-network"', 'gpus = 1\nos = "windows"')
    )
    assert unhostable(task) == [
        '[environment] os = "windows": the local environment runs Linux only; run it with '
        "compute.environment: docker on a Docker host that offers it",
        "[environment] gpus = 1: the local environment has no GPUs; run it with "
        "compute.environment: docker on a Docker host that offers it",
    ]


@pytest.mark.parametrize(
    ("dockerfile", "fragment"),
    [
        ("FROM ubuntu:24.04 AS a\nFROM ubuntu:24.04\n", "environment/Dockerfile:2: a multi-stage"),
        ("FROM alpine:3.20\n", "environment/Dockerfile: base image 'alpine:3.20' has no equiv"),
        ("FROM ubuntu:24.04\nADD https://example.com/x /x\n", "environment/Dockerfile:2: ADD"),
    ],
)
def test_a_dockerfile_the_build_cannot_imitate_is_named(
    tmp_path: Path, dockerfile: str, fragment: str
) -> None:
    [why] = unhostable(_task(tmp_path, dockerfile=dockerfile))
    assert why.startswith(fragment)


def test_the_manifest_s_base_images_and_build_args_are_applied(tmp_path: Path) -> None:
    task = _task(tmp_path, dockerfile="ARG BASE=alpine:3.20\nFROM ${BASE}\n")
    assert "alpine:3.20" in unhostable(task)[0]
    assert unhostable(task, {"build_args": {"BASE": "debian:12"}}) == []
    assert unhostable(task, {"base_images": {"alpine:*": "host"}}) == []
    # A python:3.X image is judged by its name: whether the runner's host has that
    # Python is known only there.
    assert unhostable(task, {"build_args": {"BASE": "python:3.5-slim"}}) == []


def test_a_docker_image_without_dockerfile_is_judged_too(tmp_path: Path) -> None:
    task = _task(tmp_path, "")
    (task / "environment" / "Dockerfile").unlink()
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace("[environment]", '[environment]\ndocker_image = "node:20"')
    )
    [why] = unhostable(task)
    assert why.startswith("task.toml [environment] docker_image: base image 'node:20'")


def test_a_task_toml_harbor_cannot_read_is_named(tmp_path: Path) -> None:
    task = _task(tmp_path)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("cpus = 1", 'cpus = "many"'))
    [why] = unhostable(task)
    assert why.startswith("task.toml: Harbor cannot read it: ")
    assert "cpus" in why


# -- at submit ----------------------------------------------------------------------------
def _manifest(tmp_path: Path, environment: str) -> ExperimentManifest:
    return ExperimentManifest.model_validate(
        {
            "name": "fit",
            "tasks": ["tasks/hello-file", "tasks/needs-compose"],
            "agents": [{"name": "oracle"}],
            "compute": {"environment": environment},
        }
    )


def _tasks(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples" / "tasks" / "hello-file", tmp_path / "tasks" / "hello-file")
    compose = tmp_path / "tasks" / "needs-compose"
    shutil.copytree(ROOT / "examples" / "tasks" / "hello-file", compose)
    (compose / "environment" / "docker-compose.yaml").write_text("services: {main: {}}\n")


def test_submit_refuses_a_local_manifest_naming_each_task_it_cannot_run(tmp_path: Path) -> None:
    _tasks(tmp_path)
    with pytest.raises(ManifestError) as refused:
        prepare(_manifest(tmp_path, "local"), tmp_path)
    message = str(refused.value)
    assert message.startswith("compute.environment: local cannot run 1 of the manifest's 2 tasks")
    assert f"task 'needs-compose' ({tmp_path / 'tasks' / 'needs-compose'}): environment/" in message
    assert "hello-file" not in message
    assert message.endswith(
        '(of a dataset entry, leave them out with exclude_task_names: ["needs-compose"])'
    )


def test_submit_lets_another_environment_take_the_same_tasks(tmp_path: Path) -> None:
    # The control: the same folders, for Docker, are accepted.
    _tasks(tmp_path)
    assert len(prepare(_manifest(tmp_path, "docker"), tmp_path).trials) == 2


def test_trials_of_an_allowlist_task_require_local_allowlist(tmp_path: Path) -> None:
    fixture = ROOT / "tests" / "fixtures" / "tasks" / "allowlist-network"
    shutil.copytree(fixture, tmp_path / "tasks" / "allowlist-network")
    shutil.copytree(ROOT / "examples" / "tasks" / "hello-file", tmp_path / "tasks" / "hello-file")

    def manifest(environment: str) -> ExperimentManifest:
        return ExperimentManifest.model_validate(
            {
                "name": "allow",
                "tasks": ["tasks/allowlist-network", "tasks/hello-file"],
                "agents": [{"name": "oracle"}],
                "compute": {"environment": environment},
            }
        )

    local = prepare(manifest("local"), tmp_path)
    needs = {t.task.name: t.task_requires for t in local.trials}
    assert needs == {"allowlist-network": ["local.allowlist"], "hello-file": None}
    assert local.plan()["requires"] == ["local", "local.allowlist"]
    # The control: Docker enforces an allowlist itself; its trials require nothing more.
    docker = prepare(manifest("docker"), tmp_path)
    assert [t.task_requires for t in docker.trials] == [None, None]
    assert docker.plan()["requires"] == ["docker"]


# -- on the runner -------------------------------------------------------------------------
def _environment(tmp_path: Path, config: EnvironmentConfig, mode: NetworkMode) -> LocalEnvironment:
    env_dir = tmp_path / "environment"
    env_dir.mkdir(exist_ok=True)
    (env_dir / "Dockerfile").write_text("FROM ubuntu:24.04\n")
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    hosts = ["pypi.org"] if mode == NetworkMode.ALLOWLIST else []
    return LocalEnvironment(
        environment_dir=env_dir,
        environment_name="fit",
        session_id="fit__env",
        trial_paths=paths,
        task_env_config=config,
        network_policy=NetworkPolicy(network_mode=mode, allowed_hosts=hosts),
        scratch_dir=str(tmp_path / "scratch"),
    )


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        (EnvironmentConfig(gpus=2), "gpus = 2: the local environment"),
        (EnvironmentConfig(os="windows"), 'os = "windows"'),
    ],
)
def test_the_environment_refuses_what_it_cannot_give_as_not_retryable(
    tmp_path: Path, config: EnvironmentConfig, fragment: str
) -> None:
    with pytest.raises(UnsupportedEnvironmentError, match=re.escape(fragment)):
        _environment(tmp_path, config, NetworkMode.PUBLIC)
    assert not is_retryable(UnsupportedEnvironmentError.__name__)


def test_without_root_an_allowlist_is_refused_as_not_retryable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only root may enter a sandbox's network namespace to open its egress proxy.
    monkeypatch.setattr("services.localenv.environment.os.geteuid", lambda: 1000)
    with pytest.raises(
        UnsupportedEnvironmentError, match=r"running as root, which offers 'local\.allowlist'"
    ):
        _environment(tmp_path, EnvironmentConfig(), NetworkMode.ALLOWLIST)


@pytest.mark.parametrize(
    "mode", [NetworkMode.NO_NETWORK, NetworkMode.PUBLIC, NetworkMode.ALLOWLIST]
)
def test_the_environment_takes_what_it_can_give(tmp_path: Path, mode: NetworkMode) -> None:
    # The control: no network, the whole network and (as root) an allowlist.
    env = _environment(tmp_path, EnvironmentConfig(), mode)
    assert env.network_policy.network_mode == mode
