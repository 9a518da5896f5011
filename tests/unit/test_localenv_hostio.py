"""Host-side file access and the exec environment's transport, without a sandbox."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from services.localenv.entry import HELPER_ENV, env_loader, env_memfd
from services.localenv.errors import LocalEnvironmentError
from services.localenv.hostio import copy_file, copy_tree, private_dir, sweep_bound_folder


def test_env_travels_through_a_memfd_and_bash_exports_it() -> None:
    env = {"A": "1", "WITH_NEWLINE": "x\ny", "PATH": "/usr/bin:/bin", "a.b": "dropped"}
    fd = env_memfd(env)
    try:
        out = subprocess.run(
            [*env_loader(fd), "env"],
            env=dict(HELPER_ENV),
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    finally:
        os.close(fd)
    assert "A=1" in out.splitlines() and "WITH_NEWLINE=x\ny" in out
    assert "PATH=/usr/bin:/bin" in out.splitlines()
    # The helpers' own variables do not leak through; names bash cannot export drop.
    assert "LANG=C" not in out.splitlines() and "a.b=" not in out
    assert not any(line.startswith("PWD=") for line in out.splitlines())


def test_copies_keep_links_as_links_and_refuse_fifos(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("data")
    (src / "host").symlink_to("/etc/hostname")
    copy_tree(src, tmp_path / "out")
    assert (tmp_path / "out" / "f").read_text() == "data"
    assert os.readlink(tmp_path / "out" / "host") == "/etc/hostname"
    with pytest.raises(LocalEnvironmentError, match="symbolic link"):
        copy_file(src / "host", tmp_path / "x", allow_link=False)
    os.mkfifo(src / "pipe")
    with pytest.raises(LocalEnvironmentError, match="FIFO"):
        copy_tree(src, tmp_path / "out2")


def test_a_copy_never_writes_through_a_link_at_the_destination(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "dest").symlink_to(victim)
    (tmp_path / "src").write_text("new")
    copy_file(tmp_path / "src", tmp_path / "dest")
    assert victim.read_text() == "keep" and (tmp_path / "dest").read_text() == "new"


def test_sweep_removes_links_out_and_special_files(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    (folder / "sub").mkdir(parents=True)
    (folder / "in.txt").write_text("1")
    (folder / "ok").symlink_to("in.txt")
    (folder / "sub" / "up-ok").symlink_to("../in.txt")
    (folder / "out").symlink_to("/etc/passwd")
    (folder / "sub" / "up-out").symlink_to("../../elsewhere")
    os.mkfifo(folder / "pipe")
    (folder / "suid").write_text("x")
    (folder / "suid").chmod(0o4755)
    changed = sweep_bound_folder(folder)
    assert sorted(p.name for p in folder.rglob("*")) == ["in.txt", "ok", "sub", "suid", "up-ok"]
    assert (folder / "suid").stat().st_mode & 0o7777 == 0o755
    assert len(changed) == 4, changed


def test_private_dir_tightens_its_own_and_refuses_links(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    private_dir(mine)
    assert mine.stat().st_mode & 0o777 == 0o700
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(LocalEnvironmentError, match="not a link"):
        private_dir(tmp_path / "link")
