"""Trials paused one by one, stored as one control-bucket key per experiment.

``pause.<experiment>.trials`` holds a JSON list of trial ids. The submitter changes it
by compare-and-set; runners read it with the same cached read as the experiment's own
``pause.<experiment>`` flag, so an experiment costs them one read a second whatever
its trials (a key per trial would cost a round trip per delivery; docs/scheduling.md).
Used by services.common.adapters.nats_kv.NatsCoordinator.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from services.common.errors import TransientError

MAX_TRIES = 64
"""Compare-and-set attempts before giving up (each conflict is another writer's change)."""


def paused_trials_key(experiment_id: str) -> str:
    """The control-bucket key of the experiment's paused trials."""
    return f"pause.{experiment_id}.trials"


def trial_set(value: bytes | None) -> frozenset[str]:
    """The stored JSON list of paused trial ids (nothing stored: none)."""
    if not value:
        return frozenset()
    ids = json.loads(value)
    return frozenset(i for i in ids if isinstance(i, str)) if isinstance(ids, list) else frozenset()


async def change_paused_trials(
    control: KeyValue,
    experiment_id: str,
    change: Callable[[frozenset[str]], frozenset[str]],
) -> tuple[frozenset[str], bytes | None]:
    """Apply ``change`` to the stored list by compare-and-set (two submitters may change
    it at once): (the set before the change, the value written; None if unchanged)."""
    key = paused_trials_key(experiment_id)
    for _ in range(MAX_TRIES):
        try:
            entry = await control.get(key)
            before, last = trial_set(entry.value), entry.revision or 0
        except KeyNotFoundError as exc:  # never written, or deleted (its marker's revision)
            marker = getattr(exc, "entry", None)
            before, last = frozenset(), (marker.revision or 0) if marker is not None else 0
        after = change(before)
        if after == before:
            return before, None
        value = json.dumps(sorted(after)).encode()
        try:
            await control.update(key, value, last=last)
        except KeyWrongLastSequenceError:
            continue
        return before, value
    raise TransientError(f"the paused trials of {experiment_id} kept changing; try again")
