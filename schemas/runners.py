"""What a runner says about itself in the runner registry (a KV bucket with a TTL).

Each runner process keeps one :class:`RunnerInfo` under the key ``<pool>.<runner_id>``
of ``Topology.runners_bucket``, rewritten every heartbeat; a runner that stops
heartbeating drops out when the bucket's max age passes. The submitter reads the live
records to refuse a manifest no live runner can run (services.common.pools), and
each runner's :class:`RunnerPolicy` (what a manifest may ask of it) to refuse early
what the runner would refuse anyway (services.common.runner_policy).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, NonNegativeInt, field_validator

from schemas.documented import DOCUMENTED
from schemas.manifest import CAPABILITY_PATTERN, MAX_CONCURRENT_TRIALS
from schemas.subjects import DEFAULT_POOL, POOL_PATTERN, check_pool

RUNNER_ID_PATTERN = r"^[A-Za-z0-9_=-][A-Za-z0-9_.=-]{0,127}$"
"""A runner id is part of its registry key, which NATS KV limits to these characters."""


Capability = Annotated[str, Field(pattern=CAPABILITY_PATTERN)]
Capabilities = Annotated[list[Capability], Field(max_length=64)]
"""What a runner offers (detected environments, or its operator's labels)."""


EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)]
AgentName = Annotated[str, Field(max_length=64)]
"""A Harbor agent name (oracle, nop, ...)."""
ImportPath = Annotated[str, Field(max_length=200)]
"""A name or a 'module:Class' import path (of an agent, an environment)."""
HostName = Annotated[str, Field(max_length=255)]
"""A host, or host:port."""

_T = TypeVar("_T")
PolicyList = Annotated[list[_T], Field(max_length=256)]
"""One list of what a policy allows: at most 256 entries, each bounded by its type."""

DEFAULT_SECRET_NAMES = (
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENROUTER_API_KEY",
    "TOGETHER_API_KEY",
    "TOGETHERAI_API_KEY",
    "FIREWORKS_API_KEY",
    "XAI_API_KEY",
    "COHERE_API_KEY",
    "CEREBRAS_API_KEY",
    "DASHSCOPE_API_KEY",
    "MOONSHOT_API_KEY",
    "PERPLEXITYAI_API_KEY",
    "HF_TOKEN",
)
"""Model provider keys a runner passes to agents unless its policy file says otherwise."""

FORBIDDEN_SECRET_PREFIXES = (
    "TRIALBUS_",
    "NATS_",
    "LEDGER_",
    "AWS_",
    "AZURE_",
    "GOOGLE_APPLICATION",
)
FORBIDDEN_SECRET_NAMES = frozenset(
    {
        "HOME",
        "PATH",
        "USER",
        "LOGNAME",
        "SHELL",
        "PWD",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONHOME",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "SSH_AUTH_SOCK",
        "DOCKER_HOST",
        "KUBECONFIG",
    }
)
"""Runner variables no policy may hand to a trial: the runner's own credentials and
settings, cloud credentials it holds for itself, and what decides how programs run."""


def forbidden_secret_name(name: str) -> bool:
    """Whether ``name`` is a runner variable no policy may pass to a trial."""
    upper = name.upper()
    return upper in FORBIDDEN_SECRET_NAMES or upper.startswith(FORBIDDEN_SECRET_PREFIXES)


class EnvironmentRule(BaseModel):
    """What a manifest may set in ``compute.environment_kwargs`` for one environment."""

    model_config = ConfigDict(frozen=True, extra="forbid", **DOCUMENTED)

    kwargs: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=64)
    """Keys a manifest may set (values as given); any other key is refused."""
    path_kwargs: dict[Annotated[str, Field(max_length=64)], list[str]] = Field(
        default_factory=dict, max_length=16
    )
    """Keys whose value is a host path, each with the absolute folders the value must lie in (e.g.
    cache_dir: [/srv/layers]). None by default."""


