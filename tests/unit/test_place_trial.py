"""place_trial: a trial archive lands as <jobs>/<experiment>/<trial>, replaced on redelivery.

The importer resolves an experiment's job folder once (``checked_job_dir``) and each
trial's folder lexically: these tests hold the containment the per-trial resolution
gave before, each refusal beside a negative control.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from schemas.events import TrialCompleted
from services.common import unpack
from services.common.adapters.memory_objects import InMemoryObjectStore
from services.common.archive import TRIAL_MANIFEST, pack_trial
from services.common.harbor_jobs import read_marker
from services.importer.folders import StoredTrials, checked_job_dir, place_trial


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


def _two_deliveries(
    tmp_path: Path, place: Callable[[bytes], object], waiting: Callable[[], bool]
) -> tuple[Path, list[str]]:
    """A second delivery of one trial arrives while the first is writing its folder in
    place (held at its first file) and the first goes on once the second is
    ``waiting`` or done; returns the folder and each delivery's outcome in order."""
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    for folder, extra, reward in ((first_dir, "a.txt", 0.0), (second_dir, "b.txt", 1.0)):
        folder.mkdir()
        (folder / "result.json").write_text(json.dumps({"reward": reward}))
        (folder / extra).write_text(extra)
    first, second = pack_trial(first_dir).data, pack_trial(second_dir).data
    writing, go_on = threading.Event(), threading.Event()
    real_write = unpack._write_all

    def held_write(fd: int, chunk: bytes) -> None:
        if threading.current_thread().name == "first" and not writing.is_set():
            writing.set()
            go_on.wait(WAIT_S)
        real_write(fd, chunk)

    outcomes: list[str] = []

    def deliver(data: bytes) -> None:
        try:
            place(data)
            outcomes.append("placed")
        except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
            outcomes.append(type(exc).__name__)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unpack, "_write_all", held_write)
        one = threading.Thread(target=deliver, args=(first,), name="first")
        one.start()
        assert writing.wait(WAIT_S)
        two = threading.Thread(target=deliver, args=(second,), name="second")
        two.start()
        # The second either waits for its turn (the first still holds it) or is done.
        deadline = time.monotonic() + WAIT_S
        while two.is_alive() and not waiting():
            assert time.monotonic() < deadline, "second delivery neither waited nor finished"
            time.sleep(0.01)
        go_on.set()
        one.join(WAIT_S)
        two.join(WAIT_S)
    return tmp_path / "jobs" / "exp-1" / "trial-a", outcomes


WAIT_S = 30.0


def test_two_deliveries_of_one_trial_take_turns(tmp_path: Path) -> None:
    trials = StoredTrials(InMemoryObjectStore("RESULTS"), tmp_path / "jobs")
    ref = {"bucket": "RESULTS", "name": "exp-1/trial-a/1.tar.gz", "size": 1, "sha256": "0" * 64}
    event = TrialCompleted.model_validate(
        {"experiment_id": "exp-1", "trial_id": "trial-a", "trial_name": "trial-a", "result": ref}
    )

    def second_waits() -> bool:  # both deliveries hold the trial's turn lock's count
        placing = trials._placing.get(("exp-1", "trial-a"))
        return placing is not None and placing[1][0] >= 2

    dest, outcomes = _two_deliveries(
        tmp_path, lambda data: trials._place(event, data), second_waits
    )
    assert outcomes == ["placed", "placed"]
    # The later delivery's folder, whole, and nothing of the first mixed in or left over.
    assert sorted(p.name for p in dest.iterdir()) == [
        "b.txt",
        "result.json",
        "trialbus-manifest.json",
    ]
    assert reward_of(dest) == 1.0
    assert not any(p.name.startswith(".") for p in dest.parent.iterdir())
    assert trials._placing == {}


def test_negative_control_without_turns_the_deliveries_collide(tmp_path: Path) -> None:
    job_dir = checked_job_dir(tmp_path / "jobs", "exp-1")
    dest, outcomes = _two_deliveries(
        tmp_path,
        lambda data: place_trial(tmp_path / "jobs", "exp-1", "trial-a", data, job_dir),
        lambda: False,  # the second goes straight ahead: the first resumes once it is done
    )
    # The first resumes in its own folder, which the second renamed away and removed:
    # it fails (a redelivery would place it again), and the second's folder is left
    # whole (unpacking writes relative to its folder's fd and removes only its own).
    assert outcomes == ["placed", "FileNotFoundError"]
    assert sorted(p.name for p in dest.iterdir()) == ["b.txt", "result.json", TRIAL_MANIFEST]
    assert reward_of(dest) == 1.0
