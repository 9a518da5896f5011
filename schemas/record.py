"""TrialRecord: the ledger document, one per trial_id."""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

FailureClass = Literal["none", "agent", "verifier", "infrastructure", "cancelled"]
RecordStatus = Literal["complete", "partial"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Provenance(_Doc):
    """Where a result came from, enough to reproduce or audit it."""

    task_name: str
    task_path: str | None = None
    task_checksum: str | None = None
    agent_name: str = Field(description="Harbor agent name or import path.")
    agent_label: str | None = Field(default=None, description="Display name from the manifest.")
    agent_version: str | None = None
    model: str | None = None
    environment: str | None = Field(default=None, description="Environment type or import path.")
    harbor_version: str | None = None
    runner_host: str | None = None
    source: Literal["runner", "external", "import"] = "runner"
    harbor_trial_uuid: str | None = Field(default=None, description="Harbor's own trial id.")
    job_id: str | None = None


class PhaseTiming(_Doc):
    """Seconds per Harbor phase (None when the phase did not run)."""

    started_at: AwareDatetime | None = None
    finished_at: AwareDatetime | None = None
    total_s: float | None = None
    environment_setup_s: float | None = None
    agent_setup_s: float | None = None
    agent_execution_s: float | None = None
    verifier_s: float | None = None


class Evaluation(_Doc):
    """What the verifier said, and whether it counts."""

    rewards: dict[str, float] = Field(default_factory=dict)
    main_reward_key: str | None = None
    main_reward: float | None = None
    reward_valid: bool = Field(
        description="True when the reward counts in a score (a valid number from the verifier)."
    )
    failure_class: FailureClass = "none"
    exception_type: str | None = None
    exception_message: str | None = None


class Usage(_Doc):
    n_input_tokens: int | None = None
    n_cache_tokens: int | None = None
    n_output_tokens: int | None = None
    cost_usd: float | None = None


class Artifacts(_Doc):
    trial_dir: str | None = None
    job_dir: str | None = None
    result_path: str | None = None
    verifier_dir: str | None = None
    agent_dir: str | None = None


class TrialRecord(_Doc):
    """One trial's outcome in the ledger; keyed (unique) by trial_id."""

    trial_id: str
    experiment_id: str
    repetition: int | None = None
    status: RecordStatus = Field(
        description="complete: Harbor's result was read in full; partial: something is "
        "missing or malformed and ``errors`` says what."
    )
    provenance: Provenance
    timing: PhaseTiming = Field(default_factory=PhaseTiming)
    evaluation: Evaluation
    usage: Usage = Field(default_factory=Usage)
    artifacts: Artifacts = Field(default_factory=Artifacts)
    errors: list[str] = Field(default_factory=list, description="Diagnostics, one per problem.")
    attempts: int = Field(default=1, ge=1)

    @property
    def scored(self) -> bool:
        return self.evaluation.reward_valid

    def content_key(self) -> dict[str, object]:
        """The record without volatile fields, to tell a real change from a replay."""
        return self.model_dump(mode="json")
