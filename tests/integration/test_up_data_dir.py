"""One stack per data folder (infra/data_dir_lock.py).

A second ``trialbus up`` on a running stack's folder started a second nats-server on
the first one's JetStream files before its ledger failed with WiredTiger's "already
being managed by another process"; a ``trialbus demo`` given that folder would have
emptied it under the running stack. Both are refused now, naming the running stack's
process, and leave it as it was. The lock goes with its process, however it ends.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from infra.data_dir_lock import DataDirInUse, DataDirLock
from tests.support.stack_console import ROOT, StackConsole, launched

pytestmark = pytest.mark.integration

TRIALBUS = str(Path(sys.executable).with_name("trialbus"))


def _trialbus(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    return subprocess.run(
        [TRIALBUS, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_second_stack_on_a_running_stack_s_folder_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    with launched(tmp_path, {}, StackConsole) as handle:
        up = handle.lines[handle.wait_line("trialbus is up", timeout=180)]
        api = re.search(r"HTTP (http://127\.0\.0\.1:\d+) ", up)
        assert api, up
        data = handle.data_dir
        pid = handle.stack["pid"]
        token_file = data / "secrets" / "api-token"
        before = sorted(p.name for p in data.iterdir())
        assert token_file.exists() and "ledger" in before

        for args in (("up", "--data-dir", str(data)), ("demo", "--data-dir", str(data))):
            second = _trialbus(*args)
            assert second.returncode == 3, (args, second.stdout, second.stderr)
            assert f"is in use by another trialbus stack (pid {pid})" in second.stderr, args

        # The running stack is as it was: its files (a demo empties its folder first)
        # and its HTTP API.
        assert sorted(p.name for p in data.iterdir()) == before
        assert httpx.get(f"{api.group(1)}/healthz", timeout=30).status_code == 200
        assert handle.proc.poll() is None
    # The control: once that stack stopped, the folder is free again.
    lock = DataDirLock(data)
    lock.acquire()
    lock.release()


def test_the_lock_goes_with_its_process_however_it_ends(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from infra.data_dir_lock import DataDirLock;"
            "DataDirLock(Path(sys.argv[1])).acquire(); print('held', flush=True); time.sleep(600)",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(DataDirInUse, match=f"pid {holder.pid}\\)"):
            DataDirLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    lock = DataDirLock(tmp_path)  # nothing stale after a SIGKILL
    lock.acquire()
    lock.release()


def test_a_second_stack_leaves_the_first_one_s_stack_file_as_it_is(tmp_path: Path) -> None:
    # Two stacks on two data folders, started from one folder: one stack file.
    shared = tmp_path / "stack.json"
    with launched(tmp_path / "a", {}, StackConsole, stack_file=shared) as first:
        first.wait_line("trialbus is up", timeout=180)
        first_pid = json.loads(shared.read_text())["pid"]
        with launched(tmp_path / "b", {}, StackConsole, stack_file=shared) as second:
            second.wait_line("trialbus is up", timeout=180)
            note = second.lines[second.wait_line("note: ", timeout=5)]
            assert f"names the running stack of pid {first_pid}" in note, note
            assert json.loads(shared.read_text())["pid"] == first_pid
        # The second stopped: the file still names the first, whose commands go on.
        assert json.loads(shared.read_text())["pid"] == first_pid
    # The control: a stack removes its own file when it stops.
    assert not shared.exists()
