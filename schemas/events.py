"""Events exchanged over NATS JetStream: one envelope, one discriminated union.

Every event is a frozen pydantic model with a literal ``type`` tag. Services import
these models; none keeps a copy. ``parse_event`` is the only decoder.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from schemas.manifest import MAX_INT64, AgentSpec, ComputeSpec, RetrySpec, check_storable

SCHEMA_VERSION = 1
"""Version of the event contract this code writes and the newest it reads."""

MAX_EVENT_BYTES = 512 * 1024
"""Largest encoded event accepted; bigger payloads are refused before parsing."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _new_id() -> str:
    return uuid.uuid4().hex


class EventDecodeError(ValueError):
    """An incoming message is not a valid trialbus event (poison: reject, never retry)."""


class Envelope(BaseModel):
    """Fields every event carries."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_id: str = Field(default_factory=_new_id, description="Unique id of this event.")
    occurred_at: AwareDatetime = Field(
        default_factory=_utcnow, description="When the event happened (UTC)."
    )
    schema_version: int = Field(
        default=SCHEMA_VERSION,
        ge=1,
        le=SCHEMA_VERSION,
        description="Event contract version; newer versions are refused, not guessed.",
    )
    experiment_id: str = Field(description="Experiment the event belongs to.")
    trial_id: str | None = Field(default=None, description="Trial, where one applies.")
    correlation_id: str = Field(
        default="", description="Id shared by all events caused by one submission."
    )

    def dedup_id(self) -> str:
        """JetStream Nats-Msg-Id: the natural key of the event, so retries dedupe."""
        return self.event_id


class TaskRef(BaseModel):
    """A resolved Harbor task (a folder on the runners' shared file system)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Task name (folder name).")
    path: str = Field(description="Absolute task folder path.")
    checksum: str = Field(description="sha256 of the task folder's files at submit time.")


class ExperimentSubmitted(Envelope):
    """An experiment was validated and its trials published."""

    type: Literal["experiment_submitted"] = "experiment_submitted"
    name: str = Field(description="Experiment name from the manifest.")
    n_trials: int = Field(
        ge=0, le=MAX_INT64, description="Number of trials the manifest expands to."
    )
    n_published: int = Field(
        ge=0,
        le=MAX_INT64,
        description="Trials published by this submission (resume skips scored ones).",
    )
    manifest: dict[str, Any] = Field(description="The normalized manifest (no secrets).")

    @field_validator("manifest")
    @classmethod
    def _storable(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_storable("manifest", v)  # the importer stores it; a refusal would repeat
        return v

    def dedup_id(self) -> str:
        return f"{self.experiment_id}:submitted:{self.event_id}"


class TrialRequested(Envelope):
    """Work: run one trial. Published to the work stream with trial_id as dedup id."""

    type: Literal["trial_requested"] = "trial_requested"
    trial_id: str
    task: TaskRef
    agent: AgentSpec
    repetition: int = Field(ge=0, le=MAX_INT64, description="0-based repetition index.")
    compute: ComputeSpec
    retry: RetrySpec
    run_id: str = Field(
        default="",
        description="Id of the work message this run came from (trial_id, or "
        "trial_id:resume:<n> for a re-run); keys the run's events for dedup.",
    )

    def dedup_id(self) -> str:
        return self.run_id or self.trial_id


class TrialStarted(Envelope):
    """A runner began a trial (attempt counts JetStream deliveries)."""

    type: Literal["trial_started"] = "trial_started"
    trial_id: str
    runner_id: str
    host: str
    attempt: int = Field(ge=1, le=MAX_INT64)
    run_id: str = Field(
        default="",
        description="Id of the work message this run came from (trial_id, or "
        "trial_id:resume:<n> for a re-run); keys the run's events for dedup.",
    )

    def dedup_id(self) -> str:
        return f"{self.run_id or self.trial_id}:started:{self.attempt}"


class TrialLog(Envelope):
    """A chunk of a running trial's output (logs stream)."""

    type: Literal["trial_log"] = "trial_log"
    trial_id: str
    phase: str = Field(description="agent_setup | agent | verification")
    stream: Literal["stdout", "stderr"]
    text: str


class TrialCompleted(Envelope):
    """Harbor finished a trial and wrote its result.json (which may record an error)."""

    type: Literal["trial_completed"] = "trial_completed"
    trial_id: str
    trial_dir: str = Field(description="Absolute path of the Harbor trial folder.")
    job_dir: str = Field(description="Absolute path of the Harbor job folder.")
    source: Literal["runner", "external"] = Field(
        default="runner", description="'external': found by the watcher, not run by trialbus."
    )
    runner_host: str | None = None
    harbor_version: str | None = None
    environment: str | None = Field(default=None, description="Environment type/import path.")
    agent_label: str | None = None
    attempt: int = Field(default=1, ge=1, le=MAX_INT64)
    run_id: str = Field(
        default="",
        description="Id of the work message this run came from (trial_id, or "
        "trial_id:resume:<n> for a re-run); keys the run's events for dedup.",
    )

    def dedup_id(self) -> str:
        return f"{self.run_id or self.trial_id}:completed:{self.attempt}"


class TrialFailed(Envelope):
    """A trial could not produce a Harbor result (or gave up after its retries)."""

    type: Literal["trial_failed"] = "trial_failed"
    trial_id: str
    failure_class: Literal["agent", "verifier", "infrastructure", "cancelled"]
    error_type: str
    message: str
    attempt: int = Field(ge=1, le=MAX_INT64)
    final: bool = Field(description="False: the trial will be retried; True: it gives up.")
    trial_dir: str | None = None
    task: TaskRef | None = None
    agent: AgentSpec | None = None
    repetition: int | None = Field(default=None, ge=0, le=MAX_INT64)
    runner_host: str | None = None
    run_id: str = Field(
        default="",
        description="Id of the work message this run came from (trial_id, or "
        "trial_id:resume:<n> for a re-run); keys the run's events for dedup.",
    )

    def dedup_id(self) -> str:
        return f"{self.run_id or self.trial_id}:failed:{self.attempt}:{int(self.final)}"


class ResultImported(Envelope):
    """The importer upserted a trial's record into the ledger."""

    type: Literal["result_imported"] = "result_imported"
    trial_id: str
    status: Literal["complete", "partial"]
    scored: bool = Field(description="The record carries a valid reward.")
    main_reward: float | None = None
    changed: bool = Field(description="False when the ledger already held this record.")

    def dedup_id(self) -> str:
        return f"{self.trial_id}:imported:{self.event_id}"


class ExperimentCompleted(Envelope):
    """Every trial of the experiment has a ledger record."""

    type: Literal["experiment_completed"] = "experiment_completed"
    n_trials: int = Field(ge=0, le=MAX_INT64)
    n_scored: int = Field(ge=0, le=MAX_INT64)
    n_partial: int = Field(ge=0, le=MAX_INT64)

    def dedup_id(self) -> str:
        return f"{self.experiment_id}:completed:{self.n_trials}:{self.n_scored}:{self.n_partial}"


Event = Annotated[
    ExperimentSubmitted
    | TrialRequested
    | TrialStarted
    | TrialLog
    | TrialCompleted
    | TrialFailed
    | ResultImported
    | ExperimentCompleted,
    Field(discriminator="type"),
]

_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
EVENT_TYPES: tuple[str, ...] = (
    "experiment_submitted",
    "trial_requested",
    "trial_started",
    "trial_log",
    "trial_completed",
    "trial_failed",
    "result_imported",
    "experiment_completed",
)


def parse_event(data: bytes | str) -> Event:
    """Decode one event, or raise EventDecodeError naming what is wrong."""
    size = len(data.encode()) if isinstance(data, str) else len(data)
    if size > MAX_EVENT_BYTES:
        raise EventDecodeError(f"event of {size} bytes exceeds the {MAX_EVENT_BYTES}-byte limit")
    try:
        return _EVENT_ADAPTER.validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "<root>"
        if first["type"] == "union_tag_invalid":
            msg = f"unknown event type (known: {', '.join(EVENT_TYPES)})"
        elif first["type"] == "union_tag_not_found":
            msg = "missing 'type' field"
        else:
            msg = first["msg"]
        raise EventDecodeError(f"invalid event at {loc}: {msg}") from exc


def encode_event(event: Envelope) -> bytes:
    return event.model_dump_json().encode()
