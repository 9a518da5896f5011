"""Hostile archives against safe unpacking (the HTTP API will accept uploaded tasks).

Each archive is refused with an ArchiveError naming the offending entry, nothing is
left at the destination or beside it, and nothing outside is touched. Negative
controls: benign archives using the accepted forms (a link to a file inside the task,
a leading './', folders implied by file paths) unpack.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from services.common.archive import (
    ArchiveError,
    ArchiveLimits,
    pack_task,
    unpack,
    unpack_task,
    unpack_trial,
)
from services.common.task_identity import task_checksum
from services.common.unpack import unpack_trial_files

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "examples" / "tasks" / "hello-file"

Member = tuple[tarfile.TarInfo, bytes | None]


def entry(
    name: str, data: bytes = b"x", *, kind: bytes = tarfile.REGTYPE, link: str = ""
) -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def archive(*members: Member, pax: dict[str, str] | None = None) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT, pax_headers=pax) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return gzip.compress(raw.getvalue())


def refused(data: bytes, dest: Path, entry_name: str, **kwargs: object) -> ArchiveError:
    """Unpack must refuse naming ``entry_name`` and leave nothing behind."""
    before = set(dest.parent.iterdir()) if dest.parent.exists() else set()
    with pytest.raises(ArchiveError) as caught:
        unpack(data, dest, **kwargs)  # type: ignore[arg-type]
    assert caught.value.entry == entry_name, str(caught.value)
    assert repr(entry_name) in str(caught.value)
    assert not dest.exists()
    assert set(dest.parent.iterdir()) == before, "a temporary folder was left behind"
    return caught.value


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    (tmp_path / "cache").mkdir()
    return tmp_path / "cache" / "task"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the destination that no archive may reach."""
    path = tmp_path / "secret.txt"
    path.write_text("keep me")
    return path


def test_absolute_path(dest: Path) -> None:
    refused(archive(entry("/etc/evil")), dest, "/etc/evil")


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "a/../b"])
def test_dot_dot(dest: Path, name: str) -> None:
    refused(archive(entry(name)), dest, name)


def test_symlink_out_relative(dest: Path, secret: Path) -> None:
    refused(archive(entry("peek", kind=tarfile.SYMTYPE, link="../../secret.txt")), dest, "peek")
    assert secret.read_text() == "keep me"


def test_symlink_out_absolute(dest: Path, secret: Path) -> None:
    refused(archive(entry("peek", kind=tarfile.SYMTYPE, link=str(secret))), dest, "peek")


def test_symlink_chain_out(dest: Path) -> None:
    # l1 -> l2 lies inside lexically; l2 leaves: l1 resolves outside through it.
    members = [
        entry("l1", kind=tarfile.SYMTYPE, link="l2"),
        entry("l2", kind=tarfile.SYMTYPE, link="../outside"),
    ]
    refused(archive(*members), dest, "l1")


def test_symlink_to_folder_refused(dest: Path) -> None:
    # A link to a folder can form a cycle (here: to the task root itself).
    refused(archive(entry("loop", kind=tarfile.SYMTYPE, link=".")), dest, "loop")


def test_write_through_symlink(dest: Path, secret: Path) -> None:
    members = [
        entry("inside.txt", b"ok"),
        entry("d", kind=tarfile.SYMTYPE, link="inside.txt"),
        entry("d/payload", b"evil"),
    ]
    refused(archive(*members), dest, "d/payload")


def test_symlink_replaced_by_file_of_same_name(dest: Path) -> None:
    members = [entry("a", kind=tarfile.SYMTYPE, link="b"), entry("a", b"second")]
    refused(archive(*members), dest, "a")


def test_hardlink_out(dest: Path, secret: Path) -> None:
    refused(archive(entry("hl", kind=tarfile.LNKTYPE, link=str(secret))), dest, "hl")
    assert secret.read_text() == "keep me"


def test_hardlink_inside_also_refused(dest: Path) -> None:
    members = [entry("a", b"data"), entry("b", kind=tarfile.LNKTYPE, link="a")]
    refused(archive(*members), dest, "b")


@pytest.mark.parametrize(
    ("kind", "label"),
    [
        (tarfile.CHRTYPE, "character device"),
        (tarfile.BLKTYPE, "block device"),
        (tarfile.FIFOTYPE, "FIFO"),
    ],
)
def test_devices_and_fifos(dest: Path, kind: bytes, label: str) -> None:
    error = refused(archive(entry("node", kind=kind)), dest, "node")
    assert label in str(error)


def test_too_many_entries(dest: Path) -> None:
    members = [entry(f"f{i}") for i in range(5)]
    error = refused(archive(*members), dest, "f4", limits=ArchiveLimits(max_entries=4))
    assert error.limit == 4
    unpack(archive(*members[:4]), dest, ArchiveLimits(max_entries=4))  # negative control


def test_file_too_large(dest: Path) -> None:
    error = refused(
        archive(entry("big", b"x" * 101)), dest, "big", limits=ArchiveLimits(max_file_bytes=100)
    )
    assert error.limit == 100
    unpack(archive(entry("big", b"x" * 100)), dest, ArchiveLimits(max_file_bytes=100))


def test_total_too_large(dest: Path) -> None:
    members = [entry("a", b"x" * 600), entry("b", b"y" * 600)]
    refused(archive(*members), dest, "b", limits=ArchiveLimits(max_total_bytes=1000))


