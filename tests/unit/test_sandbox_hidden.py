"""Which host paths the local sandbox covers, and which the runner asks it to.

The sandboxes themselves are exercised in tests/security/test_sandbox_runner_files.py
and test_runner_files_in_trials.py; these are the pure rules around them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.embedded_stack import EmbeddedStack
from schemas.manifest import ComputeSpec
from services.common.settings import RunnerSettings
from services.localenv.spec import Bind, Overlay, SandboxSpec, hidden_targets
from services.runner.trial_process import SandboxSettings, trial_config
from tests.unit.runner_support import make_request


def _spec(tmp_path: Path, hidden: list[Path], binds: list[Bind] | None = None) -> SandboxSpec:
    layer = tmp_path / "layer"
    overlays = [Overlay("/", (layer / "root",), tmp_path / "u0", tmp_path / "w0")]
    overlays += [
        Overlay(f"/{top}", (layer / top, Path(f"/{top}")), tmp_path / "u", tmp_path / "w")
        for top in ("usr", "etc", "var")
    ]
    return SandboxSpec(tmp_path / "state", overlays, binds=binds or [], hidden=tuple(hidden))


def test_a_path_shows_through_host_lowers_and_bind_sources(tmp_path: Path) -> None:
    source = tmp_path / "bound"
    (source / "data").mkdir(parents=True)
    (source / "creds").write_text("x")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "alias").symlink_to(source / "data")
    spec = _spec(
        tmp_path,
        [
            Path("/var/tmp"),  # under the /var lower: shows at the same path
            Path("/etc/hostname"),
            source / "data",
            source / "creds",
            tmp_path / "alias",  # a link: judged by where it leads
            tmp_path / "elsewhere",  # shows nowhere: nothing to cover
            tmp_path / "missing",
        ],
        binds=[Bind(source, "/opt/bound", read_only=True)],
    )
    assert dict(hidden_targets(spec)) == {
        "/var/tmp": True,
        "/etc/hostname": False,
        "/opt/bound/creds": False,
        "/opt/bound/data": True,
    }
    # Control: hiding nothing covers nothing.
    assert hidden_targets(_spec(tmp_path, [])) == []


def test_the_runner_hides_its_own_paths_and_the_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIALBUS_SANDBOX_HIDE", f'["{tmp_path / "data"}"]')
    settings = RunnerSettings(
        work_dir=tmp_path / "work",
        jobs_dir=tmp_path / "jobs",
        sandbox_dir=tmp_path / "sandboxes",
        nats_credentials=tmp_path / "runner.creds",
        policy_file=tmp_path / "policy.yaml",
    )
    assert set(settings.hidden_from_trials()) == {
        tmp_path / n for n in ("work", "jobs", "sandboxes", "runner.creds", "policy.yaml", "data")
    }


HIDING = SandboxSettings(hidden_paths=(Path("/var/lib/trialbus"),))
"""A runner whose data folder is /var/lib/trialbus."""


@pytest.mark.parametrize("asked", [None, ["/srv/extra"]])
def test_local_trials_get_the_runners_hidden_paths_and_a_manifest_only_adds(
    tmp_path: Path, asked: list[str] | None
) -> None:
    kwargs = {} if asked is None else {"hidden_paths": asked}
    req = make_request().model_copy(
        update={"compute": ComputeSpec(environment="local", environment_kwargs=kwargs)}
    )
    config = trial_config(req, tmp_path, tmp_path, HIDING)
    assert config.environment.kwargs["hidden_paths"] == ["/var/lib/trialbus", *(asked or [])]
    # Docker trials (another environment class) are not given the kwarg.
    docker = trial_config(make_request(), tmp_path, tmp_path, HIDING)
    assert "hidden_paths" not in docker.environment.kwargs


def test_trialbus_up_hides_its_whole_data_folder_from_its_runners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = EmbeddedStack(tmp_path / "data", nats_url="nats://x:4222", ledger_url="mongodb://y")
    for name, value in stack._env().items():
        monkeypatch.setenv(name, value)
    # The data folder holds every role's credentials and the API token.
    assert (tmp_path / "data").resolve() in RunnerSettings().hidden_from_trials()
