"""Finding the embedded stack: ``trialbus up`` writes its URLs to a stack file.

Commands run in the same project folder then reach it with no configuration.
``NATS_URL`` / ``LEDGER_URL`` (or TRIALBUS_* settings) always win over the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from services.common.settings import CommonSettings

STACK_FILE_ENV = "TRIALBUS_STACK_FILE"
DEFAULT_STACK_FILE = Path(".trialbus/stack.json")


def stack_file() -> Path:
    return Path(os.environ.get(STACK_FILE_ENV, DEFAULT_STACK_FILE))


def write_stack_file(
    path: Path, *, nats_url: str, ledger_url: str, jobs_dir: Path, pid: int
) -> None:
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
    overrides: dict[str, Any] = {}
    data = read_stack_file()
    if data:
        if not ({"NATS_URL", "TRIALBUS_NATS_URL"} & os.environ.keys()):
            overrides["nats_url"] = data["nats_url"]
        if not ({"LEDGER_URL", "TRIALBUS_LEDGER_URL"} & os.environ.keys()):
            overrides["ledger_url"] = data["ledger_url"]
        if "TRIALBUS_JOBS_DIR" not in os.environ and data.get("jobs_dir"):
            overrides["jobs_dir"] = Path(data["jobs_dir"])
    return cls(**overrides)
