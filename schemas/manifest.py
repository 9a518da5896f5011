"""The experiment manifest: what a researcher or CI submits (YAML or JSON).

One file on purpose (over 350 lines, nearly all field declarations with their
descriptions): the manifest's JSON schema and docs/manifest.md come from this page.

Only the *shape* lives here; resolving task paths against the file system is the
submitter's job (services.submitter.resolve).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# MAX_INT64 is re-exported: modules that check ledger-storable numbers import it from here.
from schemas.constraints import MAX_INT64 as MAX_INT64
from schemas.constraints import DelaySeconds, PositiveFinite, require_either
from schemas.documented import DOCUMENTED
from schemas.ids import agent_key
from schemas.subjects import CLASS_PATTERN, DEFAULT_POOL, POOL_PATTERN

ENV_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_EXPERIMENT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
CAPABILITY_PATTERN = r"^[a-z][a-z0-9_.-]{0,31}$"
"""A runner capability: an environment it can run (local, docker, ...) or a label (gpu)."""
MAX_REQUIRES = 16
# Values that look like credentials; a manifest is shared and stored, keys are not.
_SECRET_VALUE_RE = re.compile(
    r"^(sk-[A-Za-z0-9_-]{8,}|sk-ant-[A-Za-z0-9_-]{8,}|gh[pousr]_[A-Za-z0-9]{20,}|"
    r"AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{30,})"
)
_SECRET_KEY_RE = re.compile(r"(api[_-]?key|secret|token|password|passwd|credential)", re.I)

MAX_NAME_CHARS = 200
"""Longest name, label, model or import path: they are shown in tables and keyed on."""
MAX_CONCURRENT_TRIALS = 10_000
"""The most trials one experiment runs at once, and one runner process may hold (its
waiting trials are cheap: docs/performance.md, capacity)."""
MAX_PATH_CHARS = 4096
"""Longest task path, glob or dataset reference (PATH_MAX on Linux)."""
MAX_DATASET_FILTERS = 10_000
"""Most names or globs in a dataset's ``task_names`` or ``exclude_task_names``."""
MAX_DESCRIPTION_CHARS = 10_000
"""Longest free-text description: it travels in ExperimentSubmitted and every record's
copy of the manifest, so it stays far under an event's size limit (schemas.events)."""

LOCAL_ENVIRONMENT_ALIAS = "local"
"""Short manifest name of trialbus's bubblewrap environment."""

LOCAL_ENVIRONMENT_IMPORT_PATH = "services.localenv.environment:LocalEnvironment"

LOCAL_ALLOWLIST = "local.allowlist"
"""The capability of a runner whose local environment enforces a task's network allowlist
(one running as root: services/localenv/egress.py), which trials of such a task require."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, **DOCUMENTED)


def _reject_inline_secrets(where: str, values: dict[str, Any]) -> None:
    for key, value in values.items():
        _reject_secret_value(f"{where}.{key}", str(key), value)
    check_storable(where, values)


def check_storable(where: str, value: Any) -> None:
    """Refuse free-form data the ledger cannot store (it would fail every retry).

    BSON has no integers beyond 64 bits and no NUL characters in field names.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            if "\x00" in str(key):
                raise ValueError(
                    f"{where}: key {str(key)!r} contains a NUL character, which cannot be stored"
                )
            check_storable(f"{where}.{key}", item)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_storable(f"{where}[{i}]", item)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT64:
        raise ValueError(f"{where}: {value} is outside the 64-bit integer range the ledger stores")


def _reject_secret_value(where: str, key: str, value: Any) -> None:
    if isinstance(value, dict):
        _reject_inline_secrets(where, value)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _reject_secret_value(f"{where}[{i}]", key, item)
    elif isinstance(value, str) and (
        _SECRET_VALUE_RE.match(value) or (_SECRET_KEY_RE.search(key) and len(value) >= 8)
    ):
        raise ValueError(
            f"{where} looks like an inline secret; put the value in an "
            "environment variable on the runners and list its NAME under "
            "the agent's api_key_env instead"
        )


class TaskPath(_Strict):
    """A Harbor task folder, or a glob of them, relative to the manifest's folder."""

    path: str = Field(max_length=MAX_PATH_CHARS)
    """Task folder or glob (e.g. 'tasks/*')."""


TaskNamePatterns = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]],
    Field(min_length=1, max_length=MAX_DATASET_FILTERS),
]


