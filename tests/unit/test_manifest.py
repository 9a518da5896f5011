"""Manifest shape (schemas.manifest) and reading it from text/files (manifest_io).

Error assertions check the whole ``<source>: <field>: <message>`` line, so a message
that stops naming the file or the field fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.manifest import AgentSpec, DatasetRef, ExperimentManifest, TaskPath
from services.common.errors import ManifestError
from services.submitter.manifest_io import (
    MAX_MANIFEST_BYTES,
    load_manifest,
    parse_manifest,
    parse_manifest_text,
)

REPO = Path(__file__).resolve().parents[2]
SRC = "exp.yaml"
UNKNOWN = "unknown field (check the spelling; see docs/manifest.md for the fields)"
SECRET_FIX = (
    "looks like an inline secret; put the value in an environment variable on the "
    "runners and list its NAME under the agent's api_key_env instead"
)


def manifest(**fields: object) -> dict[str, object]:
    """A valid manifest mapping, with ``fields`` overriding or adding keys."""
    data: dict[str, object] = {"name": "demo", "tasks": ["tasks/a"], "agents": [{"name": "oracle"}]}
    data.update(fields)
    return data


def error_of(data: object) -> str:
    with pytest.raises(ManifestError) as exc:
        parse_manifest(data, SRC)
    return str(exc.value)


# -- valid manifests -------------------------------------------------------------------


def test_example_manifest_loads() -> None:
    m = load_manifest(REPO / "examples" / "experiment.yaml")
    assert m.name == "examples-demo"
    assert m.tasks == [
        TaskPath(path="tasks/hello-file"),
        TaskPath(path="tasks/count-words"),
        TaskPath(path="tasks/multi-metric"),
        TaskPath(path="tasks/broken-verifier"),
    ]
    assert [a.name for a in m.agents] == ["oracle", "nop"]
    assert m.repetitions == 3
    assert m.compute.environment == "local"
    assert m.retry.backoff_seconds == 1.0


def test_yaml_text_with_mixed_task_entries() -> None:
    text = """
