"""Process plumbing shared by the service entrypoints: stop signals, pluggable factories."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable


def install_stop_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM / SIGINT (one handler per process, set here only)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


def load_factory(spec: str) -> Callable[..., object]:
    """Import ``module:attribute`` (used for pluggable executors)."""
    import importlib

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not 'module:attribute'")
    factory: Callable[..., object] = getattr(importlib.import_module(module_name), attr)
    return factory
