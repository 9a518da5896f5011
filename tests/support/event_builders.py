"""One event with test defaults, so that a test names only the fields it is about.

The golden instances with fixed ids and timestamps are in tests/support/sample_events.py;
these builders are for tests that need an event of some kind, with one or two fields
that matter (the failure class, whether the import changed the record, ...).
"""

from __future__ import annotations

from typing import Any

from schemas.events import ResultImported, TrialFailed


def trial_failed(trial_id: str = "t", **fields: Any) -> TrialFailed:
    """A final agent failure (attempt 1) of ``trial_id`` in experiment "e"; ``fields``
    set any other field of TrialFailed."""
    defaults: dict[str, Any] = {
        "experiment_id": "e",
        "failure_class": "agent",
        "error_type": "X",
        "message": "m",
        "attempt": 1,
        "final": True,
    }
    return TrialFailed(trial_id=trial_id, **(defaults | fields))


def result_imported(trial_id: str = "t", **fields: Any) -> ResultImported:
    """A scored, complete import of ``trial_id`` in experiment "e" that changed its record
    (reward 1.0); ``fields`` set any other field of ResultImported."""
    defaults: dict[str, Any] = {
        "experiment_id": "e",
        "status": "complete",
        "scored": True,
        "main_reward": 1.0,
        "changed": True,
    }
    return ResultImported(trial_id=trial_id, **(defaults | fields))
