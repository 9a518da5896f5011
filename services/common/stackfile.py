"""Finding the embedded stack: ``trialbus up`` writes its URLs to a stack file.

Commands run in the same project folder then reach it with no configuration.
``NATS_URL`` / ``LEDGER_URL`` (or TRIALBUS_* settings) always win over the file.
``TRIALBUS_STACK_FILE`` moves the file (tests give each stack its own).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.settings import CommonSettings

DEFAULT_STACK_FILE = Path(".trialbus/stack.json")

# What the file can fill in, when the environment did not set it.
_FROM_FILE = ("nats_url", "ledger_url", "jobs_dir")


class StackFileSettings(BaseSettings):
    """Where the stack file is (``TRIALBUS_STACK_FILE``)."""

    model_config = SettingsConfigDict(env_prefix="TRIALBUS_", extra="ignore", frozen=True)

    stack_file: Path = DEFAULT_STACK_FILE


def stack_file() -> Path:
    """The stack file's path (``TRIALBUS_STACK_FILE``, default .trialbus/stack.json)."""
    return StackFileSettings().stack_file


def write_stack_file(
    path: Path, *, nats_url: str, ledger_url: str, jobs_dir: Path, pid: int
) -> None:
    """Record a running stack's URLs, job folder and launcher pid."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "nats_url": nats_url,
                "ledger_url": ledger_url,
                "jobs_dir": str(jobs_dir.resolve()),
                "pid": pid,
            }
        )
    )


def read_stack_file(path: Path | None = None) -> dict[str, Any] | None:
    """The stack file's content; None when it is missing, unreadable, or its stack is gone."""
    p = path or stack_file()
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid = data.get("pid")
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # a stack that is gone
        except PermissionError:
            pass
    return data


def settings_for[S: CommonSettings](cls: type[S]) -> S:
    """Settings from the environment, filled in from a running embedded stack."""
    settings = cls()
    data = read_stack_file()
    if not data:
        return settings
    # model_fields_set holds what the environment set: that always wins over the file.
    overrides = {
        name: data[name]
        for name in _FROM_FILE
        if name not in settings.model_fields_set and data.get(name)
    }
    return cls(**overrides) if overrides else settings
