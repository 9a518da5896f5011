"""Events of a whole experiment: its submission and its completion.

Import them from ``schemas.events``, which also holds the ``Event`` union and the codec.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from schemas.constraints import Count
from schemas.envelope import Envelope, type_tag
from schemas.manifest import check_storable


class ExperimentSubmitted(Envelope):
    """An experiment was validated and its trials published."""

    type: Literal["experiment_submitted"] = type_tag("experiment_submitted")
    name: str
    """Experiment name from the manifest."""
    n_trials: Count
    """Number of trials the manifest expands to."""
    n_published: Count
    """Trials published by this submission (resume skips scored ones)."""
    manifest: dict[str, Any]
    """The normalized manifest (no secrets)."""

    @field_validator("manifest")
    @classmethod
    def _storable(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_storable("manifest", v)  # the importer stores it; a refusal would repeat
        return v

    def dedup_id(self) -> str:
        """Keyed by event id: a resubmission is a legitimate new message."""
        return f"{self.experiment_id}:submitted:{self.event_id}"


class ExperimentCompleted(Envelope):
    """Every trial of the experiment has a ledger record."""

    type: Literal["experiment_completed"] = type_tag("experiment_completed")
    n_trials: Count
    """Trials the experiment expands to."""
    n_scored: Count
    """Trials whose record carries a valid reward."""
    n_partial: Count
    """Trials whose record is partial."""

    def dedup_id(self) -> str:
        """Keyed by the counts: the same completion announced twice dedupes."""
        return f"{self.experiment_id}:completed:{self.n_trials}:{self.n_scored}:{self.n_partial}"
