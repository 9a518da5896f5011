"""Finding the embedded stack: ``trialbus up`` writes its URLs to a stack file.

Commands run in the same project folder then reach it with no configuration.
``NATS_URL`` / ``LEDGER_URL`` (or TRIALBUS_* settings) always win over the file.
``TRIALBUS_STACK_FILE`` moves the file (tests give each stack its own).

When the stack's NATS requires authentication the file also names the folder of its
role credentials files (not their content); a command then connects as the role it
acts as (``settings_for(..., role=...)``): submit, cancel and status as ``submitter``,
``trialbus import`` as ``importer``.
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
    """The file `trialbus up` writes its running stack's URLs to, for the CLI to find."""


def stack_file() -> Path:
    """The stack file's path (``TRIALBUS_STACK_FILE``, default .trialbus/stack.json)."""
    return StackFileSettings().stack_file


def write_stack_file(
    path: Path,
    *,
    nats_url: str,
    ledger_url: str,
    jobs_dir: Path,
    pid: int,
    nats_credentials_dir: Path | None = None,
) -> None:
    """Record a running stack's URLs, job folder, launcher pid and credentials folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "nats_url": nats_url,
        "ledger_url": ledger_url,
        "jobs_dir": str(jobs_dir.resolve()),
        "pid": pid,
    }
    if nats_credentials_dir is not None:
        data["nats_credentials_dir"] = str(nats_credentials_dir.resolve())
    path.write_text(json.dumps(data))


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


def settings_for[S: CommonSettings](cls: type[S], role: str = "submitter") -> S:
    """Settings from the environment, filled in from a running embedded stack.

    ``role`` picks the stack's credentials file the command connects with; only when
    the NATS URL came from the file too (credentials of one server are no use on the
    server an environment variable names).
    """
    settings = cls()
    data = read_stack_file()
    if not data:
        return settings
    # model_fields_set holds what the environment set: that always wins over the file.
    overrides: dict[str, Any] = {
        name: data[name]
        for name in _FROM_FILE
        if name not in settings.model_fields_set and data.get(name)
    }
    folder = data.get("nats_credentials_dir")
    if (
        isinstance(folder, str)
        and "nats_url" in overrides
        and "nats_credentials" not in settings.model_fields_set
    ):
        overrides["nats_credentials"] = Path(folder) / f"{role}.json"
    return cls(**overrides) if overrides else settings
