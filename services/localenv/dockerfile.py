"""The small part of a task's Dockerfile the local environment understands today."""

from __future__ import annotations

import posixpath
import shlex


def workdir_from_dockerfile(text: str) -> str | None:
    """Last absolute ``WORKDIR`` of a Dockerfile (relative ones join the previous)."""
    workdir: str | None = None
    for raw in _logical_lines(text):
        parts = raw.split(None, 1)
        if len(parts) == 2 and parts[0].upper() == "WORKDIR":
            value = shlex.split(parts[1])[0] if parts[1].strip() else ""
            if value.startswith("/"):
                workdir = _clean(value)
            elif value:
                workdir = _clean(f"{workdir or '/'}/{value}")
    return workdir


def _clean(path: str) -> str:
    # As Docker does: '/a/b/../c' is '/a/c' (the sandbox refuses paths with '..').
    return "/" + posixpath.normpath(path).lstrip("/")


def _logical_lines(text: str) -> list[str]:
    """Join backslash continuations and drop comments and blank lines."""
    lines: list[str] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines
