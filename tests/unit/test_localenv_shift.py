"""The shifted root's pure parts: the setting, id arithmetic, ownership hand-over."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.localenv.shift import (
    DEFAULT_BASE,
    SHIFT_COUNT,
    STAGING,
    Staging,
    parse_userns,
    shift_tree,
    shifted,
)


def test_the_setting_is_off_unless_asked_and_refuses_anything_else() -> None:
    for off in (None, "", "identity", False):
        assert parse_userns(off) is None
    assert parse_userns("shifted") == DEFAULT_BASE
    assert parse_userns("shifted", "200000") == 200000
    with pytest.raises(ValueError, match="'identity' or 'shifted'"):
        parse_userns("root")
    # A base below 65536 would give trials the ids of the host's own users.
    with pytest.raises(ValueError, match="at least 65536"):
        parse_userns("shifted", 1000)


def test_ids_shift_once() -> None:
    assert shifted(0, DEFAULT_BASE) == DEFAULT_BASE
    assert shifted(1000, DEFAULT_BASE) == DEFAULT_BASE + 1000
    assert shifted(DEFAULT_BASE + 5, DEFAULT_BASE) == DEFAULT_BASE + 5  # already shifted
    assert shifted(SHIFT_COUNT - 1, DEFAULT_BASE) == DEFAULT_BASE + SHIFT_COUNT - 1


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_shift_tree_hands_over_files_keeps_setuid_and_never_follows_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("host")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    tool = tree / "sub" / "tool"
    tool.write_text("#!/bin/sh\n")
    os.chown(tool, 1000, 1000)
    tool.chmod(0o4755)
    (tree / "link").symlink_to(outside)
    shift_tree(tree, DEFAULT_BASE)
    assert os.stat(tree).st_uid == DEFAULT_BASE
    st = os.stat(tool)
    assert (st.st_uid, st.st_gid) == (DEFAULT_BASE + 1000, DEFAULT_BASE + 1000)
    assert st.st_mode & 0o7777 == 0o4755  # chown cleared it; put back
    assert os.lstat(tree / "link").st_uid == DEFAULT_BASE
    assert os.stat(outside).st_uid == 0  # the link's target is not touched
    shift_tree(tree, DEFAULT_BASE)  # idempotent
    assert os.stat(tool).st_uid == DEFAULT_BASE + 1000


def test_the_start_script_drops_the_uid_before_the_user_namespace(tmp_path: Path) -> None:
    staging = Staging(DEFAULT_BASE)
    view = staging.view(Path("/usr"))
    staging.mountpoint()
    staging.source(tmp_path)
    script = staging.script(tmp_path / "fstab", ["unshare", "--user", "/bin/sh"])
    lines = script.splitlines()
    assert lines[0] == "set -e" and str(STAGING) in lines[1]
    assert any("idmap.py" in line and f"/usr {view}" in line for line in lines)
    last = lines[-1]
    assert last.startswith("exec ") and "setpriv" in last
    assert last.index(f"--reuid={DEFAULT_BASE}") < last.index("unshare --user")
    assert "--clear-groups" in last
