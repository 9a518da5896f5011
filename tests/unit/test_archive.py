"""Packing task and trial folders (services.common.archive); hostile archives are in
tests/security/test_archive_unpacking.py.

Each invariant has a negative control: what must change the bytes does, what must be
refused is, and the accepted neighbour of each refusal packs.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import stat
import tarfile
from pathlib import Path

import pytest

from services.common.archive import (
    TRIAL_MANIFEST,
    ArchiveError,
    ArchiveLimits,
    pack_task,
    pack_trial,
    unpack,
    unpack_task,
    unpack_trial,
)
from services.common.archive import _read_bounded as read_bounded
from services.common.task_identity import task_checksum
from tests.harbor_fixtures import EXAMPLE_TASKS, HarborTrials

EXAMPLES = sorted(p for p in EXAMPLE_TASKS.iterdir() if p.is_dir())


@pytest.fixture
def task(tmp_path: Path) -> Path:
    """A copy of hello-file that a test may change."""
    return Path(shutil.copytree(EXAMPLE_TASKS / "hello-file", tmp_path / "hello-file"))


def members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.getmembers()


# -- tasks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", EXAMPLES, ids=lambda p: p.name)
def test_round_trip_keeps_the_checksum(folder: Path, tmp_path: Path) -> None:
    data = pack_task(folder)
    dest = unpack_task(data, tmp_path / folder.name, task_checksum(folder))
    assert task_checksum(dest) == task_checksum(folder)
    for script in folder.rglob("*.sh"):
        copy = dest / script.relative_to(folder)
        assert bool(copy.stat().st_mode & stat.S_IXUSR) == bool(
            script.stat().st_mode & stat.S_IXUSR
        )


def test_same_folder_same_bytes_whatever_the_metadata(task: Path, tmp_path: Path) -> None:
    first = pack_task(task)
    other = Path(shutil.copytree(task, tmp_path / "elsewhere" / "renamed"))
    for path in [other, *other.rglob("*")]:
        os.utime(path, (1_234_567, 1_234_567))
        path.chmod(path.stat().st_mode | stat.S_IWGRP)  # a mode bit packing drops
    assert pack_task(other) == first
    assert pack_task(task) == first
    # gzip header: no flags (so no file name) and MTIME 0, else it varies per packing.
    assert first[3] == 0 and first[4:8] == bytes(4)
    header = members(first)[0]
    assert (header.mtime, header.uid, header.gid, header.uname, header.gname) == (0, 0, 0, "", "")


def test_content_and_exec_bit_change_the_bytes(task: Path) -> None:
    before = pack_task(task)
    (task / "instruction.md").write_text("changed\n")
    changed = pack_task(task)
    assert changed != before
    (task / "task.toml").chmod(0o755)
    assert pack_task(task) != changed


def test_link_to_a_file_inside_is_kept(task: Path, tmp_path: Path) -> None:
    (task / "tests" / "same.sh").symlink_to("test.sh")
    # An absolute target inside the task is stored relative, so it survives the move.
    (task / "abs-link").symlink_to(task / "instruction.md")
    data = pack_task(task)
    dest = unpack_task(data, tmp_path / "out", task_checksum(task))
    assert os.readlink(dest / "tests" / "same.sh") == "test.sh"
    assert os.readlink(dest / "abs-link") == "instruction.md"
    assert (dest / "abs-link").read_text() == (task / "instruction.md").read_text()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda t: (t / "out").symlink_to("../outside.txt"), "leaves the task"),
        (lambda t: (t / "out").symlink_to("/etc/hostname"), "leaves the task"),
        (lambda t: (t / "out").symlink_to("tests"), "link to a folder"),
        (lambda t: (t / "out").symlink_to("missing"), "dangling"),
        (lambda t: os.mkfifo(t / "out"), "FIFO"),
    ],
    ids=["link-out", "absolute-link-out", "link-to-folder", "dangling", "fifo"],
)
def test_pack_refuses_what_unpacking_would(task: Path, make: object, reason: str) -> None:
    pack_task(task)  # negative control: the task as it was packs
    (task.parent / "outside.txt").write_text("x")
    make(task)  # type: ignore[operator]
    with pytest.raises(ArchiveError, match=reason) as caught:
        pack_task(task)
    assert caught.value.entry == "out"


def test_pack_refuses_a_socket(tmp_path: Path) -> None:
    task = Path(shutil.copytree(EXAMPLE_TASKS / "hello-file", tmp_path / "t"))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(task / "sock"))
        with pytest.raises(ArchiveError, match="socket"):
            pack_task(task)


def test_pack_limits(task: Path) -> None:
    n = sum(1 for _ in task.rglob("*"))
    pack_task(task, ArchiveLimits(max_entries=n))
    with pytest.raises(ArchiveError, match="too many entries"):
        pack_task(task, ArchiveLimits(max_entries=n - 1))
    biggest = max(p.stat().st_size for p in task.rglob("*") if p.is_file())
    with pytest.raises(ArchiveError, match="per-file limit"):
        pack_task(task, ArchiveLimits(max_file_bytes=biggest - 1))
    (task / "zeros.bin").write_bytes(bytes(8 * 1024 * 1024))
    with pytest.raises(ArchiveError, match="ratio"):
        pack_task(task)
    unpack(
        pack_task(task, ArchiveLimits(max_ratio=2000)),
        task.parent / "u",
        ArchiveLimits(max_ratio=2000),
    )


# -- trials --------------------------------------------------------------------------------


def synthetic_trial(root: Path) -> Path:
    trial = root / "hello__abc"
    for sub in ("agent", "verifier", "artifacts", "agent/empty"):
        (trial / sub).mkdir(parents=True)
    (trial / "result.json").write_text('{"reward": 1}')
    (trial / "config.json").write_text("{}")
    (trial / "trial.log").write_text("log\n")
    (trial / "verifier" / "reward.txt").write_text("1\n")
    (trial / "agent" / "big.log").write_bytes(os.urandom(5000))
    (trial / "agent" / "small.log").write_text("hi")
    (trial / "artifacts" / "out.bin").write_bytes(os.urandom(3000))
    (trial / "agent" / "shadow").symlink_to("/etc/shadow")
    os.mkfifo(trial / "agent" / "pipe")
    return trial


def read_manifest(folder: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((folder / TRIAL_MANIFEST).read_text())
    return loaded


def test_trial_cap_keeps_the_important_parts_and_lists_the_rest(tmp_path: Path) -> None:
    trial = synthetic_trial(tmp_path)
    packed = pack_trial(trial, cap_bytes=2500)
    dest = unpack_trial(packed.data, tmp_path / "out")
    # result.json, config.json, trial.log, verifier/ fit; agent/big.log (5000) cannot,
    # agent/small.log still fits after it, artifacts/out.bin (3000) cannot either.
    kept = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert kept == sorted(
        [
            "result.json",
            "config.json",
            "trial.log",
            "verifier/reward.txt",
            "agent/small.log",
            TRIAL_MANIFEST,
        ]
    )
    assert (dest / "agent" / "empty").is_dir()
    manifest = read_manifest(dest)
    left = {item["name"]: item for item in manifest["left_out"]}  # type: ignore[attr-defined]
    assert set(left) == {"agent/big.log", "artifacts/out.bin", "agent/shadow", "agent/pipe"}
    assert left["agent/big.log"]["size"] == 5000 and "cap" in left["agent/big.log"]["reason"]
    assert "symbolic link" in left["agent/shadow"]["reason"]
    assert manifest["cap_bytes"] == 2500 and manifest["files"] == packed.files == 5
    assert [x.name for x in packed.left_out] == sorted(left)


def test_trial_under_the_cap_is_whole_and_deterministic(tmp_path: Path) -> None:
    trial = synthetic_trial(tmp_path)
    (trial / "agent" / "shadow").unlink()
    (trial / "agent" / "pipe").unlink()
    packed = pack_trial(trial)
    assert packed.left_out == [] and packed.data == pack_trial(trial).data
    dest = unpack_trial(packed.data, tmp_path / "out")
    for path in trial.rglob("*"):
        if path.is_file():
            assert (dest / path.relative_to(trial)).read_bytes() == path.read_bytes()
    assert read_manifest(dest)["left_out"] == []


@pytest.mark.parametrize(
    ("looked_at", "limit", "expected"),
    [
        (50, 1000, 50),  # the size as looked at: the whole file
        (3, 1000, 50),  # it grew after the look: still the whole file
        (50, 20, 20),  # over the limit: the limit (the caller records it as over the cap)
        (3, 20, 20),  # grew past the limit: bounded all the same
        (0, 1000, 50),  # a size of 0 (a file the look could not size): the whole file
    ],
)
def test_a_file_is_read_whole_up_to_the_limit(
    tmp_path: Path, looked_at: int, limit: int, expected: int
) -> None:
    # Packing reads a file's size first (reading up to the cap allocates the whole cap
    # per file); a file that grew after it was looked at must not be cut short.
    path = tmp_path / "f"
    path.write_bytes(bytes(range(50)))
    with path.open("rb") as f:
        assert read_bounded(f, looked_at, limit) == bytes(range(50))[:expected]


def test_trial_entry_limit_is_recorded(tmp_path: Path) -> None:
    trial = synthetic_trial(tmp_path)
    packed = pack_trial(trial, max_entries=3)
    assert any("entries" in x.reason for x in packed.left_out)
    assert len(members(packed.data)) <= 3 + 1  # + the manifest


def test_real_harbor_trial_round_trips(harbor_trials: HarborTrials, tmp_path: Path) -> None:
    trial = harbor_trials["oracle"]
    packed = pack_trial(trial)
    dest = unpack_trial(packed.data, tmp_path / trial.name)
    assert packed.left_out == []
    originals = {p.relative_to(trial): p.read_bytes() for p in trial.rglob("*") if p.is_file()}
    assert Path("result.json") in originals
    for rel, content in originals.items():
        assert (dest / rel).read_bytes() == content
