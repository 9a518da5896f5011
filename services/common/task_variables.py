"""What a task folder asks of the runner's environment: the variables it templates.

``task_templates``: every ``${NAME}`` in task.toml and ``$NAME`` in its compose file
(each must be a secret name the runner policy allows: runner_policy.template_refusals).
``required_task_secrets``: the ones a trial cannot start without (Harbor resolves them
with no default), checked at submit against the runners' keys (pools.secret_refusal)
and by the runner before Harbor sees the trial (MissingSecretError, final).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Harbor's template forms (harbor.utils.env): ${NAME} and ${NAME:-default}.
_TEMPLATE_RE = re.compile(r"\$\{([^}:]+)")
# Docker compose interpolates $NAME and ${NAME} from the runner's environment; $$ escapes.
_COMPOSE_VAR_RE = re.compile(r"(?<!\$)\$\{?([A-Za-z_][A-Za-z0-9_]*)")
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
_REQUIRED_RE = re.compile(r"\$\{([^}:]+)\}")
"""A whole env value Harbor resolves with no default (harbor.utils.env.resolve_env_vars)."""
_ENV_TABLES = ("environment", "verifier", "solution")
"""task.toml tables whose ``env`` Harbor resolves from the runner's environment."""


def _task_toml(task_dir: Path) -> dict[str, Any]:
    """The task's task.toml, or {} when it is missing or broken (Harbor says so itself)."""
    toml_file = task_dir / "task.toml"
    if not toml_file.is_file():
        return {}
    try:
        return tomllib.loads(toml_file.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
        return {}


def task_templates(task_dir: Path) -> list[tuple[str, str]]:
    """(field, variable name) of every runner variable the task folder templates."""
    found: list[tuple[str, str]] = []
    for field, text in _strings(_task_toml(task_dir), "task.toml"):
        found.extend((field, m.group(1).strip()) for m in _TEMPLATE_RE.finditer(text))
    for name in COMPOSE_FILES:
        compose = task_dir / "environment" / name
        if compose.is_file() and not compose.is_symlink():
            text = compose.read_text(errors="replace")
            field = f"environment/{name}"
            found.extend((field, m.group(1)) for m in _COMPOSE_VAR_RE.finditer(text))
    return list(dict.fromkeys(found))


def required_task_secrets(task_dir: Path) -> list[tuple[str, str]]:
    """(field, variable) of every runner variable a task's trial cannot start without:
    an ``env`` value of task.toml's [environment], [verifier], [solution] or a step's
    [verifier] that is ``${NAME}`` with no ``:-default``. Harbor resolves these from the
    runner's environment when the trial runs and fails it with a bare ValueError (read
    as a retryable infrastructure failure) when one is unset."""
    data = _task_toml(task_dir)
    tables = [(f"[{name}.env]", _table(_table(data, name), "env")) for name in _ENV_TABLES]
    steps = data.get("steps")
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        tables.append((f"[steps[{i}].verifier.env]", _table(_table(step, "verifier"), "env")))
    found = [
        (f"task.toml {where} {key}", match.group(1).strip())
        for where, env in tables
        for key, value in env.items()
        if isinstance(value, str) and (match := _REQUIRED_RE.fullmatch(value))
    ]
    return list(dict.fromkeys(found))


def _table(value: Any, key: str) -> dict[str, Any]:
    """``value[key]`` when both are tables, else {} (a malformed task.toml is Harbor's
    to report)."""
    inner = value.get(key) if isinstance(value, dict) else None
    return inner if isinstance(inner, dict) else {}


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{where} {k}" if where.endswith(".toml") else f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")
    elif isinstance(value, str):
        yield where, value
