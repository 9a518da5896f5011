"""Deterministic identifiers.

A trial_id is a pure function of (experiment, task, agent, model, repetition), so a
retried submission publishes the same ids, JetStream drops the duplicates, and the
ledger's unique index on trial_id keeps one record per trial whatever happens.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

_SLUG_RE = re.compile(r"[^a-z0-9]+")


def slug(text: str, max_len: int = 40) -> str:
    """Lowercase ``text`` to ``[a-z0-9-]`` (for ids, subjects and folder names)."""
    s = _SLUG_RE.sub("-", text.lower()).strip("-")
    return (s[:max_len].rstrip("-")) or "x"


def _digest(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def experiment_id_for(name: str, canonical_manifest: dict[str, Any]) -> str:
    """Id of an experiment whose manifest gives none: stable for the same content."""
    return f"{slug(name, 24)}-{_digest(canonical_manifest)[:10]}"


def agent_key(agent: str, model: str | None, kwargs: dict[str, Any]) -> str:
    """Short stable key of one agent configuration (name/import path, model, kwargs)."""
    return _digest(agent, model, kwargs)[:12]


def trial_id_for(
    experiment_id: str,
    task_name: str,
    agent: str,
    model: str | None,
    kwargs: dict[str, Any],
    repetition: int,
) -> str:
    """Deterministic trial id; also the Harbor trial_name and the JetStream msg id.

    Readable prefix (task slug) for people browsing a job folder, hash suffix for
    uniqueness. Characters are limited to ``[a-z0-9_-]`` so the id is safe in file
    names and NATS subjects.
    """
    h = _digest(experiment_id, task_name, agent, model, kwargs, repetition)[:16]
    return f"{slug(task_name, 32)}__{h}"
