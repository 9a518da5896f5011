"""The runner policy's rules (services.common.runner_policy), each with the allowed form
beside the refused one, and the submitter's use of the policies runners publish
(services.common.pools.policy_refusal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from schemas.manifest import AgentSpec, ComputeSpec, ExperimentManifest
from schemas.runners import RunnerInfo, RunnerPolicy
from services.common.failures import is_retryable
from services.common.pools import policy_refusal
from services.common.runner_policy import (
    POLICY_REFUSED,
    PolicyFileError,
    agent_refusals,
    compute_refusals,
    load_policy,
    secrets_set,
    task_template_refusals,
)

DEFAULT = RunnerPolicy()


def agent(**fields: Any) -> AgentSpec:
    return AgentSpec(**({"name": "terminus-2"} | fields))


def compute(**fields: Any) -> ComputeSpec:
    return ComputeSpec(**fields)


def test_the_default_allows_plain_requests() -> None:
    assert agent_refusals(DEFAULT, agent(model="openai/gpt-x")) == []
    assert agent_refusals(DEFAULT, agent(api_key_env=["ANTHROPIC_API_KEY"])) == []
    assert compute_refusals(DEFAULT, compute()) == []
    assert compute_refusals(DEFAULT, compute(environment="docker")) == []
    assert (
        compute_refusals(
            DEFAULT, compute(environment="services.localenv.environment:LocalEnvironment")
        )
        == []
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scratch_dir": "/etc/trialbus-owned"},
        {"cache_dir": "/tmp/x"},
        {"pids_limit": 10**6},
        {"seccomp": False},  # the local sandbox's filter: off only where the operator says
    ],
)
def test_environment_kwargs_are_the_operators_by_default(kwargs: dict[str, Any]) -> None:
    (key,) = kwargs
    [refusal] = compute_refusals(DEFAULT, compute(environment_kwargs=kwargs))
    assert refusal.startswith(f"compute.environment_kwargs.{key}: not a key")
    allowing = RunnerPolicy(environments={"local": {"kwargs": [key]}})
    assert compute_refusals(allowing, compute(environment_kwargs=kwargs)) == []  # control


def test_a_path_kwarg_must_lie_in_the_folders_the_policy_names(tmp_path: Path) -> None:
    policy = RunnerPolicy(environments={"local": {"path_kwargs": {"scratch_dir": [str(tmp_path)]}}})
    inside = compute(environment_kwargs={"scratch_dir": str(tmp_path / "s")})
    assert compute_refusals(policy, inside) == []
    for bad in ("/etc/trialbus-owned", f"{tmp_path}/../etc", f"{tmp_path}-x", "relative/x", 7):
        [refusal] = compute_refusals(policy, compute(environment_kwargs={"scratch_dir": bad}))
        assert "compute.environment_kwargs.scratch_dir: a path outside" in refusal, bad
    # Mappings of paths (python_interpreters): every value is checked.
    policy = RunnerPolicy(
        environments={"local": {"path_kwargs": {"python_interpreters": ["/opt/py"]}}}
    )
    good = {"python_interpreters": {"3.11": "/opt/py/3.11/bin/python"}}
    mixed = {"python_interpreters": {"3.11": "/opt/py/3.11/bin/python", "3.12": "/usr/bin/python3"}}
    assert compute_refusals(policy, compute(environment_kwargs=good)) == []
    assert len(compute_refusals(policy, compute(environment_kwargs=mixed))) == 1


def test_environments_not_listed_are_refused() -> None:
    [refusal] = compute_refusals(DEFAULT, compute(environment="evil.mod:Env"))
    assert refusal.startswith("compute.environment: 'evil.mod:Env' is not in")
    assert compute_refusals(DEFAULT, compute(environment="daytona"))
    allowing = RunnerPolicy(environments={"evil.mod:Env": {}})
    assert compute_refusals(allowing, compute(environment="evil.mod:Env")) == []


def test_import_paths_only_when_listed_and_names_per_list() -> None:
    [refusal] = agent_refusals(DEFAULT, AgentSpec(import_path="evil.mod:Agent"))
    assert refusal.startswith("agent.import_path: 'evil.mod:Agent' is not in")
    listed = RunnerPolicy(agent_import_paths=["evil.mod:Agent"])
    assert agent_refusals(listed, AgentSpec(import_path="evil.mod:Agent")) == []
    only_oracle = RunnerPolicy(agent_names=["oracle"])
    assert agent_refusals(only_oracle, agent(name="oracle")) == []
    assert agent_refusals(only_oracle, agent(name="terminus-2"))


@pytest.mark.parametrize(
    "name",
    ["NATS_PASSWORD", "TRIALBUS_LEDGER_URL", "LEDGER_URL", "AWS_SECRET_ACCESS_KEY", "HOME", "PATH"],
)
def test_runner_variables_are_never_passed(name: str) -> None:
    [refusal] = agent_refusals(DEFAULT, agent(api_key_env=[name]))
    assert refusal.startswith(f"agent.api_key_env[0]: {name} is one of the runner's own")
    # No policy file may allow them either.
    with pytest.raises(ValidationError, match="no policy may pass it"):
        RunnerPolicy(extra_secret_names=[name])


def test_other_secret_names_need_the_operator() -> None:
    [refusal] = agent_refusals(DEFAULT, agent(api_key_env=["MYLLM_API_KEY"]))
    assert "MYLLM_API_KEY is not in the runner policy's secret_names" in refusal
    allowing = RunnerPolicy(extra_secret_names=["MYLLM_API_KEY"])
    assert agent_refusals(allowing, agent(api_key_env=["MYLLM_API_KEY", "OPENAI_API_KEY"])) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"api_base": "http://evil.example/v1"},
        {"base_url": "https://user:pw@evil.example:8443"},
        {"endpoint": "evil.example"},
        {"extra_env": {"OPENAI_BASE_URL": "http://evil.example"}},
        {"servers": [{"url": "http://evil.example"}]},
    ],
)
def test_endpoints_in_agent_kwargs_need_an_allowed_host(kwargs: dict[str, Any]) -> None:
    [refusal] = agent_refusals(DEFAULT, agent(kwargs=kwargs))
    assert "evil.example" in refusal and "endpoint_hosts" in refusal
    assert "pw" not in refusal.split("endpoint_hosts")[0].split("host")[-1]  # no userinfo
    assert agent_refusals(RunnerPolicy(endpoint_hosts=["evil.example"]), agent(kwargs=kwargs)) == []


def test_an_allowed_host_with_a_port_allows_only_that_port() -> None:
    policy = RunnerPolicy(endpoint_hosts=["127.0.0.1:8000"])
    assert agent_refusals(policy, agent(kwargs={"api_base": "http://127.0.0.1:8000/v1"})) == []
    assert agent_refusals(policy, agent(kwargs={"api_base": "http://127.0.0.1:9000/v1"}))
    assert agent_refusals(DEFAULT, agent(kwargs={"temperature": 0.2, "note": "hi"})) == []


def test_task_templates_may_name_allowed_secrets_only(tmp_path: Path) -> None:
    (tmp_path / "environment").mkdir()
    (tmp_path / "task.toml").write_text(
        '[environment.env]\nA = "${ANTHROPIC_API_KEY}"\nB = "${NATS_PASSWORD:-x}"\n'
        '[verifier.env]\nC = "prefix-${LEDGER_URL}"\n'
    )
    refusals = task_template_refusals(DEFAULT, tmp_path, "t")
    assert len(refusals) == 2
    assert "task t: task.toml environment.env.B: ${NATS_PASSWORD}" in refusals[0]
    assert "task.toml verifier.env.C: ${LEDGER_URL}" in refusals[1]
    (tmp_path / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    environment:\n      - X=$AWS_SECRET_ACCESS_KEY\n      - Y=$$HOME\n"
    )
    refusals = task_template_refusals(DEFAULT, tmp_path, "t")
    assert any("environment/docker-compose.yaml: ${AWS_SECRET_ACCESS_KEY}" in r for r in refusals)
    assert not any("HOME" in r for r in refusals)  # $$ is compose's escape
    # Control: only allowed names.
    (tmp_path / "environment" / "docker-compose.yaml").unlink()
    (tmp_path / "task.toml").write_text('[environment.env]\nA = "${ANTHROPIC_API_KEY}"\n')
    assert task_template_refusals(DEFAULT, tmp_path, "t") == []


def test_policy_files_are_validated_naming_the_field(tmp_path: Path) -> None:
    assert load_policy(None) == DEFAULT
    good = tmp_path / "p.yaml"
    good.write_text("extra_secret_names: [MYLLM_API_KEY]\nendpoint_hosts: [llm.internal]\n")
    assert load_policy(good).allowed_secrets >= {"MYLLM_API_KEY", "OPENAI_API_KEY"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("extra_secret_names: [NATS_PASSWORD]\n")
    with pytest.raises(PolicyFileError, match=r"bad.yaml: extra_secret_names: .*NATS_PASSWORD"):
        load_policy(bad)
    bad.write_text("agent_imports: []\n")  # a typo is refused, not ignored
    with pytest.raises(PolicyFileError, match="agent_imports"):
        load_policy(bad)
    with pytest.raises(PolicyFileError, match="cannot be read"):
        load_policy(tmp_path / "missing.yaml")


def test_a_refusal_is_final() -> None:
    assert not is_retryable(POLICY_REFUSED)


def runner(
    policy: RunnerPolicy | None, runner_id: str = "r-1", pool: str = "default"
) -> RunnerInfo:
    return RunnerInfo(
        runner_id=runner_id,
        host="h",
        pool=pool,
        capabilities=["local"],
        concurrency=1,
        policy=policy,
    )


def manifest(**agent_fields: Any) -> ExperimentManifest:
    return ExperimentManifest.model_validate(
        {
            "name": "m",
            "tasks": ["t"],
            "agents": [{"name": "oracle"}, {"name": "nop", **agent_fields}],
        }
    )


def test_the_submitter_refuses_what_every_capable_runner_refuses(tmp_path: Path) -> None:
    evil = manifest(kwargs={"api_base": "http://evil.example"})
    refusal = policy_refusal(evil, [runner(DEFAULT)])
    assert refusal is not None
    assert refusal.startswith("agents[1].kwargs.api_base: host 'evil.example'")
    assert "policy of runner 'r-1' in pool 'default'" in refusal
    # Controls: one runner allowing it is enough; a runner without a published policy
    # is not second-guessed; runners of another pool do not count.
    allowing = RunnerPolicy(endpoint_hosts=["evil.example"])
    assert policy_refusal(evil, [runner(DEFAULT), runner(allowing, "r-2")]) is None
    assert policy_refusal(evil, [runner(None)]) is None
    assert policy_refusal(evil, [runner(allowing, pool="other"), runner(DEFAULT)]) is not None
    assert policy_refusal(manifest(), [runner(DEFAULT)]) is None
    # The tasks' templates are checked too.
    (tmp_path / "task.toml").write_text('[environment.env]\nA = "${NATS_TOKEN}"\n')
    refusal = policy_refusal(manifest(), [runner(DEFAULT)], [("t", tmp_path)])
    assert refusal is not None and "task t: task.toml environment.env.A: ${NATS_TOKEN}" in refusal


def test_a_runner_announces_the_secret_names_it_has_set_and_nothing_else() -> None:
    policy = RunnerPolicy(extra_secret_names=["MY_KEY"])
    environ = {
        "ANTHROPIC_API_KEY": "sk-value",
        "OPENAI_API_KEY": "",  # set but empty: no key
        "MY_KEY": "x",
        "NATS_URL": "nats://h",  # the runner's own: not a secret name of the policy
        "SOMETHING_ELSE": "y",
    }
    assert secrets_set(policy, environ) == ["ANTHROPIC_API_KEY", "MY_KEY"]
    assert secrets_set(DEFAULT, environ) == ["ANTHROPIC_API_KEY"]
