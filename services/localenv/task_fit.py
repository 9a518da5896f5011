"""What of a task the local environment cannot host, said before any trial starts.

The local environment imitates one Linux container on this host (its network: none,
the host's, or an allowlist through services/localenv/egress.py). A task that asks for
more fails the same way on every attempt, so it is refused as early as it can be:

- at submit (``unhostable``, called by services/submitter/hosting.py for every
  task folder, and by services/submitter/stored_tasks.py for a task given by
  checksum, from its archive): the manifest is refused, naming each task, file and
  field, instead of every trial of the task failing on the runners;
- on the runner (``LocalEnvironment``: ``environment_refusals``), for whatever
  reaches it anyway (a retry, work published before this check): an
  ``UnsupportedEnvironmentError``, which is never retried.

Refused: a docker compose file (several containers); ``os = "windows"``; GPUs or a
TPU; a Dockerfile line the build cannot imitate (services/localenv/dockerfile.py: a
second FROM, ``COPY --from``, ADD from a URL, ...), and a base image with no
equivalent here that ``base_images`` does not map. Whether the runner's host has the
Python version a ``python:3.X`` image asks for is known only there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from harbor.models.task.config import EnvironmentConfig, NetworkMode, TaskConfig, TaskOS
from pydantic import ValidationError

from schemas.manifest import LOCAL_ALLOWLIST
from services.common.folder_reads import read_inside
from services.common.task_variables import COMPOSE_FILES
from services.localenv.dockerfile import plan_build
from services.localenv.errors import UnsupportedEnvironmentError
from services.localenv.images import python_version_for

DOCKERFILE_MAX_BYTES: Final = 1024 * 1024
"""A Dockerfile larger than this is not read at submit (the runner still reads it)."""

ELSEWHERE: Final = "run it with compute.environment: docker on a Docker host"


def compose_refusal(name: str) -> str:
    """Why a task with ``environment/<name>`` cannot run here."""
    return (
        f"environment/{name}: a multi-container (docker compose) task cannot run in the "
        f"local environment; {ELSEWHERE}"
    )


def environment_refusals(config: EnvironmentConfig, where: str = "[environment]") -> list[str]:
    """What an ``[environment]`` table asks that no local sandbox has."""
    asked = []
    if config.os == TaskOS.WINDOWS:
        asked.append(f'{where} os = "windows": the local environment runs Linux only')
    if config.gpus:
        asked.append(f"{where} gpus = {config.gpus}: the local environment has no GPUs")
    if config.tpu is not None:
        asked.append(f"{where} tpu: the local environment has no TPU")
    return [f"{why}; {ELSEWHERE} that offers it" for why in asked]


def config_refusals(config: TaskConfig) -> list[str]:
    """Everything task.toml asks that the local environment cannot give."""
    refusals = environment_refusals(config.environment)
    if config.verifier.environment is not None:
        refusals += environment_refusals(config.verifier.environment, "[verifier.environment]")
    return refusals


def task_config(task_dir: Path) -> TaskConfig | str | None:
    """The task's task.toml as Harbor reads it; why Harbor cannot read it (the first
    lines of its error); None when there is no readable task.toml file."""
    toml = read_inside(task_dir, "task.toml")
    if not isinstance(toml, bytes):
        return None
    try:
        return TaskConfig.model_validate_toml(toml.decode("utf-8", errors="replace"))
    except (ValidationError, ValueError) as exc:
        return " ".join(str(exc).strip().splitlines()[:3])


def unhostable(task_dir: Path, environment_kwargs: Mapping[str, Any] | None = None) -> list[str]:
    """Why the local environment cannot run the task in ``task_dir`` (empty: it can, as
    far as the folder tells). Each reason names its file. ``environment_kwargs`` are the
    manifest's (``build_args`` fill the Dockerfile's ARGs, ``base_images`` maps images)."""
    kwargs = {
        key: value
        for key, value in (environment_kwargs or {}).items()
        if key in ("build_args", "base_images") and isinstance(value, Mapping)
    }
    refusals = [
        compose_refusal(name)
        for name in COMPOSE_FILES
        if (task_dir / "environment" / name).exists()
    ]
    image: str | None = None
    config = task_config(task_dir)
    if isinstance(config, str):
        refusals.append(f"task.toml: Harbor cannot read it: {config}")
    elif config is not None:
        refusals += config_refusals(config)
        image = config.environment.docker_image
    where = "environment/Dockerfile"
    dockerfile = read_inside(task_dir, where, DOCKERFILE_MAX_BYTES)
    try:
        if isinstance(dockerfile, bytes):
            text = dockerfile.decode("utf-8", errors="replace")
            image = plan_build(text, build_args=kwargs.get("build_args"), where=where).base
        elif image is not None:
            where = "task.toml [environment] docker_image"
        if image is not None:
            python_version_for(image, overrides=kwargs.get("base_images"), where=where)
    except UnsupportedEnvironmentError as exc:
        refusals.append(str(exc))
    return refusals


def asks_allowlist(config: TaskConfig) -> bool:
    """Whether a phase of the task (its environment, agent or verifier, or a step's)
    has ``network_mode = "allowlist"``."""
    phases = [config.environment, config.agent, config.verifier]
    for step in config.steps or ():
        phases += [step.agent, step.verifier]
    return any(phase.network_mode == NetworkMode.ALLOWLIST for phase in phases)


def local_requirements(task_dir: Path) -> list[str]:
    """The capabilities a runner's local environment must offer for the task in
    ``task_dir`` beyond ``local`` (``TrialRequested.task_requires``): ``local.allowlist``
    when a phase asks for a network allowlist. A task.toml Harbor cannot read requires
    nothing here (``unhostable`` refuses it)."""
    config = task_config(task_dir)
    return [LOCAL_ALLOWLIST] if isinstance(config, TaskConfig) and asks_allowlist(config) else []
