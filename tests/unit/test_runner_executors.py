"""TRIALBUS_EXECUTOR is checked when the runner starts (services/runner/executors.py):
a setting that names no usable executor stops the runner with exit code 2, naming the
setting and the fault, before it connects or takes a trial."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks.instant_executor import InstantExecutor
from services.common.settings import RunnerSettings
from services.runner.executors import ExecutorSettingError, custom_executor, executor_problems
from tests.security.http_api_support import run_to_exit

HERE = "tests.unit.test_runner_executors"


class SyncRun:
    name = "sync"
    version = "1"

    def run(self, request: Any, attempt: int, on_log: Any) -> None:
        return None


class TwoArgRun:
    name = "two"
    version = "1"

    async def run(self, request: Any) -> None:
        return None


def sync_run(_settings: RunnerSettings) -> SyncRun:
    return SyncRun()


def two_arg_run(_settings: RunnerSettings) -> TwoArgRun:
    return TwoArgRun()


def raises(_settings: RunnerSettings) -> None:
    raise RuntimeError("no licence server")


def _settings(spec: str, tmp_path: Path) -> RunnerSettings:
    return RunnerSettings(executor=spec, work_dir=tmp_path)


@pytest.mark.parametrize(
    ("spec", "fault"),
    [
        ("nope", "expected 'harbor' or 'module:factory'"),
        ("no_such_module:f", "cannot import 'no_such_module': No module named 'no_such_module'"),
        (f"{HERE}:absent", f"module '{HERE}' has no 'absent'"),
        (f"{HERE}:raises", "raises(settings) raised RuntimeError: no licence server"),
        (f"{HERE}:sync_run", "returned a SyncRun object, not an executor: no async run("),
        (f"{HERE}:two_arg_run", "run(request) is not run(request, attempt, on_log)"),
        (f"{HERE}:SyncRun", "SyncRun(settings) raised TypeError"),
    ],
)
def test_a_setting_that_names_no_executor_is_refused_naming_the_fault(
    spec: str, fault: str, tmp_path: Path
) -> None:
    with pytest.raises(ExecutorSettingError) as refused:
        custom_executor(_settings(spec, tmp_path))
    assert str(refused.value).startswith(f"TRIALBUS_EXECUTOR={spec!r}: ")
    assert fault in str(refused.value)


def test_a_real_executor_is_made_and_harbor_is_left_to_the_runner(tmp_path: Path) -> None:
    # The control: the benchmarks' executor passes the same checks.
    made = custom_executor(_settings("benchmarks.instant_executor:from_settings", tmp_path))
    assert isinstance(made, InstantExecutor)
    assert executor_problems(made) == []
    assert custom_executor(_settings("harbor", tmp_path)) is None


def test_the_runner_process_exits_2_before_connecting(tmp_path: Path) -> None:
    # Port 1 answers nothing: a runner that tried to connect would retry, not exit.
    env = {
        **os.environ,
        "TRIALBUS_EXECUTOR": f"{HERE}:sync_run",
        "NATS_URL": "nats://127.0.0.1:1",
        "TRIALBUS_WORK_DIR": str(tmp_path),
    }
    proc = run_to_exit(env, "services.runner", timeout_s=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().endswith(
        f"trialbus runner: TRIALBUS_EXECUTOR='{HERE}:sync_run': sync_run(settings) returned "
        "a SyncRun object, not an executor: no async run(request, attempt, on_log) "
        "(services/common/ports.Executor)"
    )
