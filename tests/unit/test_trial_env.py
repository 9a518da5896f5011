"""What a trial's process keeps of the runner's environment (services.runner.trial_env).

Pure rules on a mapping, the policy's ``pass_env`` validation, and the wipe of the
exec-time environment block in a forked child (the real ``/proc/self/environ``).
The end-to-end proof is tests/security/test_trial_environment.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.runners import RunnerPolicy
from services.runner.trial_env import kept_names, restrict_environ

ENVIRON_BLOCK = Path("/proc/self/environ")
RUNNER = {
    "PATH": "/usr/bin",
    "HOME": "/root",
    "LC_ALL": "C.UTF-8",
    "DOCKER_HOST": "unix:///run/docker.sock",
    "TRIALBUS_LEDGER_URL": "mongodb://u:pw@h",
    "NATS_URL": "nats://h",
    "CLOUD_SECRET_TOKEN": "tok",
    "OPENAI_API_KEY": "sk-1",
    "ANTHROPIC_API_KEY": "sk-2",
    "HTTPS_PROXY": "http://proxy:3128",
}


def test_only_the_base_list_the_grant_and_pass_env_are_kept() -> None:
    env = dict(RUNNER)
    removed = restrict_environ(["OPENAI_API_KEY"], ["HTTPS_PROXY"], environ=env)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C.UTF-8",
        "DOCKER_HOST": "unix:///run/docker.sock",
        "OPENAI_API_KEY": "sk-1",
        "HTTPS_PROXY": "http://proxy:3128",
    }
    assert removed == sorted(
        ["TRIALBUS_LEDGER_URL", "NATS_URL", "CLOUD_SECRET_TOKEN", "ANTHROPIC_API_KEY"]
    )


def test_without_a_grant_no_secret_is_kept() -> None:
    # Control of the rule above: the same environment, nothing granted.
    kept = kept_names(RUNNER, [])
    assert "OPENAI_API_KEY" not in kept and "HTTPS_PROXY" not in kept
    assert "PATH" in kept


def test_a_granted_name_the_runner_lacks_stays_missing() -> None:
    # The api-key lookup then reports it missing, as before.
    assert "MYLLM_API_KEY" not in kept_names(RUNNER, ["MYLLM_API_KEY"])


@pytest.mark.parametrize("name", ["TRIALBUS_LEDGER_URL", "NATS_PASSWORD", "AWS_SECRET_ACCESS_KEY"])
def test_pass_env_refuses_the_runners_own_variables(name: str) -> None:
    with pytest.raises(ValidationError, match=f"{name} is one of the runner's own variables"):
        RunnerPolicy(pass_env=[name])
    with pytest.raises(ValidationError, match="pass_env"):
        RunnerPolicy(pass_env=["not a name"])
    assert RunnerPolicy(pass_env=["HTTPS_PROXY"]).pass_env == ["HTTPS_PROXY"]
    assert RunnerPolicy().pass_env == []


def test_the_exec_time_block_is_wiped_in_a_fork() -> None:
    """``/proc/self/environ`` of a forked child loses the removed variables; the
    parent's is untouched (the child writes its own copy of the page)."""
    marker = "TRIALBUS_TEST_WIPE"
    if marker not in ENVIRON_BLOCK.read_bytes().decode(errors="replace"):
        # The block is fixed at exec: run this check in a process started with it.
        import subprocess
        import sys

        code = (
            "import tests.unit.test_trial_env as t; t.test_the_exec_time_block_is_wiped_in_a_fork()"
        )
        env = {**os.environ, marker: "wipe-me-0123456789", "OPENAI_API_KEY": "keep-me-012345"}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert done.stdout.decode().strip() == "wiped", done.stdout
        return
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: cut, then report what /proc shows
        os.close(read)
        restrict_environ(["OPENAI_API_KEY"])
        block = ENVIRON_BLOCK.read_bytes()
        ok = b"wipe-me" not in block and b"OPENAI_API_KEY=keep-me-012345" in block
        ok = ok and marker not in os.environ and os.environ["OPENAI_API_KEY"] == "keep-me-012345"
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1", "the child still showed a removed variable"
    assert b"wipe-me" in ENVIRON_BLOCK.read_bytes()  # control: parent intact
    print("wiped")
