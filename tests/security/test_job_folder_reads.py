"""The importer's and the watcher's reads of a job folder (issue 11): the trialbus
marker, an external job's result.json, the trial results of Harbor's job summary.

Each read refuses a link, a FIFO (without blocking) and an oversized file, naming the
file and why; each has its negative control, the same content as a regular file read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from schemas.events import TrialCompleted
from services.common.adapters.memory import InMemoryLedger, RecordingBus
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.folder_reads import MAX_FILE_BYTES
from services.common.harbor_jobs import MARKER, MAX_MARKER_BYTES, read_marker, write_job_result
from services.common.trial_folders import TrialFolders
from services.importer.jobdir import JobDirError, experiment_id_for_job
from services.watcher import handlers as watcher_handlers
from services.watcher.handlers import Watcher
from services.watcher.logic import finished_external_jobs
from tests import harbor_fixtures
from tests.harbor_fixtures import HarborTrials
from tests.security import reads_support
from tests.security.reads_support import bounded
from tests.support.log_recorder import LogRecorder

harbor_trials = harbor_fixtures.harbor_trials  # the session's real Harbor trial folders
host = reads_support.host


@pytest.mark.parametrize("kind", ["link", "FIFO", "oversized"])
def test_a_marker_that_is_a_link_a_fifo_or_oversized_is_refused_naming_why(
    kind: str, tmp_path: Path
) -> None:
    job, elsewhere = tmp_path / "job", tmp_path / "elsewhere.json"
    job.mkdir()
    elsewhere.write_text(json.dumps({"experiment_id": "hijacked"}))
    marker = job / MARKER
    if kind == "link":
        marker.symlink_to(elsewhere)
    elif kind == "FIFO":
        os.mkfifo(marker)
    else:
        with marker.open("wb") as fh:
            fh.truncate(MAX_MARKER_BYTES + 1)
    why = {
        "link": "a symbolic link; not followed",
        "FIFO": "not a regular file (a FIFO); not read",
        "oversized": f"{MAX_MARKER_BYTES + 1} bytes exceeds the 1 MiB limit; not read",
    }[kind]
    with pytest.raises(JobDirError) as info:
        bounded(lambda: experiment_id_for_job(job), [marker])
    assert str(info.value).startswith(f"{marker}: {why}; ")
    assert bounded(lambda: read_marker(job), [marker]) is None
    # Negative control: the same marker as a regular file is read.
    marker.unlink()
    shutil.copyfile(elsewhere, marker)
    assert experiment_id_for_job(job) == ("hijacked", True)
    assert read_marker(job) == {"experiment_id": "hijacked"}


def test_the_watcher_reads_no_linked_fifo_or_oversized_job_result(tmp_path: Path) -> None:
    jobs, finished = tmp_path / "jobs", json.dumps({"finished_at": "2026-01-01T00:00:00Z"})
    (tmp_path / "host.json").write_text(finished)
    for name in ("a-link", "b-fifo", "c-oversized", "d-regular"):
        (jobs / name).mkdir(parents=True)
    (jobs / "a-link" / "result.json").symlink_to(tmp_path / "host.json")
    os.mkfifo(jobs / "b-fifo" / "result.json")
    with (jobs / "c-oversized" / "result.json").open("wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)
    (jobs / "d-regular" / "result.json").write_text(finished)  # negative control
    refused: list[str] = []
    found = bounded(
        lambda: finished_external_jobs(jobs, refused), [jobs / "b-fifo" / "result.json"]
    )
    assert found == [jobs / "d-regular"]
    assert refused == [
        f"{jobs / 'a-link' / 'result.json'}: a symbolic link; not followed",
        f"{jobs / 'b-fifo' / 'result.json'}: not a regular file (a FIFO); not read",
        f"{jobs / 'c-oversized' / 'result.json'}: "
        f"{MAX_FILE_BYTES + 1} bytes exceeds the 16 MiB limit; not read",
    ]


def test_the_job_summary_counts_no_linked_trial_result(
    harbor_trials: HarborTrials, host: tuple[Path, str], tmp_path: Path
) -> None:
    folder, _ = host
    job = tmp_path / "job"
    job.mkdir()
    harbor_trials.copy("oracle", job, "t1")
    linked = harbor_trials.copy("oracle", job, "t2")
    (linked / "result.json").unlink()
    (linked / "result.json").symlink_to(folder / "result.json")
    (job / "t3").symlink_to(harbor_trials["nop"])  # a linked trial folder
    summary = write_job_result(job, "exp", 3)
    assert summary["stats"]["n_completed_trials"] == 1
    # Negative control: the same content as a regular file is counted.
    (linked / "result.json").unlink()
    shutil.copyfile(folder / "result.json", linked / "result.json")
    assert write_job_result(job, "exp", 3)["stats"]["n_completed_trials"] == 2


async def test_the_watcher_says_once_which_job_result_it_did_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = tmp_path / "jobs"
    (tmp_path / "host.json").write_text(json.dumps({"finished_at": "2026-01-01T00:00:00Z"}))
    for name in ("linked", "regular"):
        (jobs / name / "t-1").mkdir(parents=True)
        (jobs / name / "t-1" / "trial.log").write_text("started\n")
    (jobs / "linked" / "result.json").symlink_to(tmp_path / "host.json")
    shutil.copyfile(tmp_path / "host.json", jobs / "regular" / "result.json")  # control
    folders = TrialFolders(InMemoryObjectStore("RESULTS"), cap_bytes=1 << 20, retry_delays_s=())
    watcher = Watcher(InMemoryLedger(), bus := RecordingBus(), jobs, folders)
    monkeypatch.setattr(watcher_handlers, "log", recorder := LogRecorder())
    assert await watcher.scan_external() == 1
    assert await watcher.scan_external() == 0
    logs = recorder.entries
    [announced] = bus.of_type(TrialCompleted)
    assert announced.result.name.startswith("external/harbor-regular/")
    warned = [e["problem"] for e in logs if e["event"] == "external job result not read"]
    assert warned == [f"{jobs / 'linked' / 'result.json'}: a symbolic link; not followed"]
