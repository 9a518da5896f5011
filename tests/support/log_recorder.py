"""A stand-in for a module's structlog logger that keeps what it was asked to log.

structlog's ``capture_logs`` cannot see a logger that an earlier test's
``configure_logging`` cached (``cache_logger_on_first_use``): which test ran before
decides whether it captures anything. Tests monkeypatch a module's ``log`` with a
:class:`LogRecorder` instead.
"""

from __future__ import annotations

from typing import Any


class LogRecorder:
    """Every call as ``{"event": ..., "log_level": ..., **fields}``, in order."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def __getattr__(self, level: str) -> Any:
        def emit(event: str, **kw: Any) -> None:
            self.entries.append({"event": event, "log_level": level, **kw})

        return emit
