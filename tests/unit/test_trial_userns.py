"""The runner's shifted root (TRIALBUS_SANDBOX_USERNS) reaches each local trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.events import TrialRequested
from schemas.manifest import ComputeSpec
from services.common.settings import RunnerSettings
from services.runner.trial_process import BARE_SANDBOX, SandboxSettings, trial_config
from tests.unit.runner_support import make_request

SHIFTED = SandboxSettings(userns_base=100000)
"""A runner with TRIALBUS_SANDBOX_USERNS=shifted: root inside is host uid 100000."""


def _local(kwargs: dict[str, object]) -> TrialRequested:
    return make_request().model_copy(
        update={"compute": ComputeSpec(environment="local", environment_kwargs=kwargs)}
    )


def test_a_shifted_runner_shifts_every_local_trial_whatever_the_manifest_says(
    tmp_path: Path,
) -> None:
    for asked in ({}, {"userns": "identity", "userns_base": 70000}):
        req = _local(asked)
        config = trial_config(req, tmp_path, tmp_path, SHIFTED)
        kwargs = config.environment.kwargs
        assert (kwargs["userns"], kwargs["userns_base"]) == ("shifted", 100000)
    # Control: a runner left at the default adds nothing (the identity map).
    config = trial_config(_local({}), tmp_path, tmp_path, BARE_SANDBOX)
    assert "userns" not in config.environment.kwargs
    # Docker trials (another environment class) are not given the kwarg.
    docker = trial_config(make_request(), tmp_path, tmp_path, SHIFTED)
    assert "userns" not in docker.environment.kwargs


def test_the_setting_is_off_by_default_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RunnerSettings().sandbox_userns == "identity"
    monkeypatch.setenv("TRIALBUS_SANDBOX_USERNS", "shifted")
    monkeypatch.setenv("TRIALBUS_SANDBOX_USERNS_BASE", "200000")
    settings = RunnerSettings()
    assert (settings.sandbox_userns, settings.sandbox_userns_base) == ("shifted", 200000)
    monkeypatch.setenv("TRIALBUS_SANDBOX_USERNS", "root")
    with pytest.raises(ValueError, match="sandbox_userns"):
        RunnerSettings()
    monkeypatch.setenv("TRIALBUS_SANDBOX_USERNS", "shifted")
    monkeypatch.setenv("TRIALBUS_SANDBOX_USERNS_BASE", "1000")  # host users' ids
    with pytest.raises(ValueError, match="sandbox_userns_base"):
        RunnerSettings()