name: mixed
experiment_id: run-2024_01
tasks:
  - tasks/*
  - path: other/task-b
  - dataset: terminal-bench@2.0
    task_names: [hello-world]
  - dataset: swebench
agents:
  - name: terminus-2
    model: anthropic/claude-sonnet-4
    api_key_env: [ANTHROPIC_API_KEY]
    kwargs: {temperature: 0.2, max_turns: 30}
  - import_path: my_agents.custom:MyAgent
    label: mine
repetitions: 100
"""
    m = parse_manifest_text(text, SRC)
    assert m.experiment_id == "run-2024_01"
    assert m.tasks == [
        TaskPath(path="tasks/*"),
        TaskPath(path="other/task-b"),
        DatasetRef(dataset="terminal-bench@2.0", task_names=["hello-world"]),
        DatasetRef(dataset="swebench"),
    ]
    first, second = m.agents
    assert first.agent_ref == "terminus-2"
    assert first.display == "terminus-2"
    assert first.kwargs == {"temperature": 0.2, "max_turns": 30}
    assert first.api_key_env == ["ANTHROPIC_API_KEY"]
    assert second.agent_ref == "my_agents.custom:MyAgent"
    assert second.display == "mine"
    assert m.repetitions == 100


def test_defaults() -> None:
    m = ExperimentManifest.model_validate(manifest())
    assert m.experiment_id is None
    assert m.repetitions == 1
    assert m.compute.environment == "local"
    assert m.compute.environment_import_path == "services.localenv.environment:LocalEnvironment"
    assert m.compute.environment_type is None


@pytest.mark.parametrize(
    ("environment", "import_path", "env_type"),
    [
        ("docker", None, "docker"),
        ("pkg.envs:Remote", "pkg.envs:Remote", None),
    ],
)
def test_compute_environment_kinds(
    environment: str, import_path: str | None, env_type: str | None
) -> None:
    m = ExperimentManifest.model_validate(manifest(compute={"environment": environment}))
    assert m.compute.environment_import_path == import_path
    assert m.compute.environment_type == env_type


def test_json_text_is_accepted() -> None:
    m = parse_manifest_text('{"name": "j", "tasks": ["t"], "agents": [{"name": "nop"}]}', SRC)
    assert m.tasks == [TaskPath(path="t")]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model_name": "claude-sonnet-4-20250514"},  # long value under an ordinary key
        {"token_budget": 1_000_000},  # secret-ish key, non-string value
        {"max_tokens": "4096"},  # secret-ish key, value shorter than 8 characters
        {"prompt": "skim the repo first"},  # value starting "sk" but not "sk-"
    ],
)
def test_harmless_kwargs_are_not_mistaken_for_secrets(kwargs: dict[str, object]) -> None:
    m = ExperimentManifest.model_validate(manifest(agents=[{"name": "x", "kwargs": kwargs}]))
    assert m.agents[0].kwargs == kwargs


def test_same_agent_with_different_models_is_not_a_duplicate() -> None:
    agents = [{"name": "terminus-2", "model": "a"}, {"name": "terminus-2", "model": "b"}]
    assert len(ExperimentManifest.model_validate(manifest(agents=agents)).agents) == 2


# -- validation errors: exact "source: field: message" lines ---------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(manifest(bogus=1), f"{SRC}: bogus: {UNKNOWN}", id="unknown-top-level"),
        pytest.param(
            manifest(agents=[{"name": "oracle", "modle": "x"}]),
            f"{SRC}: agents[0].modle: {UNKNOWN}",
            id="unknown-agent-field",
        ),
        pytest.param(
            manifest(compute={"envirnoment": "local"}),
            f"{SRC}: compute.envirnoment: {UNKNOWN}",
            id="unknown-compute-field",
        ),
        pytest.param(
            manifest(repetitions=0),
            f"{SRC}: repetitions: Input should be greater than or equal to 1",
            id="repetitions-0",
        ),
        pytest.param(
            manifest(repetitions=101),
            f"{SRC}: repetitions: Input should be less than or equal to 100",
            id="repetitions-101",
        ),
        pytest.param(
            {"tasks": ["t"], "agents": [{"name": "oracle"}]},
            f"{SRC}: name: required field is missing",
            id="missing-name",
        ),
        pytest.param(
            manifest(tasks=[]),
            f"{SRC}: tasks: List should have at least 1 item after validation, not 0",
            id="empty-tasks",
        ),
        pytest.param(
            manifest(agents=[]),
            f"{SRC}: agents: List should have at least 1 item after validation, not 0",
            id="empty-agents",
        ),
        pytest.param(
            manifest(agents=[{"name": "oracle", "import_path": "a.b:C"}]),
            f"{SRC}: agents[0]: give exactly one of 'name' or 'import_path'",
            id="agent-name-and-import-path",
        ),
        pytest.param(
            manifest(agents=[{"name": "oracle"}, {"model": "m"}]),
            f"{SRC}: agents[1]: give exactly one of 'name' or 'import_path'",
            id="agent-neither-name-nor-import-path",
        ),
        pytest.param(
            manifest(agents=[{"import_path": "a.b.C"}]),
            f"{SRC}: agents[0]: import_path 'a.b.C' must look like 'package.module:Class'",
            id="bad-import-path",
        ),
        pytest.param(
            manifest(agents=[{"name": "x", "api_key_env": ["OK_NAME", "sk-abc123def456"]}]),
            f"{SRC}: agents[0].api_key_env: api_key_env entry 1 is not an "
            "environment variable name; list the variable's NAME (e.g. ANTHROPIC_API_KEY), "
            "never its value",
            id="api-key-env-holds-a-value",
        ),
        pytest.param(
            manifest(agents=[{"name": "x", "kwargs": {"api_key": "abcdefgh12345"}}]),
            f"{SRC}: agents[0]: kwargs.api_key {SECRET_FIX}",
            id="secret-by-key-name",
        ),
        pytest.param(
            manifest(agents=[{"name": "x", "kwargs": {"extra": "sk-ant-api03-abcdefghijkl"}}]),
            f"{SRC}: agents[0]: kwargs.extra {SECRET_FIX}",
            id="secret-by-value-shape",
        ),
        pytest.param(
            manifest(agents=[{"name": "x", "kwargs": {"client": {"Auth_Token": "0123456789"}}}]),
            f"{SRC}: agents[0]: kwargs.client.Auth_Token {SECRET_FIX}",
            id="secret-nested",
        ),
        pytest.param(
            manifest(agents=[{"name": "x", "kwargs": {"keys": ["sk-abcdefghijkl"]}}]),
            f"{SRC}: agents[0]: kwargs.keys[0] {SECRET_FIX}",
            id="secret-in-list",
        ),
        pytest.param(
            manifest(compute={"environment_kwargs": {"password": "hunter2hunter2"}}),
            f"{SRC}: compute.environment_kwargs: environment_kwargs.password {SECRET_FIX}",
            id="secret-in-environment-kwargs",
        ),
        pytest.param(
            manifest(experiment_id="My-Exp"),
            f"{SRC}: experiment_id: experiment_id 'My-Exp' must match "
            "^[a-z0-9][a-z0-9_-]{0,63}$ (lowercase letters, digits, '-', '_'; it becomes a "
            "NATS subject token)",
            id="experiment-id-uppercase",
        ),
        pytest.param(
            manifest(experiment_id="my exp"),
            f"{SRC}: experiment_id: experiment_id 'my exp' must match "
            "^[a-z0-9][a-z0-9_-]{0,63}$ (lowercase letters, digits, '-', '_'; it becomes a "
            "NATS subject token)",
            id="experiment-id-space",
        ),
        pytest.param(
            manifest(agents=[{"name": "oracle", "label": "a"}, {"name": "oracle", "label": "b"}]),
            f"{SRC}: agents: agent 'oracle' with model None is listed twice with the same "
            "kwargs; raise 'repetitions' instead",
            id="duplicate-agents-despite-labels",
        ),
        pytest.param(
            manifest(
                agents=[
                    {"name": "oracle", "kwargs": {"a": 1, "b": 2}},
                    {"name": "oracle", "kwargs": {"b": 2, "a": 1}},
                ]
            ),
            f"{SRC}: agents: agent 'oracle' with model None is listed twice with the same "
            "kwargs; raise 'repetitions' instead",
            id="duplicate-agents-kwargs-reordered",
        ),
        pytest.param(
            manifest(
                agents=[
                    {"name": "oracle", "kwargs": {"cfg": {"x": 1, "y": 2}}},
                    {"name": "oracle", "kwargs": {"cfg": {"y": 2, "x": 1}}},
                ]
            ),
            f"{SRC}: agents: agent 'oracle' with model None is listed twice with the same "
            "kwargs; raise 'repetitions' instead",
            id="duplicate-agents-nested-kwargs-reordered",
        ),
    ],
)
def test_validation_error_lines(data: dict[str, object], expected: str) -> None:
    assert error_of(data) == expected


def test_every_problem_gets_its_own_line() -> None:
    message = error_of({"tasks": ["t"], "agents": [{"name": "x"}], "repetitions": 0, "x": 1})
    assert message.splitlines() == [
        f"{SRC}: name: required field is missing",
        f"{SRC}: repetitions: Input should be greater than or equal to 1",
        f"{SRC}: x: {UNKNOWN}",
    ]


# -- text and file level errors ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "name: x\ntasks: [t\nagents: 1\n",
            f"{SRC}: not valid YAML at line 3 column 7: expected ',' or ']', but got ':'",
            id="unclosed-flow-list",
        ),
        pytest.param(
            "name: x\n  foo: : bar\n",
            f"{SRC}: not valid YAML at line 2 column 6: mapping values are not allowed here",
            id="bad-indentation",
        ),
        pytest.param(
            "- tasks/a\n- tasks/b\n",
            f"{SRC}: the manifest must be a mapping of fields, got list",
            id="yaml-list",
        ),
        pytest.param(
            "just a string\n",
            f"{SRC}: the manifest must be a mapping of fields, got str",
            id="yaml-scalar",
        ),
        pytest.param(
            "", f"{SRC}: the manifest must be a mapping of fields, got NoneType", id="empty-file"
        ),
    ],
)
def test_text_errors(text: str, expected: str) -> None:
    with pytest.raises(ManifestError) as exc:
        parse_manifest_text(text, SRC)
    assert str(exc.value) == expected


def test_oversized_text_is_refused_before_parsing() -> None:
    text = "name: x\n# " + "a" * MAX_MANIFEST_BYTES
    with pytest.raises(ManifestError) as exc:
        parse_manifest_text(text, SRC)
    assert str(exc.value) == f"{SRC}: manifest larger than {MAX_MANIFEST_BYTES} bytes"


def test_load_manifest_names_the_file_path(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("name: x\ntasks: [t]\nagents: [{name: oracle}]\nrepetitions: 101\n")
    with pytest.raises(ManifestError) as exc:
        load_manifest(path)
    assert str(exc.value) == f"{path}: repetitions: Input should be less than or equal to 100"


def test_load_manifest_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ManifestError) as exc:
        load_manifest(path)
    assert str(exc.value) == f"{path}: no such manifest file"


def test_manifest_models_are_frozen() -> None:
    agent = AgentSpec(name="oracle")
    with pytest.raises(ValueError, match="frozen"):
        agent.name = "nop"  # type: ignore[misc]
