"""Process plumbing for the sandbox: start-up handshake pipes, output capture, exits.

Kept apart from ``sandbox`` because it is about asyncio and file descriptors, not
namespaces: how a command's output is captured without letting a chatty background
process block it or the event loop, and how a command's exit is seen even while a
background process still holds its pipes.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import select
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

OutputSink = Callable[[str, str], Awaitable[None]]
_MAX_CAPTURE = 8 * 1024 * 1024


class HelperPipes:
    """The sandbox helper's handshake pipes: ready (userns made), go (map written), info, up."""

    def __init__(self) -> None:
        self.ready_r, self.ready_w = os.pipe()
        self.go_r, self.go_w = os.pipe()
        self.info_r, self.info_w = os.pipe()
        self.up_r, self.up_w = os.pipe()
        self._open = {self.ready_r, self.ready_w, self.go_r, self.go_w}
        self._open |= {self.info_r, self.info_w, self.up_r, self.up_w}

    @property
    def child_fds(self) -> tuple[int, ...]:
        return (self.ready_w, self.go_r, self.info_w, self.up_w)

    def close_child_ends(self) -> None:
        for fd in self.child_fds:
            self._close(fd)

    def close_all(self) -> None:
        for fd in list(self._open):
            self._close(fd)

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    @staticmethod
    def read(fd: int, until: bytes, timeout_s: float) -> bytes:
        return read_until(fd, until, timeout_s)


def read_until(fd: int, until: bytes, timeout_s: float) -> bytes:
    """Read from a pipe until ``until`` arrives; EOF or timeout raise."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while until not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer from the sandbox helper in {timeout_s:.0f}s")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise OSError("the sandbox helper exited during start-up")
        data += chunk
    return data


class OutputCapture:
    """One output stream of a command: kept up to a size, forwarded, later only drained."""

    def __init__(self, on_output: OutputSink | None) -> None:
        self._on_output = on_output
        self._parts: list[str] = []
        self._size = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.detached = False

    def text(self) -> str:
        return "".join(self._parts)

    async def pump(self, stream: asyncio.StreamReader | None, name: str) -> None:
        if stream is None:
            return
        while chunk := await stream.read(65536):
            # A read served from the buffer does not suspend: yield, or a process that
            # writes without pause would starve every other task of the event loop.
            await asyncio.sleep(0)
            if self.detached:
                continue
            text = self._decoder.decode(chunk)
            if self._size < _MAX_CAPTURE:
                self._parts.append(text)
                self._size += len(text)
                if self._size >= _MAX_CAPTURE:
                    self._parts.append("\n[trialbus: output truncated]\n")
            if self._on_output is not None:
                await self._on_output(text, name)


async def spawn(program: str, *args: str, **kwargs: Any) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec`` that a cancellation cannot leave hanging.

    Cancelled while it connects the pipes (the one await after the fork),
    ``create_subprocess_exec`` kills the process alone and then waits for its pipes to
    close. A child the process has started by then (nsenter's command, a command's
    background job) keeps them open and outlives it, so that wait never ends: a trial
    hung for good when Harbor's agent timeout cancelled an exec in that window (seen
    about once in 40 runs of six trials under load; ``tests/unit/test_spawn.py``).
    Here the creation always runs to its end; a cancelled caller then has the process
    killed with its process group (``kill_group``) before the cancellation goes on.
    """
    creation = asyncio.ensure_future(asyncio.create_subprocess_exec(program, *args, **kwargs))
    try:
        return await asyncio.shield(creation)
    except asyncio.CancelledError:
        while not creation.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([creation])  # a second cancellation changes nothing
        if not creation.cancelled() and creation.exception() is None:
            await kill_group(creation.result())
        raise


async def exit_code(proc: asyncio.subprocess.Process) -> int:
    """Wait for the process itself to exit.

    ``Process.wait()`` also waits for its pipes to close, which a background process
    of the command may keep open for the sandbox's whole life; a pidfd tells the
    exit alone.
    """
    if proc.returncode is not None:
        return proc.returncode  # reaped: its pid may belong to another process by now
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:  # already reaped: the return code is known
        pidfd = -1
    if pidfd >= 0:
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def on_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, on_exit)
        try:
            await exited
            # Non-blocking: the pidfd is readable, so the process has exited (WNOHANG).
            info = os.waitid(  # noqa: ASYNC222
                os.P_PIDFD, pidfd, os.WEXITED | os.WNOWAIT | os.WNOHANG
            )
            if info is not None:
                return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        except ChildProcessError:  # reaped meanwhile by asyncio's child watcher
            pass
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
    # asyncio's child watcher reaped it and records the code on its next callback.
    while proc.returncode is None:  # noqa: ASYNC110
        await asyncio.sleep(0.005)
    return proc.returncode


async def kill_group(proc: asyncio.subprocess.Process) -> None:
    """Kill a command's process group (the command and what it started in the foreground)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await exit_code(proc)