class DatasetRef(_Strict):
    """A Harbor registry dataset, e.g. ``terminal-bench@2.0``: fetched with Harbor's own
    registry and task clients by ``trialbus submit`` (services/submitter/datasets.py),
    the same tasks ``harbor run --dataset`` would run. The fields are Harbor's
    ``DatasetConfig``'s."""

    dataset: str = Field(max_length=MAX_PATH_CHARS, pattern=r"^[^@\s]+(@[^@\s]+)?$")
    """Dataset name with optional '@version' (without: the registry's newest version)."""
    task_names: TaskNamePatterns | None = None
    """Only these tasks of the dataset, by name or glob (default: all)."""
    exclude_task_names: TaskNamePatterns | None = None
    """Leave out these tasks, by name or glob."""
    n_tasks: int | None = Field(default=None, gt=0, le=MAX_INT64)
    """At most this many tasks, the first after the filters, in the registry's order."""
    registry_path: str | None = Field(default=None, max_length=MAX_PATH_CHARS)
    """A Harbor registry JSON file, relative to the manifest (default: Harbor's registry)."""
    registry_url: str | None = Field(
        default=None, max_length=MAX_PATH_CHARS, pattern=r"^https?://\S+$"
    )
    """The URL of a Harbor registry JSON file (default: Harbor's registry)."""

    @model_validator(mode="after")
    def _one_registry(self) -> DatasetRef:
        if self.registry_path is not None and self.registry_url is not None:
            raise ValueError("give registry_path or registry_url, not both")
        return self


class StoredTask(_Strict):
    """A task already in the tasks bucket (uploaded with ``POST /tasks``), by checksum."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    """The task's name (its folder name on the runners), as uploaded."""
    checksum: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The checksum POST /tasks answered (sha256 over the task's files)."""


TaskSpec = Annotated[TaskPath | DatasetRef | StoredTask, Field(union_mode="left_to_right")]


class AgentSpec(_Strict):
    """One agent configuration to evaluate."""

    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """Harbor agent name (oracle, nop, ...)."""
    import_path: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """'module:Class' of a custom Harbor agent."""
    model: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """Model name passed to the agent."""
    label: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    """Display name in reports (default: name or import path)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Agent kwargs."""
    api_key_env: list[str] = Field(default_factory=list)
    """NAMES of environment variables the runner passes to the agent. Values never appear in
    manifests, events, records or logs."""

    @model_validator(mode="after")
    def _one_of_name_or_import_path(self) -> AgentSpec:
        if bool(self.name) == bool(self.import_path):
            raise ValueError("give exactly one of 'name' or 'import_path'")
        if self.import_path and not _IMPORT_PATH_RE.match(self.import_path):
            raise ValueError(
                f"import_path {self.import_path!r} must look like 'package.module:Class'"
            )
        _reject_inline_secrets("kwargs", self.kwargs)
        return self

    @field_validator("api_key_env")
    @classmethod
    def _env_names(cls, names: list[str]) -> list[str]:
        for i, n in enumerate(names):
            if not ENV_VAR_RE.match(n):
                # Never echo the entry: it may be the secret itself, and this message
                # ends up in terminals and CI logs.
                raise ValueError(
                    f"api_key_env entry {i} is not an environment variable name; "
                    "list the variable's NAME (e.g. ANTHROPIC_API_KEY), never its value"
                )
        return names

    @property
    def agent_ref(self) -> str:
        """Harbor agent name or import path."""
        return self.name or self.import_path or ""

    @property
    def display(self) -> str:
        return self.label or self.agent_ref


class ComputeSpec(_Strict):
    """Where and how trials run."""

    environment: str = LOCAL_ENVIRONMENT_ALIAS
    """'local' (trialbus bubblewrap sandbox), a Harbor environment type (docker, daytona, ...) or
    'module:Class'."""
    environment_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Passed to the environment; values that look like credentials are refused."""
    n_concurrent_trials: int = Field(default=4, ge=1, le=MAX_CONCURRENT_TRIALS)
    """Concurrency budget of the experiment: trials running at once across all runners."""
    timeout_multiplier: PositiveFinite = Field(default=1.0, le=100)
    """Harbor's timeout multiplier, applied to the task's own timeouts."""
    pool: str = Field(default=DEFAULT_POOL, pattern=POOL_PATTERN)
    """Runner pool the trials go to (its own work subject); only that pool's runners take them.
    Lowercase letters, digits and '-', at most 32."""
    requires: list[Annotated[str, Field(pattern=CAPABILITY_PATTERN)]] = Field(
        default_factory=list, max_length=MAX_REQUIRES
    )
    """Capabilities a runner of the pool must offer (e.g. 'docker', 'gpu'); the submitter refuses
    the manifest when no live runner has them all."""
    priority_class: str | None = Field(
        default=None, pattern=CLASS_PATTERN, exclude_if=lambda v: v is None
    )
    """Priority class of the experiment's trials (e.g. 'urgent', 'batch'; the operator's
    TRIALBUS_PRIORITY_CLASSES): runners take higher classes first by weight, never starving a lower
    one. Unset: the installation's default class ('normal'). Over HTTP, the token must allow it."""

    preemptible: bool = Field(default=False, exclude_if=lambda v: not v)
    """Whether a runner may stop a running trial of this experiment to give its slot to a waiting
    trial of a higher priority class (docs/scheduling.md). The stopped trial goes back to the queue,
    its attempt is not counted and it is never scored as a failure; it runs again later from the
    start."""

    @field_validator("environment_kwargs")
    @classmethod
    def _no_secrets(cls, v: dict[str, Any]) -> dict[str, Any]:
        _reject_inline_secrets("environment_kwargs", v)
        return v

    @property
    def environment_import_path(self) -> str | None:
        if self.environment == LOCAL_ENVIRONMENT_ALIAS:
            return LOCAL_ENVIRONMENT_IMPORT_PATH
        return self.environment if ":" in self.environment else None

    @property
    def environment_type(self) -> str | None:
        return None if self.environment_import_path else self.environment


