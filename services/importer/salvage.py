"""Salvage of a malformed Harbor result.json: keep every field that is valid.

A result.json that fails validation is not thrown away: each invalid value is
reported (file, dotted path, what is wrong, what was found) and dropped, and the
rest is validated again, for a few rounds. What survives still yields provenance,
timing and usage; which top-level keys were dropped is remembered, because a damaged
``verifier_result`` or ``exception_info`` changes how the trial may be scored
(services.importer.scoring).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from schemas.harbor_result import HarborTrialResult
from services.importer.reads import parse_object, read_text, short
from services.importer.trial_files import TrialFiles

_SALVAGE_ROUNDS: Final = 8
_ABSENT: Final = object()


def _validate(data: dict[str, Any]) -> HarborTrialResult:
    # Strict JSON-mode validation: "12" is not a token count and true is not a
    # number, yet ISO timestamps still parse. Lax mode would coerce both silently.
    return HarborTrialResult.model_validate_json(json.dumps(data), strict=True)


def _child(container: Any, key: int | str) -> Any:
    if isinstance(container, dict) and isinstance(key, str):
        return container.get(key, _ABSENT)
    if isinstance(container, list) and isinstance(key, int) and 0 <= key < len(container):
        return container[key]
    return _ABSENT


def _drop(data: dict[str, Any], loc: tuple[int | str, ...], missing: bool) -> bool:
    """Remove the offending value so the rest of the file can still be read.

    A missing field is fixed by dropping its parent object; a root-level required
    field (task_name, trial_name: the only ones) gets an empty placeholder, which the
    caller replaces with a fallback. Returns False when the path cannot be followed.
    """
    path = loc[:-1] if missing else loc
    if not path:
        if missing and loc and isinstance(loc[0], str):
            data[loc[0]] = ""
            return True
        return False
    parent: Any = data
    for key in path[:-1]:
        parent = _child(parent, key)
        if parent is _ABSENT:
            return False
    last = path[-1]
    if isinstance(parent, dict) and isinstance(last, str) and last in parent:
        del parent[last]
        return True
    if isinstance(parent, list):
        # Removing one list item would shift the indexes of other errors: drop the list.
        return _drop(data, path[:-1], missing=False)
    return False


def validate_result(
    data: dict[str, Any], errors: list[str]
) -> tuple[HarborTrialResult | None, set[str]]:
    """Validate result.json, salvaging what is valid; also return the damaged top keys."""
    damaged: set[str] = set()
    reported: set[tuple[int | str, ...]] = set()
    for _ in range(_SALVAGE_ROUNDS):
        try:
            return _validate(data), damaged
        except ValidationError as exc:
            problems = exc.errors()
        for err in problems:
            loc = tuple(err["loc"])
            missing = err["type"] == "missing"
            if loc not in reported:
                reported.add(loc)
                where = dotted(loc)
                got = "" if missing else f" (got {short(err['input'])})"
                errors.append(f"result.json: {where}: {err['msg']}{got}")
            if loc:
                damaged.add(str(loc[0]))
            if not _drop(data, loc, missing):
                return None, damaged
    return None, damaged


def dotted(loc: tuple[int | str, ...]) -> str:
    """A validation error location as a path: ``step_results[0].agent_result``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "<root>"


@dataclass(frozen=True, slots=True)
class TrialRead:
    """What could be read of a trial folder."""

    result: HarborTrialResult | None
    damaged: frozenset[str]  # top-level result.json keys dropped as malformed
    config: Mapping[str, Any] | None  # Harbor's TrialConfig, from result.json or config.json


def read_trial(trial: TrialFiles, errors: list[str]) -> TrialRead:
    """Read result.json (salvaged), falling back to config.json for provenance only."""
    text = read_text(trial, "result.json", errors)
    if text is None and not errors:
        errors.append(
            "result.json: missing (Harbor did not finish this trial: it is still running, "
            "was interrupted, or its runner died)"
        )
    data = parse_object(text, "result.json", errors) if text is not None else None
    result, damaged = validate_result(data, errors) if data is not None else (None, set())
    if result is not None:
        return TrialRead(result, frozenset(damaged), result.config)
    config_text = read_text(trial, "config.json", errors)
    config = parse_object(config_text, "config.json", errors) if config_text is not None else None
    return TrialRead(None, frozenset(damaged), config)
