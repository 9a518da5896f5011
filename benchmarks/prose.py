"""The words around the numbers on docs/performance.md (filled in from profiling)."""

from __future__ import annotations

TITLE = "# Performance"
METHOD = ""
SCALING = ""
REPRODUCE = ""
KEY_PEERS: dict[str, list[str]] = {}
WHAT: dict[str, str] = {}
LIMITS: dict[str, str] = {}
