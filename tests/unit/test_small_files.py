"""read_small_file: the one bounded read of a manifest or a runner policy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.common.runner_policy import PolicyFileError, load_policy
from services.common.small_files import FileTooLarge, NotRegularFile, read_small_file


def test_a_file_up_to_the_limit_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"x" * 10)
    assert read_small_file(path, 10) == b"x" * 10
    # Negative control: one byte over the limit is refused, naming the limit.
    with pytest.raises(FileTooLarge, match="larger than 9 bytes"):
        read_small_file(path, 9)


def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: a plain open() would wait forever
    for path in (fifo, tmp_path, Path("/dev/zero")):
        with pytest.raises(NotRegularFile, match="not a regular file"):
            read_small_file(path, 100)
    with pytest.raises(FileNotFoundError):
        read_small_file(tmp_path / "missing.yaml", 100)


def test_a_policy_file_in_place_of_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    with pytest.raises(PolicyFileError, match=r"policy.yaml: cannot be read \(not a regular"):
        load_policy(fifo)