def test_compression_bomb(dest: Path) -> None:
    # 64 MiB of zeros gzip to ~64 KiB: ratio ~1000, refused long before 64 MiB are read.
    zeros = entry("bomb.bin", bytes(64 * 1024 * 1024))
    data = archive(zeros)
    error = refused(data, dest, "bomb.bin")
    assert "ratio" in str(error)
    # Negative control: the same archive passes when the ratio limit allows it.
    unpack(data, dest, ArchiveLimits(max_ratio=2000))


def test_headers_cannot_smuggle_bytes_past_the_limits(dest: Path) -> None:
    # A 300 KB pax header (random, so incompressible) on a one-byte file.
    pax = {"comment": os.urandom(150_000).hex()}
    data = archive(entry("small"), pax=pax)
    tight = ArchiveLimits(max_total_bytes=1000, max_entries=2)
    with pytest.raises(ArchiveError, match="expands past"):
        unpack(data, dest, tight)
    assert not dest.exists()


def test_name_the_file_system_cannot_hold(dest: Path) -> None:
    name = "d/" + "a" * 300  # one component over the 255-byte limit
    refused(archive(entry(name)), dest, name)


def test_not_a_tar_gz(dest: Path) -> None:
    for junk in (
        b"not gzip at all",
        gzip.compress(b"gzip but not a tar" * 100),
        archive(entry("a"))[:40],
    ):
        with pytest.raises(ArchiveError, match=r"not a valid \.tar\.gz"):
            unpack(junk, dest)
        assert not dest.exists()


def test_checksum_mismatch(dest: Path, tmp_path: Path) -> None:
    data = pack_task(HELLO)
    with pytest.raises(ArchiveError, match="not the task it claims"):
        unpack_task(data, dest, "0" * 64)
    assert not dest.exists() and list(dest.parent.iterdir()) == []
    unpack_task(data, dest, task_checksum(HELLO))  # negative control
    assert task_checksum(dest) == task_checksum(HELLO)


def test_trial_archives_take_no_links(dest: Path) -> None:
    members = [
        entry("result.json", b"{}"),
        entry("agent/l", kind=tarfile.SYMTYPE, link="../result.json"),
    ]
    with pytest.raises(ArchiveError, match="not accepted"):
        unpack_trial(archive(*members), dest)
    unpack(archive(*members), dest)  # negative control: a task archive may hold it


def test_benign_archive_with_accepted_forms(dest: Path) -> None:
    members = [
        entry("./", kind=tarfile.DIRTYPE),
        entry("./tests/data.txt", b"shared"),  # 'tests' implied, named again below
        entry("./tests", kind=tarfile.DIRTYPE),
        entry("./run.sh", b"#!/bin/sh\n"),
        entry("./tests/link.txt", kind=tarfile.SYMTYPE, link="data.txt"),
        entry("./alias.txt", kind=tarfile.SYMTYPE, link="tests/link.txt"),  # a chain, inside
    ]
    unpack(archive(*members), dest)
    assert (dest / "tests" / "link.txt").read_text() == "shared"
    assert (dest / "alias.txt").read_text() == "shared"
    assert os.readlink(dest / "tests" / "link.txt") == "data.txt"


# -- a trial unpacked in place (the importer's new trials) ---------------------------------


@pytest.mark.parametrize(
    ("members", "name"),
    [
        ([entry("ok.txt", b"first"), entry("../evil")], "../evil"),
        ([entry("ok.txt"), entry("hl", kind=tarfile.LNKTYPE, link="ok.txt")], "hl"),
        ([entry("ok.txt"), entry("peek", kind=tarfile.SYMTYPE, link="ok.txt")], "peek"),
        ([entry("d/a"), entry("d/b"), entry("d/a", b"again")], "d/a"),
    ],
)
def test_a_trial_refused_in_place_leaves_nothing_behind(
    dest: Path, members: list[Member], name: str
) -> None:
    before = set(dest.parent.iterdir())
    with pytest.raises(ArchiveError) as caught:
        unpack_trial_files(archive(*members), dest, in_place=True)
    assert caught.value.entry == name, str(caught.value)
    assert not dest.exists() and set(dest.parent.iterdir()) == before
    # Negative control: the same archive without the offending entry lands whole.
    unpacked = unpack_trial_files(archive(*members[:-1]), dest, in_place=True)
    assert unpacked.path == dest and (dest / members[0][0].name).is_file()


def test_in_place_never_touches_an_existing_folder(dest: Path) -> None:
    dest.mkdir()
    (dest / "theirs.txt").write_text("someone else's")
    with pytest.raises(FileExistsError):
        unpack_trial_files(archive(entry("ok.txt"), entry("../evil")), dest, in_place=True)
    assert [p.name for p in dest.iterdir()] == ["theirs.txt"]


def test_unpacking_keeps_the_asked_bytes_within_their_bound(dest: Path) -> None:
    data = archive(entry("a.json", b"{}"), entry("v/big.txt", b"x" * 100), entry("other", b"o"))
    keep = {"a.json": 10, "v/big.txt": 99, "missing": 10}
    unpacked = unpack_trial_files(data, dest, keep=keep, in_place=True)
    assert unpacked.kept == {"a.json": b"{}"}  # big.txt is over its bound, other not asked
    assert unpacked.sizes == {"a.json": 2, "v/big.txt": 100, "other": 1}
    assert unpacked.kinds == {"a.json": "file", "v": "dir", "v/big.txt": "file", "other": "file"}
    assert (dest / "v" / "big.txt").read_bytes() == b"x" * 100  # written whole all the same
