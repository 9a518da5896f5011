"""A command cancelled while asyncio starts it ends, with everything it started.

``create_subprocess_exec`` has one await after the fork, while it connects the pipes.
Cancelled there, asyncio kills the process alone and waits for its pipes to close; a
child the process has started keeps them open, so the wait never ends. That hung the
session's Harbor fixture trials once in about 40 runs under load: Harbor's agent
timeout cancelled an exec in that window, and nsenter's command kept the pipes.

The tests hit the window on purpose, with real processes: a shell that starts a
background child, cancelled as soon as both exist (the event loop held still until
then, so the pipes are not yet connected). ``procs.spawn`` must end the cancellation
and leave no process; asyncio's own call, the negative control, must hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from services.localenv import procs

Create = Callable[..., Coroutine[Any, Any, asyncio.subprocess.Process]]
DEADLINE_S = 10.0
"""Generous: the cancellation takes milliseconds when it ends at all."""
HUNG_S = 3.0
"""How long the negative control waits before calling the cancellation hung."""


def _marked(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _until(check: Callable[[], bool], what: str) -> None:
    """Wait for ``check`` with the event loop held still (no await on purpose)."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S:.0f} s: {what}")
        time.sleep(0.005)


async def _cancel_in_the_pipe_window(
    create: Create, marker: str, wait_s: float = DEADLINE_S
) -> asyncio.Task[Any]:
    """Start ``sh`` (which starts a background child) through ``create`` and cancel it
    between the fork and the pipes' connection; the task, waited on for a while."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SPAWN_TEST_MARKER": marker}
    task: asyncio.Task[asyncio.subprocess.Process] = asyncio.create_task(
        create(
            "sh",
            "-c",
            "sleep 60 & wait",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=env,
        )
    )
    while not _marked(marker):  # noqa: ASYNC110 -- one loop step at a time, until the fork
        await asyncio.sleep(0)
    _until(lambda: len(_marked(marker)) >= 2, "sh started its background child")
    task.cancel()
    await asyncio.wait([task], timeout=wait_s)
    return task


ATTEMPTS = 20
"""Tries to hit the window: under load the pipes may connect before the cancellation."""


async def _in_the_window(
    create: Create, wait_s: float = DEADLINE_S
) -> tuple[asyncio.Task[Any], str]:
    """``_cancel_in_the_pipe_window`` until the cancellation lands in the window (not
    after the call returned the process, which a loaded machine's scheduling allows);
    the task and its processes' marker (the caller kills them)."""
    for _ in range(ATTEMPTS):
        marker = f"spawn-{uuid.uuid4().hex}"
        task = await _cancel_in_the_pipe_window(create, marker, wait_s)
        if not (task.done() and not task.cancelled() and task.exception() is None):
            return task, marker
        _kill_all(marker)  # missed: the call had returned its process
        await task.result().wait()
    raise AssertionError(f"the pipe window was missed {ATTEMPTS} times")


def _kill_all(marker: str) -> None:
    for pid in _marked(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_a_cancelled_spawn_ends_and_leaves_no_process() -> None:
    task, marker = await _in_the_window(procs.spawn)
    try:
        assert task.done(), "the cancellation did not end"
        assert task.cancelled()
        _until(lambda: not _marked(marker), "the cancelled command's processes ended")
    finally:
        _kill_all(marker)


async def test_a_spawn_not_cancelled_gives_the_process() -> None:
    proc = await procs.spawn("sh", "-c", "echo hi", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert (out, proc.returncode) == (b"hi\n", 0)


async def test_a_spawn_that_cannot_start_raises_its_error() -> None:
    with pytest.raises(FileNotFoundError):
        await procs.spawn("/nonexistent/trialbus-no-such-program")


async def test_negative_control_asyncio_alone_hangs_in_that_window() -> None:
    """The same steps through ``asyncio.create_subprocess_exec``: the check above fails."""
    task, marker = await _in_the_window(asyncio.create_subprocess_exec, HUNG_S)
    try:
        assert not task.done(), "asyncio ended the cancellation"
    finally:
        _kill_all(marker)  # the pipes close, and asyncio's wait ends
    await asyncio.wait_for(asyncio.wait([task]), DEADLINE_S)
    assert task.cancelled()
