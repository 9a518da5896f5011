"""``trialbus submit --dry-run``: a manifest checked and its plan said with no stack.

The command runs with NATS and the ledger pointed at a closed port: a dry run that
connected would end with exit 3, as the plain submit of the same manifest does (the
control)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.embedded import free_port
from services.cli import app

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "examples" / "tasks" / "hello-file"


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No stack: every server address is a closed port, no stack file."""
    port = free_port()
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{port}")
    monkeypatch.setenv("LEDGER_URL", f"mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=500")
    monkeypatch.setenv("TRIALBUS_STACK_FILE", str(tmp_path / "no-stack.json"))


def _manifest(folder: Path) -> Path:
    """Two tasks, one of which needs JUDGE_KEY in the runner's environment; an agent
    with a key variable."""
    shutil.copytree(HELLO, folder / "tasks" / "hello-file")
    judged = folder / "tasks" / "judged"
    shutil.copytree(HELLO, judged)
    toml = judged / "task.toml"
    toml.write_text(toml.read_text() + '\n[verifier.env]\nJUDGE = "${JUDGE_KEY}"\n')
    path = folder / "manifest.yaml"
    path.write_text(
        "name: planned\n"
        "tasks: [tasks/hello-file, tasks/judged]\n"
        "agents:\n"
        "  - {name: oracle}\n"
        "  - {name: claude-code, model: anthropic/claude-x, api_key_env: [ANTHROPIC_API_KEY]}\n"
        "repetitions: 3\n"
    )
    return path


@pytest.mark.usefixtures("nowhere")
def test_a_dry_run_says_what_would_run_without_the_stack(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    result = CliRunner().invoke(app, ["submit", str(manifest), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["dry_run"] is True and plan["name"] == "planned"
    assert plan["stack"] is False  # nothing answered: checked without it
    assert plan["n_trials"] == 2 * 2 * 3
    assert plan["tasks"] == ["hello-file", "judged"]
    assert plan["agents"] == ["oracle", "claude-code@anthropic/claude-x"]
    assert plan["runner_variables"] == ["ANTHROPIC_API_KEY", "JUDGE_KEY"]
    assert plan["experiment_id"].startswith("planned-")

    text = CliRunner().invoke(app, ["submit", str(manifest), "--dry-run"])
    assert text.exit_code == 0, text.output
    assert "manifest ok (no stack answered)" in text.stderr
    assert "would run 12 trials: 2 tasks x 2 agents" in text.stderr
    assert "ANTHROPIC_API_KEY, JUDGE_KEY" in text.stderr

    # The control: the same manifest submitted for real needs the stack.
    real = CliRunner().invoke(app, ["submit", str(manifest)])
    assert real.exit_code == 3, real.output


@pytest.mark.usefixtures("nowhere")
def test_a_dry_run_refuses_what_submit_refuses(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    shutil.rmtree(tmp_path / "tasks" / "judged")
    result = CliRunner().invoke(app, ["submit", str(manifest), "--dry-run"])
    assert result.exit_code == 2
    assert "tasks[1]" in result.stderr and "does not exist" in result.stderr
    both = CliRunner().invoke(app, ["submit", str(manifest), "--dry-run", "--wait"])
    assert both.exit_code == 2 and "nothing to wait for" in both.stderr
