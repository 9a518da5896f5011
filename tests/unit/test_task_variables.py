"""Which runner variables a task folder names, and which its trials cannot start without
(services.common.task_variables)."""

from __future__ import annotations

from pathlib import Path

from services.common.task_variables import required_task_secrets, task_templates

TOML = """\
[environment.env]
A = "${ENV_KEY}"
B = "${WITH_DEFAULT:-x}"
[verifier.env]
C = "${VERIFIER_KEY}"
D = "prefix ${EMBEDDED}"
[solution.env]
E = "${SOLUTION_KEY}"
[[steps]]
name = "one"
[steps.verifier.env]
F = "${STEP_KEY}"
[metadata]
note = "${NOT_AN_ENV}"
"""


def test_only_whole_templates_without_a_default_in_env_tables_are_required(
    tmp_path: Path,
) -> None:
    (tmp_path / "task.toml").write_text(TOML)
    assert required_task_secrets(tmp_path) == [
        ("task.toml [environment.env] A", "ENV_KEY"),
        ("task.toml [verifier.env] C", "VERIFIER_KEY"),
        ("task.toml [solution.env] E", "SOLUTION_KEY"),
        ("task.toml [steps[0].verifier.env] F", "STEP_KEY"),
    ]
    # Every template is still named for the policy's allow list, defaults included.
    named = {name for _, name in task_templates(tmp_path)}
    assert {"WITH_DEFAULT", "EMBEDDED", "NOT_AN_ENV"} <= named


def test_a_missing_or_malformed_task_toml_requires_nothing(tmp_path: Path) -> None:
    assert required_task_secrets(tmp_path) == []
    (tmp_path / "task.toml").write_text("not = [valid")
    assert required_task_secrets(tmp_path) == []
    (tmp_path / "task.toml").write_text('verifier = "a string"\nsteps = [1, "x"]\n')
    assert required_task_secrets(tmp_path) == []
