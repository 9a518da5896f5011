"""What a manifest may ask of a runner: the runner operator's policy, as pure checks.

A work message names an environment and its kwargs, an agent (by name or by
``module:Class``, imported on the runner), the runner variables its ``api_key_env``
hands to the agent, and agent kwargs that may point the agent (and its API key) at
another host; the task it names may template runner variables (``${NAME}``) into
its environment. The manifest author chooses all of that; the runner operator
decides what of it a runner accepts (schemas.runners.RunnerPolicy, loaded from
``TRIALBUS_POLICY_FILE``; safe defaults without one).

The runner enforces it in each trial's process before Harbor's TrialConfig is built
(services.runner.trial_process): a refusal is a final TrialFailed whose
exception_type is ``PolicyRefused``. The submitter checks the same rules against the
policies live runners publish (services.common.pools) and refuses early. Messages
name the field and the rule, never a value that could be a secret.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError

from schemas.manifest import (
    LOCAL_ENVIRONMENT_ALIAS,
    LOCAL_ENVIRONMENT_IMPORT_PATH,
    AgentSpec,
    ComputeSpec,
)
from schemas.runners import RunnerPolicy, forbidden_secret_name
from services.common.small_files import FileTooLarge, read_small_file
from services.common.task_variables import task_templates

POLICY_REFUSED = "PolicyRefused"
"""exception_type of a trial the runner refused (final: services.common.failures)."""
UNKNOWN_AGENT = "UnknownAgent"
"""exception_type of a trial whose agent name the runner's Harbor does not ship (final)."""

MAX_POLICY_BYTES = 1 << 20

# Agent kwargs whose value is where the agent sends its requests. Any string value
# holding a URL counts too, whatever its key (e.g. an env mapping of OPENAI_BASE_URL).
_ENDPOINT_KEY_RE = re.compile(
    r"(^|_)(api_base|base_url|endpoint|api_url|url|host|server|proxy|address)$", re.I
)


class PolicyRefused(Exception):
    """A request asks for something the runner's policy does not allow.

    ``str()`` names each refused field and the rule; it never holds a secret value.
    """

    def __init__(self, refusals: list[str]) -> None:
        super().__init__("runner policy: " + "; ".join(refusals))
        self.refusals = refusals


class PolicyFileError(ValueError):
    """The policy file cannot be read or is not a valid policy (names file and field)."""


