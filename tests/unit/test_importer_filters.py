"""The importer's durable takes only the events it acts on (``IMPORTED_EVENTS``).

Filtering is safe only if no event outside the filters would have changed what a
batch does: every sample event is planned alone, and one that changes the plan (a
record, an experiment, a completion, a verdict other than a plain ack) must be of a
filtered type. The negative control drops a type from the filters and sees the check
name the events it would lose.
"""

from __future__ import annotations

from typing import Any

from schemas.envelope import Envelope
from schemas.subjects import Topology
from services.common.errors import ACK
from services.importer.handlers import (
    IMPORTED_EVENTS,
    BatchPlan,
    Incoming,
    importer_filters,
    plan_batch,
)
from tests.support.sample_events import instances


class _NoTrials:
    """Trial folders that fail when read: a record built from one is an act too."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"trial folders read ({name})")


async def _acts(event: Envelope) -> bool:
    plan = await plan_batch(
        [Incoming(event.model_dump_json().encode())],
        _NoTrials(),  # type: ignore[arg-type]
        transient_delay_s=1.0,
    )
    return plan != BatchPlan(settles=[ACK])


async def _lost_by(filtered: tuple[type[Envelope], ...]) -> list[str]:
    """The sample events a durable filtered to ``filtered`` would withhold although
    planning them changes the batch."""
    return [
        name
        for name, event in instances().items()
        if not isinstance(event, filtered) and await _acts(event)
    ]


async def test_every_event_the_importer_acts_on_passes_its_filters() -> None:
    assert await _lost_by(IMPORTED_EVENTS) == []
    # Each filtered type is there for a reason: some sample of it changes the plan.
    for cls in IMPORTED_EVENTS:
        assert [await _acts(e) for e in instances().values() if isinstance(e, cls)].count(True)


async def test_negative_control_a_dropped_type_is_reported() -> None:
    without_completed = tuple(c for c in IMPORTED_EVENTS if c.__name__ != "TrialCompleted")
    assert await _lost_by(without_completed) == ["trial_completed", "trial_completed_defaults"]


def test_the_filters_name_one_subject_per_type() -> None:
    topo = Topology("tbx")
    assert importer_filters(topo) == [
        "tbx.events.experiment_submitted.*",
        "tbx.events.experiment_completed.*",
        "tbx.events.trial_completed.*",
        "tbx.events.trial_failed.*",
    ]