class RetrySpec(_Strict):
    """Retries of transient infrastructure failures (agent/verifier outcomes are results)."""

    max_attempts: int = Field(default=3, ge=1, le=20)
    """Attempts per run, the first one included."""
    backoff_seconds: DelaySeconds = 2.0
    """Delay before the second attempt; it doubles for each later one."""
    max_backoff_seconds: DelaySeconds = 60.0
    """Upper bound of the delay between attempts."""


class BudgetSpec(_Strict):
    """A spending limit for the whole experiment, enforced by the runners."""

    max_cost_usd: PositiveFinite | None = None
    """Stop starting trials once the experiment's attempts cost this much (USD, as the agents report
    it; attempts without a price count tokens only)."""
    max_tokens: int | None = Field(default=None, gt=0, le=MAX_INT64)
    """Stop starting trials once the experiment's attempts used this many input + output tokens."""

    @model_validator(mode="after")
    def _some_limit(self) -> BudgetSpec:
        return require_either(self, "max_cost_usd", "max_tokens", "or leave budget out")


class ExperimentManifest(_Strict):
    """An experiment: tasks x agents x repetitions."""

    experiment_id: str | None = None
    """Stable id; generated from the manifest's content when absent, so resubmitting the same
    manifest addresses the same experiment."""
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    """Name shown in reports."""
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)
    """Free text."""
    tasks: list[TaskSpec] = Field(min_length=1)
    """Task folders or globs relative to the manifest's folder (a plain string is a path), or
    registry datasets."""
    agents: list[AgentSpec] = Field(min_length=1)
    """Agent configurations; each runs every task."""
    repetitions: int = Field(default=1, ge=1, le=100)
    """Trials per task and agent (for pass@k, spread)."""
    compute: ComputeSpec = Field(default_factory=ComputeSpec)
    """Where and how the trials run."""
    retry: RetrySpec = Field(default_factory=RetrySpec)
    """Retries of transient infrastructure failures."""
    budget: BudgetSpec | None = Field(default=None, exclude_if=lambda v: v is None)
    """Spending limit (USD and/or tokens). Once reached, trials not yet started end unscored as
    BudgetExceeded; trials running finish."""

    @field_validator("experiment_id")
    @classmethod
    def _id_shape(cls, v: str | None) -> str | None:
        if v is not None and not _EXPERIMENT_ID_RE.match(v):
            raise ValueError(
                f"experiment_id {v!r} must match {_EXPERIMENT_ID_RE.pattern} "
                "(lowercase letters, digits, '-', '_'; it becomes a NATS subject token)"
            )
        return v

    @field_validator("tasks", mode="before")
    @classmethod
    def _plain_strings_are_paths(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"path": item} if isinstance(item, str) else item for item in v]
        return v

    @field_validator("agents")
    @classmethod
    def _distinct_agents(cls, agents: list[AgentSpec]) -> list[AgentSpec]:
        # The same key the trial ids hash: two agents equal here would share trial ids.
        seen: set[str] = set()
        for a in agents:
            key = agent_key(a.agent_ref, a.model, a.kwargs)
            if key in seen:
                raise ValueError(
                    f"agent {a.agent_ref!r} with model {a.model!r} is listed twice with "
                    "the same kwargs; raise 'repetitions' instead"
                )
            seen.add(key)
        return agents


ManifestFormat = Literal["yaml", "json"]
