"""Events exchanged over NATS JetStream: one envelope, one discriminated union.

Every event is a frozen pydantic model with a literal ``type`` tag. Services import
these models from here; none keeps a copy. ``parse_event`` is the only decoder and
``encode_event`` the only encoder. The models live in three modules, re-exported here:

    envelope           Envelope (every event), TrialEvent, RunEvent (events of one run)
    experiment_events  ExperimentSubmitted, ExperimentCompleted
    trial_events       TaskRef, TeamRef, TrialRequested, TrialStarted, TrialLog, TrialCompleted,
                       TrialFailed, ResultImported
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError

from schemas.envelope import SCHEMA_VERSION, Envelope, RunEvent, TrialEvent
from schemas.experiment_events import ExperimentCompleted, ExperimentSubmitted
from schemas.trial_events import (
    ResultImported,
    TaskRef,
    TeamRef,
    TrialCompleted,
    TrialFailed,
    TrialLog,
    TrialRequested,
    TrialStarted,
)

__all__ = [
    "EVENT_TYPES",
    "MAX_EVENT_BYTES",
    "SCHEMA_VERSION",
    "Envelope",
    "Event",
    "EventDecodeError",
    "ExperimentCompleted",
    "ExperimentSubmitted",
    "ResultImported",
    "RunEvent",
    "TaskRef",
    "TeamRef",
    "TrialCompleted",
    "TrialEvent",
    "TrialFailed",
    "TrialLog",
    "TrialRequested",
    "TrialStarted",
    "encode_event",
    "parse_event",
]

MAX_EVENT_BYTES = 512 * 1024
"""Largest encoded event accepted; bigger payloads are refused before parsing."""


class EventDecodeError(ValueError):
    """An incoming message is not a valid trialbus event (poison: reject, never retry)."""


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
    """The wire form of ``event``: compact UTF-8 JSON, keys in field order."""
    return event.model_dump_json().encode()
