"""TrialRecord: the ledger document, one per trial_id."""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from schemas.documented import DOCUMENTED
from schemas.objects import ObjectRef

FailureClass = Literal["none", "agent", "verifier", "infrastructure", "cancelled"]
RecordStatus = Literal["complete", "partial"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, **DOCUMENTED)


class Provenance(_Doc):
    """Where a result came from, enough to reproduce or audit it."""

    task_name: str
    """Harbor task name (the task folder's name)."""
    task_path: str | None = None
    """Task folder path, when known."""
    task_checksum: str | None = None
    """Checksum of the task's files, as Harbor recorded it."""
    task_archive: str | None = None
    """sha256 naming the task's archive in the tasks bucket: exactly what a trialbus runner ran
    (``trialbus retry`` runs it again from any machine). None for external and imported trials
    and for records written before this field."""
    agent_name: str
    """Harbor agent name or import path."""
    agent_label: str | None = None
    """Display name from the manifest."""
    agent_version: str | None = None
    """Agent version, as Harbor recorded it."""
    model: str | None = None
    """Model the agent used, when known."""
    environment: str | None = None
    """Environment type or import path."""
    harbor_version: str | None = None
    """Version of Harbor that ran the trial, when known."""
    runner_host: str | None = None
    """Host of the runner that ran the trial (None: not trialbus)."""
    source: Literal["runner", "external", "import"] = "runner"
    """runner: run by trialbus; external: found by the watcher; import: read from a Harbor job
    folder by 'trialbus import'."""
    harbor_trial_uuid: str | None = None
    """Harbor's own trial id."""
    job_id: str | None = None
    """Harbor's id of the job the trial ran in."""


class PhaseTiming(_Doc):
    """Seconds per Harbor phase (None when the phase did not run)."""

    started_at: AwareDatetime | None = None
    """Trial start (UTC)."""
    finished_at: AwareDatetime | None = None
    """Trial end (UTC)."""
    total_s: float | None = None
    """Seconds from start to end."""
    environment_setup_s: float | None = None
    """Seconds spent building and starting the environment."""
    agent_setup_s: float | None = None
    """Seconds of agent setup."""
    agent_execution_s: float | None = None
    """Seconds the agent ran on the task."""
    verifier_s: float | None = None
    """Seconds the verifier ran."""
    phase_offsets_s: dict[str, float] = Field(default_factory=dict)
    """Seconds from the trial's start to each phase's start as Harbor recorded it (keys:
    environment_setup, agent_setup, agent_execution, verifier); a phase that did not run is absent
    (records written before this field: empty)."""


class Evaluation(_Doc):
    """What the verifier said, and whether it counts."""

    rewards: dict[str, float] = Field(default_factory=dict)
    """Every reward the verifier wrote, by key."""
    main_reward_key: str | None = None
    """Key of the main reward: the only one, else 'reward', else the first key in sorted order
    (Harbor's choice)."""
    main_reward: float | None = None
    """Value of the main reward (None when there is none)."""
    reward_valid: bool
    """True when the reward counts in a score (a valid number from the verifier)."""
    failure_class: FailureClass = "none"
    """What failed, by Harbor's error policy: none, agent (the trial still counts), verifier,
    infrastructure or cancelled."""
    exception_type: str | None = None
    """Class name of the exception that decided failure_class."""
    exception_message: str | None = None
    """Its message, cut to a bounded length."""


class Usage(_Doc):
    """Tokens and cost the agent reported (summed over steps; None when not reported)."""

    n_input_tokens: int | None = None
    """Input (prompt) tokens."""
    n_cache_tokens: int | None = None
    """Input tokens served from the provider's cache."""
    n_output_tokens: int | None = None
    """Output tokens."""
    cost_usd: float | None = None
    """Cost in US dollars."""


class Artifacts(_Doc):
    """Where the trial's files are: the stored archive, and the folder read.

    Paths are on the host that built the record (the importer's job-folder mirror, or
    the folder ``trialbus import`` read); the archive can be fetched from anywhere.
    """

    archive: ObjectRef | None = None
    """The trial folder's archive in the results bucket (None: not stored, e.g. imported from a job
    folder, or the attempt left no folder)."""
    trial_dir: str | None = None
    """Harbor trial folder."""
    job_dir: str | None = None
    """Harbor job folder."""
    result_path: str | None = None
    """The trial's result.json, if it exists."""
    verifier_dir: str | None = None
    """The verifier's output folder, if it exists."""
    agent_dir: str | None = None
    """The agent's output folder, if it exists."""


class TrialRecord(_Doc):
    """One trial's outcome in the ledger; keyed (unique) by trial_id."""

    trial_id: str
    """The trial's deterministic id; the ledger's unique key."""
    experiment_id: str
    """Experiment the trial belongs to."""
    repetition: int | None = None
    """0-based repetition index (None when unknown)."""
    status: RecordStatus
    """complete: Harbor's result was read in full; partial: something is missing or malformed and
    ``errors`` says what."""
    provenance: Provenance
    """Where the result came from."""
    timing: PhaseTiming = Field(default_factory=PhaseTiming)
    """When the trial ran and how long each phase took."""
    evaluation: Evaluation
    """The verifier's rewards and whether they count."""
    usage: Usage = Field(default_factory=Usage)
    """Tokens and cost the agent reported."""
    artifacts: Artifacts = Field(default_factory=Artifacts)
    """Where the trial's files are."""
    errors: list[str] = Field(default_factory=list)
    """Diagnostics, one per problem."""
    attempts: int = Field(default=1, ge=1)
    """Attempts of the run that produced this record (1 first)."""

    @property
    def scored(self) -> bool:
        """Whether the record counts in a score (its reward is valid)."""
        return self.evaluation.reward_valid

    def content_key(self) -> dict[str, object]:
        """The record without volatile fields, to tell a real change from a replay."""
        return self.model_dump(mode="json")