def load_policy(path: Path | None) -> RunnerPolicy:
    """The policy in ``path`` (YAML or JSON), or the safe default when ``path`` is None."""
    if path is None:
        return RunnerPolicy()
    try:
        raw = read_small_file(path, MAX_POLICY_BYTES)
    except FileTooLarge as exc:
        raise PolicyFileError(f"policy file {path}: {exc.strerror}") from None
    except OSError as exc:
        raise PolicyFileError(f"policy file {path}: cannot be read ({exc.strerror})") from exc
    try:
        data = json.loads(raw) if path.suffix == ".json" else yaml.safe_load(raw.decode())
    except (ValueError, yaml.YAMLError) as exc:
        raise PolicyFileError(f"policy file {path}: not valid YAML/JSON ({exc})") from exc
    try:
        return RunnerPolicy.model_validate(data or {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise PolicyFileError(f"policy file {path}: {problems}") from None


def request_refusals(
    policy: RunnerPolicy,
    agent: AgentSpec,
    compute: ComputeSpec,
    where: str = "agent",
    *,
    on_host: bool = False,
) -> list[str]:
    """Why ``policy`` refuses this agent on this compute spec (empty: allowed);
    ``on_host``: judged on the runner's own host (see ``compute_refusals``)."""
    return [
        *agent_refusals(policy, agent, where),
        *compute_refusals(policy, compute, on_host=on_host),
    ]


def harbor_agent_names() -> frozenset[str]:
    """The agent names this process's Harbor ships (``harbor run --agent``'s choices)."""
    from harbor.models.agent.name import AgentName

    return frozenset(a.value for a in AgentName)


def unknown_agent(name: str, known: Collection[str]) -> str | None:
    """Why ``name`` cannot be run by a Harbor that ships ``known`` (None: it can)."""
    if name in known:
        return None
    close = difflib.get_close_matches(name, sorted(known), n=3)
    if close:
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? Or"
    else:
        hint = f"Harbor's agents: {', '.join(sorted(known))}; or"
    return f"{name!r} is not an agent Harbor ships ({hint} name the agent's class with import_path)"


def secrets_set(policy: RunnerPolicy, environ: Mapping[str, str]) -> list[str]:
    """The policy's secret names that ``environ`` sets to something (an empty value is no
    key), sorted: what a runner announces (``RunnerInfo.secrets_set``), names only."""
    return sorted(name for name in policy.allowed_secrets if environ.get(name))


def agent_refusals(policy: RunnerPolicy, agent: AgentSpec, where: str = "agent") -> list[str]:
    """Refusals for the agent's name or import path, api_key_env and endpoints."""
    out: list[str] = []
    if agent.import_path is not None and agent.import_path not in policy.agent_import_paths:
        out.append(
            f"{where}.import_path: {agent.import_path!r} is not in the runner policy's "
            "agent_import_paths (code named by a manifest is imported on the runner)"
        )
    if (
        agent.name is not None
        and policy.agent_names is not None
        and agent.name not in policy.agent_names
    ):
        out.append(f"{where}.name: {agent.name!r} is not in the runner policy's agent_names")
    allowed = policy.allowed_secrets
    for i, name in enumerate(agent.api_key_env):
        if forbidden_secret_name(name):
            out.append(
                f"{where}.api_key_env[{i}]: {name} is one of the runner's own variables "
                "(TRIALBUS_*, NATS_*, LEDGER_*, AWS_*, HOME, PATH, ...): never passed to a trial"
            )
        elif name not in allowed:
            out.append(
                f"{where}.api_key_env[{i}]: {name} is not in the runner policy's "
                "secret_names (add it to extra_secret_names on the runners to allow it)"
            )
    for field, host in _endpoints(agent.kwargs, f"{where}.kwargs"):
        if not _host_allowed(host, policy.endpoint_hosts):
            out.append(
                f"{field}: host {host!r} is not in the runner policy's endpoint_hosts "
                "(an agent's API key would be sent there)"
            )
    return out


def compute_refusals(
    policy: RunnerPolicy, compute: ComputeSpec, *, on_host: bool = False
) -> list[str]:
    """Refusals for compute.environment and compute.environment_kwargs.

    A path kwarg must lie lexically inside an allowed folder; ``on_host`` (the runner,
    on the host the path names) it must also once links are resolved, so a link inside
    an allowed folder cannot lead out of it. The submitter judges lexically only: the
    path names another host's files.
    """
    env = compute.environment
    if env == LOCAL_ENVIRONMENT_IMPORT_PATH:
        env = LOCAL_ENVIRONMENT_ALIAS
    rule = policy.environments.get(env)
    if rule is None:
        return [
            f"compute.environment: {env!r} is not in the runner policy's environments "
            f"(allowed: {', '.join(sorted(policy.environments)) or 'none'})"
        ]
    out: list[str] = []
    for key, value in compute.environment_kwargs.items():
        field = f"compute.environment_kwargs.{key}"
        if key in rule.path_kwargs:
            roots = rule.path_kwargs[key]
            if not all(_path_inside(p, roots, resolve=on_host) for p in _leaves(value)):
                out.append(
                    f"{field}: a path outside the folders the runner policy allows for it "
                    f"({', '.join(roots) or 'none'})"
                )
        elif key not in rule.kwargs:
            out.append(
                f"{field}: not a key the runner policy allows for environment {env!r} "
                "(host paths and sandbox limits are the runner operator's)"
            )
    return out


def task_template_refusals(policy: RunnerPolicy, task_dir: Path, task_name: str) -> list[str]:
    """Refusals for runner variables a task templates into its environment: ``${NAME}``
    anywhere in task.toml, ``$NAME`` in the task's compose file."""
    return template_refusals(policy, task_templates(task_dir), task_name)


def template_refusals(
    policy: RunnerPolicy, found: list[tuple[str, str]], task_name: str
) -> list[str]:
    """Refusals for a task's templates (:func:`task_templates`) under ``policy``."""
    allowed = policy.allowed_secrets
    return [
        f"task {task_name}: {field}: ${{{var}}} names a runner variable the runner policy "
        "does not allow (secret_names)"
        for field, var in found
        if var not in allowed or forbidden_secret_name(var)
    ]


def check_request(policy: RunnerPolicy, agent: AgentSpec, compute: ComputeSpec) -> None:
    """Raise PolicyRefused when ``policy`` refuses the request."""
    refusals = request_refusals(policy, agent, compute)
    if refusals:
        raise PolicyRefused(refusals)


def _endpoints(value: Any, where: str, key: str = "") -> Iterator[tuple[str, str]]:
    """(field, host) of every endpoint in agent kwargs, at any depth."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _endpoints(v, f"{where}.{k}", str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _endpoints(v, f"{where}[{i}]", key)
    elif isinstance(value, str):
        text = value.strip()
        if "://" in text:
            yield where, _host_of(text)
        elif _ENDPOINT_KEY_RE.search(key) and text:
            yield where, _host_of("//" + text)


def _host_of(url: str) -> str:
    """``host`` or ``host:port`` of a URL; never its user or password."""
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        return f"{host}:{parts.port}" if parts.port else host
    except ValueError:
        return "(unparsable URL)"


def _host_allowed(host: str, allowed: list[str]) -> bool:
    bare = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    names = {a.lower() for a in allowed}
    return bool(host) and (host in names or bare in names)


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _path_inside(value: Any, roots: list[str], *, resolve: bool = False) -> bool:
    """Whether ``value`` is an absolute path lexically inside one of ``roots``, and with
    ``resolve`` also once the links of both are resolved on this host."""
    if not isinstance(value, str) or not os.path.isabs(value) or "\x00" in value:
        return False
    for root in roots:
        if not _under(os.path.normpath(value), os.path.normpath(root)):
            continue
        if not resolve or _under(os.path.realpath(value), os.path.realpath(root)):
            return True
    return False


def _under(path: str, base: str) -> bool:
    return os.path.isabs(base) and (path == base or path.startswith(base.rstrip("/") + "/"))
