"""What the tests of the importer's and watcher's reads share: bounded calls (a FIFO
must fail a test, never hang it) and host files a trial must not get read."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harbor_fixtures import HarborTrials

LIMIT_S = 20.0


def bounded[T](fn: Callable[[], T], fifos: list[Path] | None = None) -> T:
    """``fn()`` in a thread; fail (never hang) when it does not return within LIMIT_S."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LIMIT_S)
    if thread.is_alive():
        for fifo in fifos or []:
            release(fifo)
        raise AssertionError(f"blocked for over {LIMIT_S:.0f} s (a FIFO was opened?)")
    if "error" in out:
        raise out["error"]
    return out["value"]  # type: ignore[no-any-return]


def release(fifo: Path) -> None:
    """Unblock a reader waiting in open() on ``fifo`` (a writer appears and leaves)."""
    with contextlib.suppress(OSError):  # ENXIO: no reader waiting
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture
def host(tmp_path: Path, harbor_trials: HarborTrials) -> tuple[Path, str]:
    """A host-only folder holding files a trial must not get the importer to read.

    Each contains TOKEN where a read would put it in the record: a result.json
    (TOKEN as task name), a reward.json (TOKEN as a reward key), a text file, and a
    verifier/ folder whose reward.txt is TOKEN.
    """
    token = "hostonly" + secrets.token_hex(8)
    folder = tmp_path / "host-only"
    (folder / "verifier").mkdir(parents=True)
    result = json.loads((harbor_trials["oracle"] / "result.json").read_text())
    result["task_name"] = token
    (folder / "result.json").write_text(json.dumps(result))
    (folder / "reward.json").write_text(json.dumps({"reward": 1.0, token: 0.5}))
    (folder / "secret.txt").write_text(token)
    (folder / "verifier" / "reward.txt").write_text(token)
    return folder, token


# name in the trial folder -> (host path it is made of, diagnostic when it is a link)
PLANTED = {
    "result.json": ("result.json", "result.json: a symbolic link; not followed"),
    "verifier/reward.txt": ("secret.txt", "verifier/reward.txt: a symbolic link; not followed"),
    "verifier/reward.json": (
        "reward.json",
        "verifier/reward.json: a symbolic link; not followed",
    ),
    "verifier": ("verifier", "verifier/reward.txt: verifier/ is a symbolic link; not followed"),
}


def plant(trials: HarborTrials, parent: Path, name: str, host: Path, *, link: bool) -> Path:
    """An oracle trial whose ``name`` is made of host file ``PLANTED[name][0]``: a link
    to it, or (``link=False``, the control) a regular copy of it. result.json is
    removed first, so that the verifier's files are read too."""
    folder_name = f"{name.replace('/', '-').replace('.', '-')}-{'link' if link else 'copy'}"
    trial = trials.copy("oracle", parent, folder_name)
    (trial / "result.json").unlink()
    (trial / "verifier" / "reward.txt").unlink()
    target, dest = host / PLANTED[name][0], trial / name
    if dest.is_dir():
        shutil.rmtree(dest)
    if link:
        dest.symlink_to(target)
    elif target.is_dir():
        shutil.copytree(target, dest)
    else:
        shutil.copyfile(target, dest)
    return trial
