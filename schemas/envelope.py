"""What every event shares: the envelope, and the bases of the trial and run events.

``schemas.events`` is the module to import from; this one holds the bases so that
the event families (``experiment_events``, ``trial_events``) can build on them.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from schemas.documented import DOCUMENTED

SCHEMA_VERSION = 2
"""Version of the event contract this code writes and the newest it reads."""

# Ids name subjects, object names and folder names on the runners and the importer,
# so an event can only carry ids that are one safe token: no '/', no leading '.',
# no NATS wildcards, no spaces. Experiment ids are subject tokens: no '.' either.
EXPERIMENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
TRIAL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$"
RUN_ID_PATTERN = r"^(|[A-Za-z0-9][A-Za-z0-9_.:-]{0,299})$"


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _new_id() -> str:
    return uuid.uuid4().hex


def type_tag(value: str) -> Any:
    """The ``type`` field of one event model: its literal tag in the ``Event`` union."""
    return Field(
        default=value,
        description="Event type: the tag that selects the model when an event is decoded.",
    )


class Envelope(BaseModel):
    """Fields every event carries."""

    model_config = ConfigDict(frozen=True, extra="ignore", **DOCUMENTED)

    event_id: str = Field(default_factory=_new_id)
    """Unique id of this event (uuid4, hex)."""
    occurred_at: AwareDatetime = Field(default_factory=_utcnow)
    """When the event happened (timezone-aware, UTC)."""
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    """Event contract version; newer versions are refused, not guessed."""
    experiment_id: str = Field(pattern=EXPERIMENT_ID_PATTERN)
    """Experiment the event belongs to."""
    trial_id: str | None = Field(default=None, pattern=TRIAL_ID_PATTERN)
    """Trial, where one applies."""
    correlation_id: str = ""
    """Id shared by all events caused by one submission."""

    def dedup_id(self) -> str:
        """JetStream Nats-Msg-Id: the natural key of the event, so retries dedupe."""
        return self.event_id


class TrialEvent(Envelope):
    """An event about one trial: ``trial_id`` is required."""

    trial_id: str = Field(pattern=TRIAL_ID_PATTERN)
    """Trial the event is about: deterministic in (experiment, task, agent, model, repetition), also
    Harbor's trial name."""


class RunEvent(TrialEvent):
    """An event of one run of a trial: the work message and what its runner reports.

    A run is one TrialRequested message: a trial's first run, or a re-run that a later
    submission asked for because the trial has no scored record. Every dedup id of a
    run starts with its ``run_key``, so a retried publish of the same event dedupes
    while another attempt, or another run, publishes a new event.
    """

    run_id: str = Field(default="", pattern=RUN_ID_PATTERN)
    """Id of the run (work message) the event belongs to: trial_id for a trial's first run,
    trial_id:resume:<n> for a re-run, empty meaning trial_id; keys the run's events for dedup."""

    @property
    def run_key(self) -> str:
        """The run's id: ``run_id``, or ``trial_id`` for a trial's first run."""
        return self.run_id or self.trial_id

    def dedup_id(self) -> str:
        """``<run_key>`` followed by what tells this event apart within the run."""
        return ":".join((self.run_key, *self._dedup_suffix()))

    def _dedup_suffix(self) -> tuple[str, ...]:
        # The work message itself: one per run, so the run key alone.
        return ()

    # No return annotation on purpose: pydantic would build the serialization JSON
    # schema from it (a bare dict) instead of from the model's fields.
    @model_serializer(mode="wrap")
    def _run_id_last(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        # run_id was the last field of each run event before this base existed; the
        # key order is part of the wire bytes (tests/unit/test_schema_golden.py).
        data = handler(self)
        if isinstance(data, dict) and "run_id" in data:
            data["run_id"] = data.pop("run_id")
        return data
