"""Bounded, never-raising reads of the files in a Harbor trial folder.

A trial folder is written by an agent, a verifier and Harbor, any of which may be
broken or hostile: every read here stays inside the trial folder (no symbolic link is
followed), is size-limited, refuses FIFOs and devices, and turns every problem into
one diagnostic line (naming the file and why) instead of raising. The folder is a
``TrialFiles`` (services.importer.trial_files): on disk, or an archive just unpacked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from services.common.archive import TRIAL_MANIFEST
from services.common.folder_reads import MAX_FILE_BYTES, Unread
from services.importer.trial_files import MAX_MANIFEST_BYTES, TrialFiles

__all__ = ["MAX_FILE_BYTES", "get_path", "nonempty_str", "parse_object", "read_text", "short"]


def read_text(trial: TrialFiles, name: str, errors: list[str]) -> str | None:
    """The text of ``name`` in the trial, or None with a diagnostic (a missing file adds none).

    ``name`` is the file's path in the trial folder ("verifier/reward.txt") and starts
    its diagnostic. On disk the file is read with services.common.folder_reads: never
    through a symbolic link (the file's or a folder's on the way), never a FIFO or
    device, at most MAX_FILE_BYTES.
    """
    got = trial.read(name, MAX_FILE_BYTES)
    if isinstance(got, Unread):
        if not got.missing:
            errors.append(f"{name}: {got.reason}")
        return None
    try:
        return got.decode("utf-8")
    except UnicodeDecodeError as exc:
        errors.append(f"{name}: not UTF-8 text (invalid byte at offset {exc.start})")
        return None


def parse_object(text: str, label: str, errors: list[str]) -> dict[str, Any] | None:
    """Parse a JSON object, or None with a diagnostic."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        errors.append(f"{label}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
        return None
    except RecursionError:
        errors.append(f"{label}: invalid JSON: nested too deeply")
        return None
    except ValueError as exc:  # an integer beyond Python's digit limit
        errors.append(f"{label}: invalid JSON: {str(exc).split(';')[0]}")
        return None
    if not isinstance(data, dict):
        errors.append(f"{label}: expected a JSON object, found {_json_type(data)}")
        return None
    return data


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null" if value is None else type(value).__name__


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for quoting bad input in a diagnostic."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- small typed getters over Harbor's free-form dicts (config, step results) ----------


def get_path(data: Mapping[str, Any] | None, *keys: str) -> Any:
    """``data[k1][k2]...``, or None where a level is missing or not a mapping."""
    value: Any = data
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def nonempty_str(value: Any) -> str | None:
    """``value`` when it is a non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def left_out_diagnostic(trial: TrialFiles) -> str | None:
    """A diagnostic when the runner left files out of the stored folder.

    None when it has them all, and for a folder that was not unpacked from a stored
    archive (no TRIAL_MANIFEST: e.g. a Harbor job folder given to ``trialbus import``).
    """
    got = trial.read(TRIAL_MANIFEST, MAX_MANIFEST_BYTES)
    if isinstance(got, Unread):
        return None
    try:
        manifest = json.loads(got)
        left = manifest["left_out"]
        more = int(manifest.get("left_out_not_listed", 0))
    except (ValueError, KeyError, TypeError):
        return f"{TRIAL_MANIFEST}: unreadable; what the runner left out is unknown"
    if not left and not more:
        return None
    total = sum(int(x.get("size", 0)) for x in left if isinstance(x, dict))
    first = ", ".join(
        f"{x.get('name')} ({x.get('reason')})" for x in left[:3] if isinstance(x, dict)
    )
    return (
        f"trial folder stored in part: {len(left) + more} file(s), {total} bytes listed, "
        f"left out by the runner (e.g. {first}); see {TRIAL_MANIFEST}"
    )
