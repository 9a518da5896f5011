"""A run ends once: how the runner publishes a decision that may end a run.

An ending (a TrialCompleted or a final TrialFailed, cancellations included) is stored
with the coordinator first (``Coordinator.record_ending``), then published, then the
work message is acknowledged. If another runner stored one first (it ran the same
message after ack_wait), that stored ending is published instead, so every run ends
once whichever runner gets there first. Used by both halves of the handler: the start
path (services.runner.admission: a cancelled, refused or unrunnable trial ends before
it starts) and the settle path (services.runner.handlers).
"""

from __future__ import annotations

from typing import Any

from schemas.events import (
    EventDecodeError,
    TrialCompleted,
    TrialFailed,
    TrialRequested,
    encode_event,
    parse_event,
)
from services.common.errors import InternalError, Settle
from services.common.ports import Coordinator, EventBus
from services.runner import policy


def decode_ending(data: bytes, request: TrialRequested) -> TrialCompleted | TrialFailed:
    """A run's stored ending; one that cannot be read is a bug, not the message's fault."""
    try:
        event = parse_event(data)
    except EventDecodeError as exc:
        raise InternalError(f"stored ending of run {request.dedup_id()} unreadable: {exc}") from exc
    if not isinstance(event, TrialCompleted | TrialFailed) or event.run_key != request.dedup_id():
        raise InternalError(f"stored ending of run {request.dedup_id()} is not this run's")
    return event


async def publish_decision(
    bus: EventBus,
    coordinator: Coordinator,
    request: TrialRequested,
    decision: policy.Decision,
    bound: Any,
) -> Settle:
    """Publish the decision's events and return its verdict; an ending is stored first,
    and the one already stored is published instead when another runner got there."""
    events: tuple[TrialCompleted | TrialFailed, ...] = decision.events
    ending = decision.ending
    if ending is not None:
        data = encode_event(ending)
        stored = await coordinator.record_ending(request.dedup_id(), data)
        if stored != data:
            bound.warning("run already ended on another runner; publishing that ending")
            events = (decode_ending(stored, request),)
    for event in events:
        await bus.publish(event)
    return decision.settle
