"""From manifest to trials: experiment ids, task resolution and trial expansion."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from schemas.events import TaskRef, encode_event
from schemas.ids import slug, trial_id_for
from schemas.manifest import ExperimentManifest
from services.common.errors import ManifestError
from services.common.task_identity import task_checksum
from services.submitter.resolve import resolve_tasks
from services.submitter.submit import expand_trials, experiment_id_of, prepare

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_TASKS = EXAMPLES / "tasks"
TRIAL_ID_RE = re.compile(r"^[a-z0-9_-]+$")


def make(**fields: Any) -> ExperimentManifest:
    data: dict[str, Any] = {
        "name": "Demo Run",
        "tasks": ["tasks/*"],
        "agents": [{"name": "oracle"}],
    }
    data.update(fields)
    return ExperimentManifest.model_validate(data)


def tasks(*names: str) -> list[TaskRef]:
    return [TaskRef(name=n, checksum="0" * 64) for n in names]


def make_task(
    folder: Path, *, toml: bool = True, instruction: bool = True, test: bool = True
) -> Path:
    """A minimal Harbor task folder, with the chosen parts left out."""
    folder.mkdir(parents=True)
    if toml:
        (folder / "task.toml").write_text('version = "1.0"\n')
    if instruction:
        (folder / "instruction.md").write_text("Do the thing.\n")
    if test:
        (folder / "tests").mkdir()
        (folder / "tests" / "test.sh").write_text("#!/bin/sh\n")
    return folder


def resolve_error(manifest: ExperimentManifest, base: Path, root: Path | None = None) -> str:
    with pytest.raises(ManifestError) as exc:
        resolve_tasks(manifest, base, root)
    return str(exc.value)


# -- expand_trials ---------------------------------------------------------------------


def test_expansion_is_tasks_x_agents_x_repetitions() -> None:
    m = make(agents=[{"name": "oracle"}, {"name": "nop"}], repetitions=3)
    trials = expand_trials(m, "exp", tasks("a", "b", "c", "d"), correlation_id="c1")
    assert len(trials) == 4 * 2 * 3
    combos = {(t.agent.agent_ref, t.task.name, t.repetition) for t in trials}
    assert len(combos) == 24
    assert {t.repetition for t in trials} == {0, 1, 2}
    assert all(t.experiment_id == "exp" and t.correlation_id == "c1" for t in trials)
    assert all(t.compute == m.compute and t.retry == m.retry for t in trials)


def test_trial_ids_are_unique_safe_and_deterministic() -> None:
    m = make(agents=[{"name": "oracle"}, {"name": "nop", "model": "m"}], repetitions=5)
    first = [t.trial_id for t in expand_trials(m, "exp", tasks("Hello-World", "b.c"))]
    again = [t.trial_id for t in expand_trials(m, "exp", tasks("Hello-World", "b.c"))]
    assert first == again
    assert len(set(first)) == len(first) == 20
    assert all(TRIAL_ID_RE.match(i) for i in first), first
    assert all(t.dedup_id() == t.trial_id for t in expand_trials(m, "exp", tasks("x")))


def test_trial_id_reads_as_the_task_name() -> None:
    [trial] = expand_trials(make(), "exp", tasks("Count_Words"))
    assert trial.trial_id.startswith("count-words__")


BASE: dict[str, Any] = {
    "experiment_id": "exp",
    "task_name": "t",
    "agent": "oracle",
    "model": None,
    "kwargs": {},
    "repetition": 0,
}


@pytest.mark.parametrize(
    "change",
    [
        {"experiment_id": "exp2"},
        {"task_name": "t2"},
        {"agent": "nop"},
        {"model": "m"},
        {"kwargs": {"temperature": 0}},
        {"repetition": 1},
    ],
    ids=lambda c: next(iter(c)),
)
def test_every_input_of_the_trial_id_changes_it(change: dict[str, Any]) -> None:
    assert trial_id_for(**{**BASE, **change}) != trial_id_for(**BASE)


def test_kwargs_order_does_not_change_the_trial_id() -> None:
    a = trial_id_for(**{**BASE, "kwargs": {"x": 1, "y": {"p": 1, "q": 2}}})
    b = trial_id_for(**{**BASE, "kwargs": {"y": {"q": 2, "p": 1}, "x": 1}})
    assert a == b


def test_label_is_not_part_of_the_trial_id() -> None:
    [a] = expand_trials(make(agents=[{"name": "oracle", "label": "x"}]), "exp", tasks("t"))
    [b] = expand_trials(make(agents=[{"name": "oracle", "label": "y"}]), "exp", tasks("t"))
    assert a.trial_id == b.trial_id


@pytest.mark.parametrize(
    ("text", "expected"),
    [("Hello World!", "hello-world"), ("--a__b--", "a-b"), ("???", "x"), ("a" * 50, "a" * 40)],
)
def test_slug(text: str, expected: str) -> None:
    assert slug(text) == expected


# -- experiment ids ------------------------------------------------------------------


def test_experiment_id_is_stable_for_the_same_content() -> None:
    a = experiment_id_of(make(repetitions=2))
    b = experiment_id_of(
        ExperimentManifest.model_validate_json(make(repetitions=2).model_dump_json())
    )
    assert a == b
    assert re.fullmatch(r"demo-run-[0-9a-f]{10}", a)


@pytest.mark.parametrize(
    "change",
    [
        {"repetitions": 2},
        {"name": "Demo Run 2"},
        {"tasks": ["tasks/hello-file"]},
        {"agents": [{"name": "nop"}]},
        {"agents": [{"name": "oracle", "kwargs": {"k": 1}}]},
        {"compute": {"environment": "docker"}},
        {"description": "now with a description"},
    ],
)
def test_experiment_id_changes_with_content(change: dict[str, Any]) -> None:
    assert experiment_id_of(make(**change)) != experiment_id_of(make())


def test_explicit_experiment_id_wins() -> None:
    assert experiment_id_of(make(experiment_id="nightly-42")) == "nightly-42"
    assert experiment_id_of(make(experiment_id="nightly-42", repetitions=9)) == "nightly-42"


# -- resolve_tasks against the real example tasks ----------------------------------------


def test_glob_resolves_every_example_task_sorted() -> None:
    refs = resolve_tasks(make(tasks=["tasks/*"]), EXAMPLES)
    assert [r.ref.name for r in refs] == [
        "broken-verifier",
        "count-words",
        "hello-file",
        "multi-metric",
    ]
    for r in refs:
        assert r.folder == (EXAMPLE_TASKS / r.ref.name).resolve()
        assert r.ref.checksum == task_checksum(EXAMPLE_TASKS / r.ref.name)
        assert re.fullmatch(r"[0-9a-f]{64}", r.ref.checksum)


@pytest.mark.parametrize("name", ["Hello World", ".hidden-task", "a:b"])
def test_a_task_folder_name_that_is_not_one_safe_token_is_refused(
    tmp_path: Path, name: str
) -> None:
    shutil.copytree(EXAMPLE_TASKS / "hello-file", tmp_path / name)
    with pytest.raises(ManifestError, match=f"task folder name '{re.escape(name)}' must match"):
        resolve_tasks(make(tasks=[name]), tmp_path)
    # Negative control: the same folder under a plain name resolves.
    shutil.copytree(EXAMPLE_TASKS / "hello-file", tmp_path / "hello_World-2.0")
    assert resolve_tasks(make(tasks=["hello_World-2.0"]), tmp_path)[0].ref.name == "hello_World-2.0"


def test_manifest_order_is_kept_and_duplicates_collapse() -> None:
    m = make(
        tasks=[
            "tasks/multi-metric",
            "tasks/hello-file",
            "tasks/hello-file/",
            "./tasks/../tasks/hello-file",
            str(EXAMPLE_TASKS / "hello-file"),
            "tasks/h*",
            "tasks/count-words",
        ]
    )
    assert [r.ref.name for r in resolve_tasks(m, EXAMPLES)] == [
        "multi-metric",
        "hello-file",
        "count-words",
    ]


def test_missing_folder_names_the_entry() -> None:
    m = make(tasks=["tasks/hello-file", "tasks/no-such-task"])
    missing = (EXAMPLE_TASKS / "no-such-task").resolve()
    assert resolve_error(m, EXAMPLES) == f"tasks[1]: task folder {missing} does not exist"


def test_a_misspelt_folder_is_named_with_the_closest_one_as_written() -> None:
    missing = (EXAMPLE_TASKS / "helo-file").resolve()
    assert resolve_error(make(tasks=["tasks/helo-file"]), EXAMPLES) == (
        f"tasks[0]: task folder {missing} does not exist; did you mean 'tasks/hello-file'?"
    )
    # Never a folder outside the tasks root: those are not the caller's to hear about
    # (here the missing folder is the root itself; its siblings lie outside).
    assert resolve_error(make(tasks=["tasks/helo-file"]), EXAMPLES, missing) == (
        f"tasks[0]: task folder {missing} does not exist"
    )


def test_a_path_written_relative_to_another_folder_is_named_as_it_should_read(
    tmp_path: Path,
) -> None:
    # examples/tasks/hello-file from the repository's folder; tasks/hello-file from the
    # manifest's (the mistake in both directions: a folder too many, or too few).
    make_task(tmp_path / "suite" / "tasks" / "hello-file")
    manifest_dir = tmp_path / "suite"
    too_many = (manifest_dir / "suite" / "tasks" / "hello-file").resolve()
    assert resolve_error(make(tasks=["suite/tasks/hello-file"]), manifest_dir) == (
        f"tasks[0]: task folder {too_many} does not exist; did you mean 'tasks/hello-file'?"
    )
    too_few = (tmp_path / "tasks" / "hello-file").resolve()
    assert resolve_error(make(tasks=["tasks/hello-file"]), tmp_path) == (
        f"tasks[0]: task folder {too_few} does not exist; did you mean 'suite/tasks/hello-file'?"
    )
    # Only a Harbor task folder is named (a folder of the same name without task.toml
    # is not), and never one outside the tasks root.
    (tmp_path / "other" / "tasks" / "count").mkdir(parents=True)
    missing = (tmp_path / "tasks" / "count").resolve()
    assert resolve_error(make(tasks=["tasks/count"]), tmp_path) == (
        f"tasks[0]: task folder {missing} does not exist"
    )
    assert resolve_error(make(tasks=["tasks/hello-file"]), tmp_path, tmp_path / "tasks") == (
        f"tasks[0]: task folder {too_few} does not exist"
    )


def test_a_folder_of_task_folders_is_named_with_the_glob_that_runs_them(
    tmp_path: Path,
) -> None:
    for name in ("a-task", "b-task", "c-task", "d-task"):
        make_task(tmp_path / "dataset" / name)
    (tmp_path / "dataset" / "notes").mkdir()  # not a task folder: not counted
    (tmp_path / "dataset" / "linked").symlink_to(tmp_path / "dataset" / "a-task")
    folder = (tmp_path / "dataset").resolve()
    assert resolve_error(make(tasks=["dataset"]), tmp_path) == (
        f"tasks[0]: {folder} is not a Harbor task folder: missing task.toml, "
        "instruction.md, tests/test.sh; it holds 4 task folders (a-task, b-task, "
        "c-task, ...): write 'dataset/*' to run them all"
    )
    # The control: a folder holding none is said as before.
    assert resolve_error(make(tasks=["dataset/notes"]), tmp_path) == (
        f"tasks[0]: {folder / 'notes'} is not a Harbor task folder: missing task.toml, "
        "instruction.md, tests/test.sh"
    )


def test_glob_matching_nothing_names_the_entry() -> None:
    assert resolve_error(make(tasks=["tasks/zz-*"]), EXAMPLES) == (
        f"tasks[0]: glob 'tasks/zz-*' matches no task folder under {EXAMPLES.resolve()}"
    )


@pytest.mark.parametrize(
    ("parts", "missing"),
    [
        ({"toml": False}, "task.toml"),
        ({"instruction": False}, "instruction.md"),
        ({"test": False}, "tests/test.sh"),
        (
            {"toml": False, "instruction": False, "test": False},
            "task.toml, instruction.md, tests/test.sh",
        ),
    ],
)
def test_incomplete_task_folder_names_what_is_missing(
    tmp_path: Path, parts: dict[str, bool], missing: str
) -> None:
    make_task(tmp_path / "good")
    bad = make_task(tmp_path / "bad", **parts).resolve()
    assert resolve_error(make(tasks=["good", "bad"]), tmp_path) == (
        f"tasks[1]: {bad} is not a Harbor task folder: missing {missing}"
    )


def test_tests_folder_with_another_test_script_is_enough(tmp_path: Path) -> None:
    task = make_task(tmp_path / "py-task", test=False)
    (task / "tests").mkdir()
    (task / "tests" / "test.py").write_text("")
    assert [r.ref.name for r in resolve_tasks(make(tasks=["py-task"]), tmp_path)] == ["py-task"]


@pytest.mark.parametrize("path", ["../outside", "tasks/../../outside", "/ABS/outside"])
def test_path_escaping_the_tasks_root_is_refused(tmp_path: Path, path: str) -> None:
    root = tmp_path / "root"
    make_task(root / "tasks" / "inside")
    outside = make_task(tmp_path / "outside").resolve()
    path = path.replace("/ABS", str(tmp_path))
    m = make(tasks=["tasks/inside", path])
    assert resolve_tasks(make(tasks=["tasks/inside"]), root, root)[0].ref.name == "inside"
    assert resolve_error(m, root, root) == (
        f"tasks[1]: {path!r} resolves to {outside}, outside the tasks root {root.resolve()}"
    )


def test_symlink_out_of_the_tasks_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = make_task(tmp_path / "outside").resolve()
    (root / "sneaky").symlink_to(outside)
    assert "outside the tasks root" in resolve_error(make(tasks=["sneaky"]), root, root)
    # Without a tasks root the same link is an ordinary task.
    assert resolve_tasks(make(tasks=["sneaky"]), root)[0].folder == outside


def test_two_folders_with_the_same_name_are_refused(tmp_path: Path) -> None:
    a = make_task(tmp_path / "a" / "hello").resolve()
    b = make_task(tmp_path / "b" / "hello").resolve()
    assert resolve_error(make(tasks=["a/hello", "b/*"]), tmp_path) == (
        f"tasks[1]: two task folders are named 'hello' ({a} and {b}); task names must be "
        "unique within an experiment"
    )


def test_dataset_refs_not_fetched_are_refused_naming_the_cli() -> None:
    # What the HTTP API resolves: it fetches no dataset (services/submitter/datasets.py).
    message = resolve_error(make(tasks=[{"dataset": "terminal-bench@2.0"}]), EXAMPLES)
    assert message.startswith("tasks[0]: dataset 'terminal-bench@2.0': not fetched here: ")
    assert "TRIALBUS_API_DATASET_REGISTRIES" in message and "POST /tasks" in message


def test_a_dataset_s_folders_are_task_folders_like_any_other(tmp_path: Path) -> None:
    fetched = [make_task(tmp_path / "cache" / n).resolve() for n in ("hello", "words")]
    manifest = make(tasks=[{"dataset": "mini@1.0"}, "local/*"])
    make_task(tmp_path / "local" / "other")
    resolved = resolve_tasks(manifest, tmp_path, datasets={0: fetched})
    assert [(t.ref.name, t.folder) for t in resolved] == [
        ("hello", fetched[0]),
        ("words", fetched[1]),
        ("other", (tmp_path / "local" / "other").resolve()),
    ]
    assert resolved[0].ref.checksum == task_checksum(fetched[0])
    # The same name from a folder and from the dataset is refused, as two folders are.
    make_task(tmp_path / "local" / "hello")
    clash = (tmp_path / "local" / "hello").resolve()
    with pytest.raises(ManifestError) as exc:
        resolve_tasks(manifest, tmp_path, datasets={0: fetched})
    assert str(exc.value) == (
        f"tasks[1]: two task folders are named 'hello' ({fetched[0]} and {clash}); task "
        "names must be unique within an experiment"
    )
    # A fetched folder that is no task folder is named with its dataset.
    (fetched[1] / "instruction.md").unlink()
    with pytest.raises(ManifestError) as exc:
        resolve_tasks(make(tasks=[{"dataset": "mini@1.0"}]), tmp_path, datasets={0: fetched})
    assert str(exc.value) == (
        f"tasks[0] (dataset 'mini@1.0'): {fetched[1]} is not a Harbor task folder: missing "
        "instruction.md"
    )


# -- task_checksum -----------------------------------------------------------------------


def test_checksum_follows_content_and_layout(tmp_path: Path) -> None:
    task = tmp_path / "hello-file"
    shutil.copytree(EXAMPLE_TASKS / "hello-file", task)
    original = task_checksum(task)
    assert original == task_checksum(EXAMPLE_TASKS / "hello-file")  # location-independent

    instruction = task / "instruction.md"
    text = instruction.read_text()
    instruction.write_text(text + " ")
    edited = task_checksum(task)
    assert edited != original
    instruction.write_text(text)
    assert task_checksum(task) == original

    (task / "tests" / "test.sh").rename(task / "tests" / "test2.sh")
    assert task_checksum(task) not in (original, edited)


def test_checksum_sees_new_files(tmp_path: Path) -> None:
    task = make_task(tmp_path / "t")
    before = task_checksum(task)
    (task / "tests" / "data.txt").write_text("")
    assert task_checksum(task) != before


def test_each_trial_names_the_variables_its_task_asks_the_runner_for(tmp_path: Path) -> None:
    judged = make_task(tmp_path / "judged")
    with (judged / "task.toml").open("a") as toml:
        toml.write('[verifier.env]\nJUDGE = "${OPENAI_API_KEY}"\nMODE = "${MODE:-fast}"\n')
    make_task(tmp_path / "plain")
    agents = [{"name": "oracle", "api_key_env": ["ANTHROPIC_API_KEY"]}]
    prepared = prepare(make(tasks=["judged", "plain"], agents=agents), tmp_path)
    by_task = {t.task.name: t for t in prepared.trials}
    # A default (MODE) needs nothing of the runner; the agent's key is the agent's field.
    assert by_task["judged"].task_variables == ["OPENAI_API_KEY"]
    assert by_task["judged"].needed_variables() == ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"]
    assert by_task["plain"].task_variables is None
    assert b"task_variables" not in encode_event(by_task["plain"])  # the wire as before
    assert prepared.plan()["runner_variables"] == ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"]
