"""A task given by checksum, submitted to ``trialbus up``, whose NATS has role users.

The submitter reads the task's archive back from the tasks bucket at submit
(services/submitter/stored_tasks.py), as the retry does. The e2e stacks' NATS has no
users, so only a stack with role users shows whether the submitter's role may read
that bucket: it could not, and both failed with ObjectAccessDenied (a CLI retry too). Here the API's
dry run knows the variable the stored task's task.toml requires, read from its
archive: the stack's runner lacks it, so the manifest is refused naming it.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import tarfile
from pathlib import Path

import httpx
import pytest

from tests.e2e.cli import run_module
from tests.support.stack_console import StackConsole, watched

pytestmark = pytest.mark.integration

TRIALBUS = str(Path(sys.executable).with_name("trialbus"))
HELLO = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "hello-file"


def _archive(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buf.getvalue()


def test_a_stored_task_is_read_back_by_the_submitter_s_role(tmp_path: Path) -> None:
    judged = tmp_path / "judged"
    shutil.copytree(HELLO, judged)
    toml = judged / "task.toml"
    toml.write_text(toml.read_text() + '\n[verifier.env]\nJUDGE = "${OPENAI_API_KEY}"\n')
    home = tmp_path / "operator"
    home.mkdir()
    stack_file = tmp_path / "stack.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    env["TRIALBUS_STACK_FILE"] = str(stack_file)
    argv = [TRIALBUS, "up", "--data-dir", "stack"]
    with watched(argv, home, env, home / "stack", stack_file, StackConsole) as console:
        up = console.lines[console.wait_line("trialbus is up", timeout=180)]
        api = re.search(r"HTTP (http://127\.0\.0\.1:\d+) ", up)
        assert api, up
        token = (home / "stack" / "secrets" / "api-token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=api.group(1), headers=headers, timeout=120) as client:
            stored = client.post(
                "/tasks?name=judged",
                content=_archive(judged),
                headers={"Content-Type": "application/gzip"},
            )
            assert stored.status_code == 201, stored.text
            manifest = {"name": "stored", "tasks": [stored.json()], "agents": [{"name": "oracle"}]}
            plan = client.post("/experiments", json=manifest, params={"dry_run": "true"})
        # A retry reads the task's archive too (its variables), here from the CLI, which
        # finds the stack through its stack file and acts with the submitter's role.
        hello = home / "hello.yaml"
        hello.write_text(
            f"name: hello\ntasks: [{HELLO}]\nagents: [{{name: oracle}}]\n"
            "compute: {environment: local}\n"
        )
        done = run_module(env, "submit", str(hello), "--wait", "--json", timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        experiment = json.loads(done.stdout)["experiment_id"]
        [trial] = [p.name for p in (home / "stack" / "jobs" / experiment).glob("hello-file__*")]
        retried = run_module(env, "retry", experiment, trial, "--json")
        assert retried.returncode == 0, retried.stderr[-3000:]
        assert json.loads(retried.stdout)["run_id"].startswith(f"{trial}:retry:")
    # Read from the archive, the task's variable is judged against the live runner,
    # which lacks it. Before the submitter's role could read the bucket: a 503 naming
    # the right (ObjectAccessDenied); before the archive was read at all: 200, the
    # trials carrying no variable, each then ending on the runner.
    assert plan.status_code == 422, plan.text
    assert "runner-0 has no OPENAI_API_KEY set (task.toml of task 'judged')" in plan.text
