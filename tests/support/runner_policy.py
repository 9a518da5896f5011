"""Runner policy files for tests whose runners must allow more than the safe default.

``policy_env(folder, extra_secret_names=[...])`` writes a policy file (the fields of
schemas.runners.RunnerPolicy) and returns the runner environment naming it, for an
EmbeddedStack's ``runner_env`` or a runner process's environment;
``start_runner(...)`` starts a runner process of its own under such a file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.service_process import ServiceProcess
from schemas.runners import RunnerPolicy

type StartRunner = Callable[..., ServiceProcess]
"""``start(policy_file, runner_id, **extra_env)``: a started runner process (the
``policy_runner`` fixture of tests/security/conftest.py)."""


def write_policy(folder: Path, **fields: Any) -> Path:
    """A policy file in ``folder`` (validated first, so a typo fails here)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "runner-policy.json"
    path.write_text(RunnerPolicy(**fields).model_dump_json(exclude_unset=True))
    return path


def policy_env(folder: Path, **fields: Any) -> dict[str, str]:
    """``{"TRIALBUS_POLICY_FILE": <a policy file with fields>}``."""
    return {"TRIALBUS_POLICY_FILE": str(write_policy(folder, **fields))}


def start_runner(
    folder: Path,
    policy: Path,
    *,
    runner_id: str,
    nats_url: str,
    ledger_url: str,
    prefix: str,
    **extra_env: str,
) -> ServiceProcess:
    """A runner process (one trial at a time, JSON logs, its folders and log in
    ``folder``) under the policy file ``policy``, started; ``extra_env`` is added to
    its environment (replacing the defaults above, folders included), which inherits
    no TRIALBUS_ variable of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    env.update(
        NATS_URL=nats_url,
        LEDGER_URL=ledger_url,
        TRIALBUS_PREFIX=prefix,
        TRIALBUS_RUNNER_ID=runner_id,
        TRIALBUS_CONCURRENCY="1",
        TRIALBUS_WORK_DIR=str(folder / "runner"),
        TRIALBUS_SANDBOX_DIR=str(folder / "sandboxes"),
        TRIALBUS_POLICY_FILE=str(policy),
        TRIALBUS_LOG_JSON="true",
    )
    env.update(extra_env)  # may replace the folders above
    proc = ServiceProcess("runner", env, folder / "runner.log")
    proc.start()
    return proc
