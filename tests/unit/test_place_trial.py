"""place_trial: a trial archive lands as <jobs>/<experiment>/<trial>, replaced on redelivery.

The importer resolves an experiment's job folder once (``checked_job_dir``) and each
trial's folder lexically: these tests hold the containment the per-trial resolution
gave before, each refusal beside a negative control.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from services.common.archive import pack_trial
from services.common.harbor_jobs import read_marker
from services.importer.folders import checked_job_dir, place_trial


def archive(tmp_path: Path, reward: float) -> bytes:
    folder = tmp_path / f"src-{reward}"
    folder.mkdir()
    (folder / "result.json").write_text(json.dumps({"reward": reward}))
    return pack_trial(folder).data


def reward_of(trial_dir: Path) -> float:
    return float(json.loads((trial_dir / "result.json").read_text())["reward"])


def test_a_new_trial_lands_in_a_job_folder_with_its_marker(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    dest = place_trial(jobs, "exp-1", "trial-a", archive(tmp_path, 1.0))
    assert dest == (jobs / "exp-1" / "trial-a").resolve() and reward_of(dest) == 1.0
    assert read_marker(dest.parent) is not None
    # Nothing staged is left beside it.
    assert not any(p.name.startswith(".") for p in dest.parent.iterdir())


def test_a_redelivery_replaces_the_folder(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    job_dir = checked_job_dir(jobs, "exp-1")
    first = place_trial(jobs, "exp-1", "trial-a", archive(tmp_path, 0.0), job_dir)
    (first / "stale.txt").write_text("from the first delivery")
    again = place_trial(jobs, "exp-1", "trial-a", archive(tmp_path, 1.0), job_dir)
    assert again == first and reward_of(again) == 1.0
    assert not (again / "stale.txt").exists()
    assert not any(p.name.startswith(".trial-a.") for p in job_dir.iterdir())


def test_a_link_at_the_trials_name_is_replaced_not_followed(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "result.json").write_text('{"reward": 7}')
    job_dir = checked_job_dir(jobs, "exp-1")
    job_dir.mkdir(parents=True)
    os.symlink(outside, job_dir / "trial-a")
    dest = place_trial(jobs, "exp-1", "trial-a", archive(tmp_path, 1.0), job_dir)
    assert not dest.is_symlink() and reward_of(dest) == 1.0
    assert reward_of(outside) == 7.0  # the link's target is untouched


@pytest.mark.parametrize("name", ["..", ".", "", "a/b"])
def test_a_trial_name_that_is_not_one_component_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="would leave the jobs folder"):
        place_trial(tmp_path / "jobs", "exp-1", name, archive(tmp_path, 1.0))
    assert place_trial(tmp_path / "jobs", "exp-1", "ok", archive(tmp_path, 2.0)).is_dir()


def test_a_job_folder_linked_out_of_the_jobs_folder_is_refused(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", jobs / "exp-linked")
    with pytest.raises(ValueError, match="would leave the jobs folder"):
        checked_job_dir(jobs, "exp-linked")
    assert checked_job_dir(jobs, "exp-plain") == (jobs / "exp-plain").resolve()