class RunnerPolicy(BaseModel):
    """What a manifest may ask of a runner; the runner operator decides (policy file,
    ``TRIALBUS_POLICY_FILE``). The defaults are the safe policy of a runner without one.
    Published in the runner registry so the submitter refuses early what runners
    would refuse."""

    model_config = ConfigDict(frozen=True, extra="forbid", **DOCUMENTED)

    environments: dict[ImportPath, EnvironmentRule] = Field(
        default_factory=lambda: {"local": EnvironmentRule(), "docker": EnvironmentRule()},
        max_length=64,
    )
    """Allowed compute.environment values (a name or 'module:Class') and the environment_kwargs each
    accepts. Default: local and docker, no kwargs."""
    agent_names: PolicyList[AgentName] | None = None
    """Allowed Harbor agent names; None: every agent Harbor ships."""
    agent_import_paths: PolicyList[ImportPath] = Field(default_factory=list)
    """Allowed agent 'module:Class' import paths (imported on the runner). None by default."""
    secret_names: PolicyList[EnvName] = Field(default_factory=lambda: list(DEFAULT_SECRET_NAMES))
    """Runner variables an agent's api_key_env, and a task's ${NAME} templates, may name. Default:
    common model provider keys."""
    extra_secret_names: PolicyList[EnvName] = Field(default_factory=list)
    """Added to secret_names (the operator's own keys, e.g. MYLLM_API_KEY)."""
    endpoint_hosts: PolicyList[HostName] = Field(default_factory=list)
    """Hosts (or host:port) agent kwargs may send requests to (api_base, base_url, any URL). None by
    default: agents use their provider's endpoint."""

    pass_env: PolicyList[EnvName] = Field(default_factory=list)
    """Runner variables every trial's process keeps besides the base list (PATH, HOME, locale,
    TMPDIR, Docker's, ...) and its agent's api_key_env: e.g. HTTPS_PROXY, or a cloud environment's
    credentials. Visible to agents and Harbor, never redacted. None by default: the rest of the
    runner's environment is removed from trials (docs/security.md)."""

    @field_validator("secret_names", "extra_secret_names", "pass_env")
    @classmethod
    def _no_runner_secrets(cls, names: list[str]) -> list[str]:
        for name in names:
            if forbidden_secret_name(name):
                raise ValueError(
                    f"{name} is one of the runner's own variables (TRIALBUS_*, NATS_*, "
                    "LEDGER_*, AWS_*, HOME, PATH, ...); no policy may pass it to a trial "
                    "(PATH, HOME and the like reach every trial anyway)"
                )
        return names

    @property
    def allowed_secrets(self) -> frozenset[str]:
        """Every variable name a trial may be given."""
        return frozenset(self.secret_names) | frozenset(self.extra_secret_names)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class RunnerInfo(BaseModel):
    """One live runner process: where it is, which pool it serves, what it can run."""

    model_config = ConfigDict(frozen=True, extra="ignore", **DOCUMENTED)

    runner_id: str = Field(pattern=RUNNER_ID_PATTERN)
    """The runner's id (settings.runner_id, default host-pid); unique."""
    host: str = Field(max_length=255)
    """Host name the runner runs on."""
    pool: str = Field(default=DEFAULT_POOL, pattern=POOL_PATTERN)
    """Pool whose work it takes."""
    capabilities: Capabilities = Field(default_factory=list)
    """Environments it was found able to run (detected at start, e.g. 'local' when bubblewrap works,
    'docker' when the Docker daemon answers)."""
    labels: Capabilities = Field(default_factory=list)
    """Operator-declared capabilities (settings), e.g. 'gpu'."""
    harbor_version: str | None = Field(default=None, max_length=64)
    """Version of Harbor the runner uses."""
    harbor_agents: PolicyList[AgentName] | None = None
    """The agent names the runner's Harbor ships; None from runners older than this field: not
    checked at submit."""
    concurrency: int = Field(ge=1, le=MAX_CONCURRENT_TRIALS)
    """Trials it runs at once."""
    policy: RunnerPolicy | None = None
    """What manifests may ask of this runner (its policy file, or the safe default); None from
    runners older than the policy: not checked at submit."""
    secrets_set: PolicyList[EnvName] | None = None
    """Which of its policy's secret names are set (not empty) in the runner's environment: names
    only, never a value. An agent's api_key_env that no live runner of its pool has set is refused
    at submit. None from runners older than this field: not checked."""
    started_at: AwareDatetime = Field(default_factory=_utcnow)
    """When the runner process started (UTC)."""
    last_seen: AwareDatetime = Field(default_factory=_utcnow)
    """When this record was written (UTC)."""
    in_flight: NonNegativeInt | None = None
    """Trials it is running now, as of last_seen (None: a runner older than this field)."""
    done: NonNegativeInt | None = None
    """Attempts it ran to the end (TrialCompleted) since it started."""
    failed: NonNegativeInt | None = None
    """Attempts that ended in TrialFailed (final or retried) since it started."""

    @property
    def offers(self) -> frozenset[str]:
        """Everything a manifest's ``compute.requires`` may be matched against."""
        return frozenset(self.capabilities) | frozenset(self.labels)

    def seen_now(self, load: RunnerLoad | None = None) -> RunnerInfo:
        """This record with ``last_seen`` set to now and, when given, the runner's
        ``load`` (what a heartbeat writes)."""
        update: dict[str, object] = {"last_seen": _utcnow()}
        if load is not None:
            update.update(in_flight=load.in_flight, done=load.done, failed=load.failed)
        return self.model_copy(update=update)


class RunnerLoad(BaseModel):
    """What a runner is doing, counted since it started (its heartbeat carries it)."""

    model_config = ConfigDict(frozen=True, **DOCUMENTED)

    in_flight: NonNegativeInt = 0
    """Trials running now."""
    done: NonNegativeInt = 0
    """Attempts that ended in TrialCompleted."""
    failed: NonNegativeInt = 0
    """Attempts that ended in TrialFailed."""


def registry_key(pool: str, runner_id: str) -> str:
    """Key of a runner's record in the runners bucket: ``<pool>.<runner_id>``.

    The pool comes first so a runner user's write right can be one pool's keys
    (infra/nats_permissions.py grants ``$KV.<bucket>.<pool>.>``).
    """
    if not re.match(RUNNER_ID_PATTERN, runner_id):
        raise ValueError(f"runner id {runner_id!r} must match {RUNNER_ID_PATTERN}")
    return f"{check_pool(pool)}.{runner_id}"


def check_capability(name: str) -> str:
    """Return ``name``, or raise ValueError when it cannot be a capability or label."""
    if not re.match(CAPABILITY_PATTERN, name):
        raise ValueError(
            f"capability {name!r} must match {CAPABILITY_PATTERN} (lowercase letters, "
            "digits, '_', '.', '-', starting with a letter, at most 32 characters)"
        )
    return name
