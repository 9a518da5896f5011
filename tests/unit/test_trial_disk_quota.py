"""The runner's disk quota reaches each local-environment trial as a ceiling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schemas.manifest import ComputeSpec
from services.common.settings import RunnerSettings
from services.runner.trial_process import SandboxSettings, trial_config
from tests.unit.runner_support import make_request


@pytest.mark.parametrize(
    ("runner_mb", "asked", "expected"),
    [
        (10240, None, 10240),  # the runner's default
        (10240, 512, 512),  # a manifest may lower it
        (512, 10240, 512),  # ... never raise it
        (512, 0, 512),  # ... nor lift it
        (512, "huge", 512),  # a value that is not a number is ignored
        (512, True, 512),
        (0, None, 0),  # the operator lifted it
        (0, 256, 256),
    ],
)
def test_the_manifest_may_only_lower_the_runners_quota(
    tmp_path: Path, runner_mb: int, asked: Any, expected: int
) -> None:
    kwargs = {} if asked is None else {"disk_mb": asked}
    req = make_request().model_copy(
        update={"compute": ComputeSpec(environment="local", environment_kwargs=kwargs)}
    )
    config = trial_config(req, tmp_path, tmp_path, SandboxSettings(disk_mb=runner_mb))
    assert config.environment.kwargs["disk_mb"] == expected
    # Docker trials (another environment class) are not given the kwarg.
    docker = trial_config(make_request(), tmp_path, tmp_path, SandboxSettings(disk_mb=runner_mb))
    assert "disk_mb" not in docker.environment.kwargs


def test_the_setting_defaults_to_ten_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RunnerSettings().sandbox_disk_mb == 10240
    monkeypatch.setenv("TRIALBUS_SANDBOX_DISK_MB", "2048")
    assert RunnerSettings().sandbox_disk_mb == 2048
