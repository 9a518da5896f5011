"""How a CLI command finds the embedded stack (services.common.stackfile): the stack
file fills in what the environment left unset, the environment always wins, and a
file left by a stack that is gone is ignored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.settings import CommonSettings, SubmitterSettings
from services.common.stackfile import settings_for, stack_file, write_stack_file

ENV = ("NATS_URL", "TRIALBUS_NATS_URL", "LEDGER_URL", "TRIALBUS_LEDGER_URL", "TRIALBUS_JOBS_DIR")


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "stack.json"
    monkeypatch.setenv("TRIALBUS_STACK_FILE", str(path))
    return path


def _write(path: Path, pid: int) -> None:
    write_stack_file(
        path,
        nats_url="nats://127.0.0.1:14222",
        ledger_url="mongodb://127.0.0.1:17017",
        jobs_dir=path.parent / "jobs",
        pid=pid,
    )


def test_the_file_fills_in_what_the_environment_left_unset(stack: Path) -> None:
    assert stack_file() == stack
    _write(stack, os.getpid())
    settings = settings_for(SubmitterSettings)
    assert isinstance(settings, SubmitterSettings)
    assert (settings.nats_url, settings.ledger_url, settings.jobs_dir) == (
        "nats://127.0.0.1:14222",
        "mongodb://127.0.0.1:17017",
        (stack.parent / "jobs").resolve(),
    )


def test_the_environment_wins_over_the_file(stack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(stack, os.getpid())
    monkeypatch.setenv("NATS_URL", "nats://elsewhere:4222")
    monkeypatch.setenv("TRIALBUS_JOBS_DIR", "/srv/jobs")
    settings = settings_for(CommonSettings)
    assert settings.nats_url == "nats://elsewhere:4222"
    assert settings.jobs_dir == Path("/srv/jobs")
    assert settings.ledger_url == "mongodb://127.0.0.1:17017"  # unset: from the file


def test_a_file_left_by_a_stack_that_is_gone_is_ignored(stack: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _write(stack, gone.pid)
    assert settings_for(CommonSettings) == CommonSettings()  # the defaults, not the file
