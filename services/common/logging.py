"""One structured log format per process: structlog, JSON when not a TTY.

Everything goes through the standard library's root handler, formatted by structlog's
``ProcessorFormatter``: lines from trialbus (structlog) and from libraries that use
``logging`` (Harbor, FastStream, nats-py, uvicorn) come out in the same shape with the
same renderer, so a service log is one JSON object per line and nothing else.

Per-message context: wrap the handling of one message in ``bound_event(event)`` and
every line logged inside it, by trialbus or by a library, carries ``experiment_id``,
``trial_id``, ``event_id`` and ``event_type``::

    with bound_event(event):
        await handle(event)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TextIO

import structlog

__all__ = ["NOISY_LIBRARIES", "bound_event", "configure_logging", "get_logger"]

# Libraries that log per message or per trial at INFO; kept to warnings so a service
# log stays readable (their warnings and errors still show, in the same format).
NOISY_LIBRARIES = ("harbor", "faststream", "nats", "LiteLLM", "httpx", "httpcore", "uvicorn")

# Applied to structlog's own events and to records from the standard library alike,
# before the renderer; merge_contextvars is what carries bound_event()'s ids.
_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(
    level: str = "INFO", json: bool | None = None, *, stream: TextIO | None = None
) -> None:
    """Configure structlog and the standard-library root logger for this process.

    Args:
        level: minimum level for trialbus's own lines (``DEBUG``, ``INFO``, ...);
            unknown names mean INFO.
        json: JSON lines when True, coloured key=value when False; None picks JSON
            unless ``stream`` is a terminal.
        stream: where lines go; the process's stderr when None.

    Calling it again replaces the previous configuration (the root logger keeps one
    handler), so a test can reconfigure with its own stream.
    """
    out = stream if stream is not None else sys.stderr
    use_json = (not out.isatty()) if json is None else json
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    _route_library_consoles_to_root()
    for noisy in NOISY_LIBRARIES:
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))


def _route_library_consoles_to_root() -> None:
    """Take console handlers off named loggers so their records reach the root handler.

    FastStream gives its ``faststream`` logger a coloured stderr handler at import and
    turns propagation off; uvicorn's default config does the same for ``uvicorn.*``.
    Only plain ``StreamHandler``s go: a library's file handler (a subclass) stays.
    """
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger):
            continue  # a PlaceHolder: a dotted prefix nobody logged to
        consoles = [h for h in logger.handlers if type(h) is logging.StreamHandler]
        for console in consoles:
            logger.removeHandler(console)
        if consoles and not logger.handlers:
            logger.propagate = True


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structlog logger named ``name`` (use ``__name__``); nothing is set up at import."""
    return structlog.get_logger(name)  # type: ignore[no-any-return]


class Identified(Protocol):
    """What ``bound_event`` reads: every trialbus event (``schemas.events.Envelope``)."""

    @property
    def experiment_id(self) -> str: ...
    @property
    def trial_id(self) -> str | None: ...
    @property
    def event_id(self) -> str: ...


@contextmanager
def bound_event(event: Identified, **extra: Any) -> Iterator[None]:
    """Bind the event's ids to every log line emitted while handling it.

    Binds ``experiment_id``, ``event_id``, ``event_type`` (the event's ``type`` tag)
    and ``trial_id`` when the event has one, plus ``extra`` (e.g. ``attempt=2``), in
    structlog's context variables; they are restored on exit, so concurrent handlers
    (each in its own asyncio task) never see each other's ids.
    """
    ids: dict[str, Any] = {"experiment_id": event.experiment_id, "event_id": event.event_id}
    event_type = getattr(event, "type", None)
    if event_type is not None:
        ids["event_type"] = event_type
    if event.trial_id is not None:
        ids["trial_id"] = event.trial_id
    with structlog.contextvars.bound_contextvars(**ids, **extra):
        yield
