"""``trialbus up`` hands its services the shell's trialbus settings (infra.stack_settings).

Run as an operator runs it, from a folder of their own: ``trialbus up`` with the HTTP
API's dataset registries and a relative dataset cache set in the shell, plus a
leftover ``NATS_URL`` of another installation and a misspelt setting. The API then
fetches a dataset from the allowed registry into the cache folder named relative to
where ``trialbus up`` started (it refuses every dataset when the setting does not reach
it: tests/security/test_http_api.py), refuses another registry, and the console named
what it passed and what not.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.stack_console import StackConsole, watched
from tests.support.task_registry import task_registry

pytestmark = pytest.mark.integration

TRIALBUS = str(Path(sys.executable).with_name("trialbus"))
EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def test_trialbus_up_passes_the_shell_s_settings_and_says_which(tmp_path: Path) -> None:
    tasks = {"hello-file": EXAMPLE_TASKS / "hello-file"}
    allowed = task_registry(tmp_path / "allowed", tasks)
    other = task_registry(tmp_path / "other", tasks)
    home = tmp_path / "operator"
    home.mkdir()
    stack_file = tmp_path / "stack.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    env.update(
        {
            "TRIALBUS_STACK_FILE": str(stack_file),
            "TRIALBUS_API_DATASET_REGISTRIES": str(allowed.file),
            "TRIALBUS_DATASET_CACHE": "dataset-cache",  # relative to where up starts
            "TRIALBUS_API_DATASET_REGISTRY": "misspelt",
            "NATS_URL": "nats://127.0.0.1:1",  # another installation's, left over
        }
    )
    argv = [TRIALBUS, "up", "--data-dir", "stack"]
    with watched(argv, home, env, home / "stack", stack_file, StackConsole) as console:
        up = console.lines[console.wait_line("trialbus is up", timeout=180)]
        said = "\n".join(console.lines)
        assert (
            "settings from this shell, for every service: TRIALBUS_API_DATASET_REGISTRIES, "
            "TRIALBUS_DATASET_CACHE" in said
        ), said
        assert "not passed: NATS_URL (the stack runs its own nats-server)" in said
        assert (
            "not passed: TRIALBUS_API_DATASET_REGISTRY is no setting of any trialbus service; "
            "did you mean TRIALBUS_API_DATASET_REGISTRIES?" in said
        ), said
        api = re.search(r"HTTP (http://127\.0\.0\.1:\d+) ", up)
        assert api, up
        token = (home / "stack" / "secrets" / "api-token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}

        def manifest(name: str, registry: Path) -> dict[str, object]:
            entry = {"dataset": "mini@1.0", "registry_path": str(registry)}
            return {"name": name, "tasks": [entry], "agents": [{"name": "oracle"}]}

        with httpx.Client(base_url=api.group(1), headers=headers, timeout=120) as client:
            refused = client.post("/experiments", json=manifest("other", other.file))
            assert refused.status_code == 422, refused.text
            assert "the HTTP API does not fetch from registry_path" in refused.json()["error"]
            accepted = client.post("/experiments", json=manifest("allowed", allowed.file))
            assert accepted.status_code == 202, accepted.text
        cached = list((home / "dataset-cache").rglob("task.toml"))
        assert len(cached) == 1, sorted((home / "dataset-cache").rglob("*"))
