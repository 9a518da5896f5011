"""One record, whichever way the trial's files are read: from disk, or as just unpacked.

The importer builds a stored trial's record from what unpacking its archive saw
(``ArchiveFiles``: the files the record reads kept in memory) instead of reading the
unpacked folder back (``FolderFiles``, what ``trialbus import`` and the importer did
before). Here both are built for every trial the tests know, each packed as a runner
packs it and fetched through the importer's own ``record_for``: the bad-input corpus,
the session's real Harbor trials, and shapes only an archive can take (a file where a
folder is expected, a folder where a file is, files left out by the runner's cap).
The records must be equal, field for field and in their JSON (what the ledger stores
and hashes). Negative controls: one byte changed in a kept file changes the record,
and a file the record reads but unpacking did not keep is an error, never a "missing".
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from schemas.events import TaskRef, TrialCompleted
from schemas.record import TrialRecord
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.archive import pack_trial
from services.common.unpack import Unpacked, unpack_trial_files
from services.importer.event_records import _context_for_completed, record_for
from services.importer.folders import StoredTrials
from services.importer.records import build_record
from services.importer.trial_files import RECORD_FILES, ArchiveFiles, FolderFiles
from tests.bad_inputs.corpus import Case, cases, materialize_result
from tests.harbor_fixtures import HarborTrials


def _odd_shapes(root: Path) -> dict[str, Path]:
    """Trial folders whose shape only an unpacked archive could mistake."""

    def folder(name: str, files: dict[str, str]) -> Path:
        path = root / name
        path.mkdir(parents=True)
        for rel, text in files.items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_text(text)
        return path

    shapes = {
        "empty": folder("empty", {}),
        "verifier-is-a-file": folder("verifier-is-a-file", {"verifier": "not a folder"}),
        "reward-txt-only": folder("reward-txt-only", {"verifier/reward.txt": "0.5\n"}),
        "reward-json-is-a-folder": folder(
            "reward-json-is-a-folder", {"verifier/reward.json/x": "{}", "verifier/reward.txt": "1"}
        ),
        "config-only": folder("config-only", {"config.json": json.dumps({"agent": {"name": "a"}})}),
        "result-is-a-folder": folder("result-is-a-folder", {"result.json/inner": "{}"}),
    }
    (shapes["empty"] / "agent").mkdir()
    return shapes


def _record_both_ways(folder: Path, work: Path, cap: int | None = None) -> tuple[str, str]:
    """(record from the unpacked folder on disk, record through the importer's path)."""
    packed = pack_trial(folder, cap_bytes=cap) if cap else pack_trial(folder)
    trials = StoredTrials(InMemoryObjectStore("RESULTS"), work / "jobs")
    ref = asyncio.run(trials.store.put("exp/t-1/1.tar.gz", packed.data))
    event = TrialCompleted(experiment_id="exp", trial_id="t-1", trial_name="t-1", result=ref)
    through_importer = asyncio.run(record_for(event, trials))
    on_disk = build_record(
        FolderFiles(work / "jobs" / "exp" / "t-1"), _context_for_completed(event)
    )
    assert through_importer == on_disk
    return on_disk.model_dump_json(), through_importer.model_dump_json()


@pytest.mark.parametrize("case", cases("results"), ids=[c.name for c in cases("results")])
def test_the_bad_input_corpus_gives_the_same_record_both_ways(
    case: Case, harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    folder = materialize_result(case, harbor_trials["oracle"], tmp_path / "src")
    disk, memory = _record_both_ways(folder, tmp_path)
    assert disk == memory


def test_real_harbor_trials_give_the_same_record_both_ways(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    assert len(harbor_trials.trials) >= 6
    for name, folder in harbor_trials.trials.items():
        disk, memory = _record_both_ways(folder, tmp_path / name)
        assert disk == memory, name


def test_archive_only_shapes_give_the_same_record_both_ways(tmp_path: Path) -> None:
    for name, folder in _odd_shapes(tmp_path / "src").items():
        disk, memory = _record_both_ways(folder, tmp_path / name)
        assert disk == memory, name
    # Files left out by the runner's cap: the manifest's diagnostic, both ways.
    trial = tmp_path / "src" / "capped"
    shutil.copytree(tmp_path / "src" / "reward-txt-only", trial)
    (trial / "agent").mkdir()
    (trial / "agent" / "big.log").write_text("x" * 5000)
    disk, memory = _record_both_ways(trial, tmp_path / "capped", cap=1000)
    assert disk == memory and "stored in part" in memory


def _unpacked_oracle(harbor_trials: HarborTrials, dest: Path) -> Unpacked:
    data = pack_trial(harbor_trials["oracle"]).data
    return unpack_trial_files(data, dest, keep=RECORD_FILES)


def test_negative_control_a_changed_kept_byte_changes_the_record(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    unpacked = _unpacked_oracle(harbor_trials, tmp_path / "t")
    ctx = _context_for_completed(
        TrialCompleted.model_validate(
            {
                "experiment_id": "exp",
                "trial_id": "t",
                "trial_name": "t",
                "result": {"bucket": "B", "name": "n", "size": 1, "sha256": "0" * 64},
            }
        )
    )
    same = build_record(ArchiveFiles(unpacked), ctx)
    assert same == build_record(FolderFiles(unpacked.path), ctx)
    result = json.loads(unpacked.kept["result.json"])
    result["verifier_result"]["rewards"]["reward"] = 0.0
    unpacked.kept["result.json"] = json.dumps(result).encode()
    changed: TrialRecord = build_record(ArchiveFiles(unpacked), ctx)
    assert changed.evaluation.main_reward == 0.0 != same.evaluation.main_reward
    assert changed != build_record(FolderFiles(unpacked.path), ctx)


def test_negative_control_a_file_not_kept_is_an_error_not_missing(
    harbor_trials: HarborTrials, tmp_path: Path
) -> None:
    unpacked = _unpacked_oracle(harbor_trials, tmp_path / "t")
    files = ArchiveFiles(unpacked)
    assert files.read("result.json", 1 << 20) == (unpacked.path / "result.json").read_bytes()
    # trial.log is in the archive, but the record never reads it: its bytes were not kept.
    with pytest.raises(LookupError, match="RECORD_FILES"):
        files.read("trial.log", 1 << 20)
    assert (
        FolderFiles(unpacked.path).read("trial.log", 1 << 20)
        == (unpacked.path / "trial.log").read_bytes()
    )


def test_a_runner_s_record_names_the_task_archive_that_ran(tmp_path: Path) -> None:
    folder = _odd_shapes(tmp_path / "shapes")["config-only"]
    trials = StoredTrials(InMemoryObjectStore("RESULTS"), tmp_path / "jobs")
    ref = asyncio.run(trials.store.put("exp/t-1/1.tar.gz", pack_trial(folder).data))
    task = TaskRef(name="hello-file", checksum="ab" * 32)
    event = TrialCompleted(
        experiment_id="exp", trial_id="t-1", trial_name="t-1", result=ref, task=task
    )
    record = asyncio.run(record_for(event, trials))
    assert record.provenance.task_archive == task.checksum
    # Control: an external trial's (or an older runner's) event names none.
    older = event.model_copy(update={"task": None})
    assert asyncio.run(record_for(older, trials)).provenance.task_archive is None
