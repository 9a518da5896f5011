"""Registry datasets in a manifest (``{dataset: name@version}``), fetched by the
submitter with Harbor's own registry and task clients (services/submitter/datasets.py).

The registry is the test's own (tests/support/task_registry.py): a git repository of
the example tasks behind ``file://`` URLs, so Harbor's real clients, and real git,
fetch with no network. The whole run through a stack is tests/e2e/test_datasets.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from infra.embedded import free_port
from schemas.manifest import ExperimentManifest
from services.cli import app
from services.common.errors import ManifestError
from services.common.task_identity import task_checksum
from services.submitter.datasets import fetch_datasets
from tests.support.task_registry import TaskRegistry, task_registry

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "tasks"
TASKS = {"hello-file": EXAMPLES / "hello-file", "count-words": EXAMPLES / "count-words"}


@pytest.fixture
def registry(tmp_path: Path) -> TaskRegistry:
    return task_registry(tmp_path / "registry", TASKS)


def manifest(**entry: Any) -> ExperimentManifest:
    """One agent on the dataset entry ``entry`` (its registry file relative to the
    manifest's folder, the test's tmp_path)."""
    task = {"dataset": "mini@1.0", "registry_path": "registry/registry.json", **entry}
    return ExperimentManifest.model_validate(
        {"name": "datasets", "tasks": [task], "agents": [{"name": "oracle"}]}
    )


async def fetched(tmp_path: Path, **entry: Any) -> list[Path]:
    folders = await fetch_datasets(manifest(**entry), tmp_path, tmp_path / "cache")
    return folders[0]


async def test_a_dataset_is_fetched_at_the_commit_its_registry_pins(
    registry: TaskRegistry, tmp_path: Path
) -> None:
    # The repository moves on after the registry pinned it: the pin is what runs.
    head = registry.commit_change("tasks/hello-file/instruction.md", "Another task.\n")
    folders = await fetched(tmp_path)
    assert [f.name for f in folders] == ["hello-file", "count-words"]  # the registry's order
    assert all(f.is_relative_to(tmp_path / "cache") for f in folders)
    for folder in folders:
        assert task_checksum(folder) == task_checksum(TASKS[folder.name])

    # Control: pinned at the later commit, the same entry gives the changed task.
    spec = json.loads(registry.file.read_text())
    for task in spec[0]["tasks"]:
        task["git_commit_id"] = head
    registry.file.write_text(json.dumps(spec))
    moved = await fetched(tmp_path)
    assert task_checksum(moved[0]) != task_checksum(TASKS["hello-file"])
    assert (moved[0] / "instruction.md").read_text() == "Another task.\n"
    assert task_checksum(moved[1]) == task_checksum(TASKS["count-words"])


@pytest.mark.usefixtures("registry")
@pytest.mark.parametrize(
    ("entry", "names"),
    [
        pytest.param({}, ["hello-file", "count-words"], id="all"),
        pytest.param({"task_names": ["hello-*"]}, ["hello-file"], id="task-names-glob"),
        pytest.param({"exclude_task_names": ["hello-*"]}, ["count-words"], id="exclude"),
        pytest.param({"n_tasks": 1}, ["hello-file"], id="n-tasks"),
    ],
)
async def test_the_filters_choose_tasks_as_harbor_does(
    tmp_path: Path, entry: dict[str, Any], names: list[str]
) -> None:
    assert [f.name for f in await fetched(tmp_path, **entry)] == names


REFUSALS = {
    "unknown-version": (
        {"dataset": "mini@2.0"},
        "Version 2.0 of dataset mini not found; the registry has: mini@1.0",
    ),
    "unknown-dataset": ({"dataset": "maxi"}, "Dataset maxi not found; the registry has: mini@1.0"),
    "no-task-matches": (
        {"task_names": ["zzz-*"]},
        "No tasks matched the filter(s) ['zzz-*']. There are 2 tasks available in this "
        "dataset. Example task names: ['count-words', 'hello-file']",
    ),
    "registry-file-missing": ({"registry_path": "nowhere.json"}, "registry_path 'nowhere.json': "),
    "registry-file-not-json": (
        {"registry_path": "broken.json"},
        "the registry could not be read (registry_path 'broken.json'): JSONDecodeError: "
        "Expecting value: line 1 column 2 (char 1)",
    ),
    "commit-not-in-repository": (
        {"registry_path": "unpinnable.json"},
        "a task repository could not be fetched: `git fetch --depth ...` failed: ",
    ),
}
"""Dataset entries that cannot be fetched, and what the refusal says after naming the
entry (``tasks[0]: dataset '<name>': ``)."""


@pytest.mark.usefixtures("registry")
@pytest.mark.parametrize(("entry", "message"), REFUSALS.values(), ids=REFUSALS.keys())
async def test_a_dataset_that_cannot_be_fetched_is_refused_naming_why(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    (tmp_path / "broken.json").write_text("[")
    spec = json.loads((tmp_path / "registry" / "registry.json").read_text())
    spec[0]["tasks"][0]["git_commit_id"] = "0" * 40  # a commit the repository lacks
    (tmp_path / "unpinnable.json").write_text(json.dumps(spec))
    with pytest.raises(ManifestError) as exc:
        await fetched(tmp_path, **entry)
    dataset = entry.get("dataset", "mini@1.0")
    assert str(exc.value).startswith(f"tasks[0]: dataset {dataset!r}: {message}"), str(exc.value)


def test_a_dry_run_lists_a_dataset_s_tasks_with_no_stack(
    registry: TaskRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # nothing listens: the dry run is offline
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{port}")
    monkeypatch.setenv("LEDGER_URL", f"mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=500")
    monkeypatch.setenv("TRIALBUS_STACK_FILE", str(tmp_path / "no-stack.json"))
    monkeypatch.setenv("TRIALBUS_DATASET_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "manifest.yaml"
    path.write_text(
        "name: planned\n"
        "tasks:\n"
        "  - {dataset: mini@1.0, registry_path: registry/registry.json}\n"
        "agents: [{name: oracle}, {name: nop}]\n"
        "repetitions: 2\n"
    )
    result = CliRunner().invoke(app, ["submit", str(path), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert (plan["stack"], plan["tasks"], plan["n_trials"]) == (
        False,
        ["hello-file", "count-words"],
        2 * 2 * 2,
    )
    assert sorted(p.name for p in (tmp_path / "cache").glob("*/*")) == sorted(TASKS)
    # Submitted again, the tasks come from the cache, and the command says so.
    again = CliRunner().invoke(app, ["submit", str(path), "--dry-run"])
    assert again.exit_code == 0, again.output
    assert "dataset mini@1.0: 2 tasks, 0 downloaded, 2 already in the cache (" in again.stderr

    # Refused the same way when the registry lacks the version (exit 2, the file named).
    path.write_text(path.read_text().replace("mini@1.0", "mini@9"))
    refused = CliRunner().invoke(app, ["submit", str(path), "--dry-run"])
    assert refused.exit_code == 2, refused.output
    assert f"{path}: tasks[0]: dataset 'mini@9': Version 9 of dataset mini not found" in (
        refused.output
    )
