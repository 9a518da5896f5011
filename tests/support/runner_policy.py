"""Runner policy files for tests whose runners must allow more than the safe default.

``policy_env(folder, extra_secret_names=[...])`` writes a policy file (the fields of
schemas.runners.RunnerPolicy) and returns the runner environment naming it, for an
EmbeddedStack's ``runner_env`` or a runner process's environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas.runners import RunnerPolicy


def write_policy(folder: Path, **fields: Any) -> Path:
    """A policy file in ``folder`` (validated first, so a typo fails here)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "runner-policy.json"
    path.write_text(RunnerPolicy(**fields).model_dump_json(exclude_unset=True))
    return path


def policy_env(folder: Path, **fields: Any) -> dict[str, str]:
    """``{"TRIALBUS_POLICY_FILE": <a policy file with fields>}``."""
    return {"TRIALBUS_POLICY_FILE": str(write_policy(folder, **fields))}
