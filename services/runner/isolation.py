"""Runs each trial in a fresh process forked from a clean, pre-imported forkserver.

Why a process per trial (see services.runner.trial_process): a trial can change state
that belongs to the whole process (litellm's price table, os.environ, the working
directory, logging, imported agent modules), and a long-lived runner would carry it
into the next experiment's trials. Isolation by construction beats resetting a list of
known globals: nothing a trial changes survives it, including state nobody listed.

Why a forkserver (``multiprocessing``'s): a fresh interpreter per trial would import
Harbor, litellm and the agent again, seconds of CPU per trial. The forkserver imports
them once (services.runner.forkserver_preload, plus litellm and terminus-2 when the
runner's first trial names a model) and forks a child per trial in milliseconds. The
runner's own process never imports them, so its event loop is never blocked by
Harbor's synchronous start-up; starting the forkserver (which waits for the preload)
and each child happen in a worker thread.

The child reports over a one-way pipe: ("log", phase, stream, text) as output comes,
then ("outcome", fields) or ("cancelled", None), its last message, sent before its
event loop's teardown and its interpreter's exit. A reader thread per trial hands the
messages to the event loop; ``run`` returns on the last message (the trial folder is
complete by then) and the process is reaped in the background, killed if it has not
exited ``REAP_GRACE_S`` later. When output ends, a sink that asks for it
(live_logs.ClosableLogSink) is closed, so it can release what redaction kept back and
report what its cap dropped. Cancelling ``run`` sends SIGUSR1 (the child cancels the
trial, so Harbor stops its environment), waits ``cancel_grace_s``, then SIGKILLs.

Two rules this relies on: a child re-imports the parent's main module unless it is a
package's ``__main__`` (``python -m services.runner`` is; a script that starts trials
must guard its code with ``if __name__ == "__main__"``); and the forkserver starts with
the runner's environment at its first use (a runner never changes it): each trial
cuts its copy down to what it may see before Harbor runs (services.runner.trial_env:
a base list, its agent's allowed secret names, the policy's ``pass_env``).

Cost: the preload takes one to a few seconds of CPU once per runner (litellm is most
of it), in the forkserver, while the first trial waits for it in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

from services.common.logging import get_logger
from services.runner.live_logs import ClosableLogSink
from services.runner.trial_process import Outcome, TrialJob, child_main, failed

PRELOAD = ("services.runner.forkserver_preload",)
# ~4 s of CPU to import (more without a bytecode cache): worth it on a runner that
# serves LLM agents, pure cost on one that runs oracle/nop (the demo, benchmarks).
# multiprocessing skips a preload module it cannot import.
LLM_PRELOAD = ("litellm", "harbor.agents.terminus_2")
CANCEL_GRACE_S = 20.0
REAP_GRACE_S = 30.0
"""How long a trial's process may take to exit after reporting its ending."""

log = get_logger(__name__)

OnLog = Callable[[str, str, str], Awaitable[None]]


def _pump(conn: Connection, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]) -> None:
    """Reader thread: every message from the child, then None at end of pipe."""
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            loop.call_soon_threadsafe(queue.put_nowait, message)
    finally:
        conn.close()
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            loop.call_soon_threadsafe(queue.put_nowait, None)


class TrialProcesses:
    """Starts trial processes from one forkserver per runner (see the module docstring)."""

    def __init__(self, cancel_grace_s: float = CANCEL_GRACE_S) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        self._cancel_grace_s = cancel_grace_s
        self._preload_chosen = False
        self._reaping: set[asyncio.Task[None]] = set()

    def _choose_preload(self, llm: bool) -> None:
        # Decided by the first trial, before the forkserver starts: a runner whose
        # first trial names a model serves LLM agents. A later LLM trial on a runner
        # that started without them imports the stack in its own process (slower,
        # same result).
        if not self._preload_chosen:
            self._ctx.set_forkserver_preload([*PRELOAD, *(LLM_PRELOAD if llm else ())])
            self._preload_chosen = True

    async def run(self, job: TrialJob, on_log: OnLog | None, *, llm: bool = False) -> Outcome:
        """Run ``job`` in a new process to its outcome (cancellation stops the process).

        ``llm``: the trial's agent talks to a model (chooses the preload, first time only).
        """
        self._choose_preload(llm)
        recv_conn, send_conn = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=child_main, args=(job, send_conn), name="trialbus-trial", daemon=False
        )
        try:
            # Blocking: the first start waits for the forkserver's preload.
            await asyncio.to_thread(proc.start)
        finally:
            send_conn.close()  # the child holds its own copy; EOF then means it is gone
        queue: asyncio.Queue[Any] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        threading.Thread(
            target=_pump, args=(recv_conn, loop, queue), name="trial-pipe", daemon=True
        ).start()
        outcome: Outcome | None = None
        ended = False
        try:
            while (message := await queue.get()) is not None:
                kind = message[0]
                if kind == "log" and on_log is not None:
                    await on_log(message[1], message[2], message[3])
                elif kind in ("outcome", "cancelled"):
                    # The child's last message: the trial is over, its folder written.
                    # Its process's exit (event-loop teardown, interpreter exit) is
                    # not the slot's business: it is reaped in the background.
                    outcome, ended = message[1], True
                    break
            if not ended:
                await asyncio.to_thread(proc.join)
        except asyncio.CancelledError:
            await self._stop(proc)
            raise
        finally:
            if ended:
                self._reap_later(proc)
            elif proc.exitcode is None:  # an error above: never leave a trial running
                proc.kill()
            if isinstance(on_log, ClosableLogSink):
                # The output has ended (or will never come): the sink publishes what
                # redaction kept back and how much its cap dropped.
                with contextlib.suppress(Exception):
                    await on_log.close()
        if outcome is None:
            status = "was stopped" if ended else f"exited with status {proc.exitcode}"
            return failed("TrialProcessDied", f"the trial's process {status} before reporting")
        return outcome

    def _reap_later(self, proc: Any) -> None:
        task = asyncio.create_task(self._reap(proc))
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def _reap(self, proc: Any) -> None:
        """Wait for a process that reported its ending to exit; kill it after
        ``REAP_GRACE_S`` (a hung teardown must not outlive its trial)."""
        if not await _exited(proc, REAP_GRACE_S):
            log.warning("trial process did not exit after its ending; killed", pid=proc.pid)
            proc.kill()
            await _exited(proc, 5.0)
        proc.join(0)  # collect its status (it has exited: does not block)

    async def _stop(self, proc: Any) -> None:
        """Ask the child to cancel its trial; SIGKILL it after the grace period."""
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(proc.pid, signal.SIGUSR1)
        try:
            await asyncio.to_thread(proc.join, self._cancel_grace_s)
        finally:
            if proc.exitcode is None:
                proc.kill()
                await asyncio.to_thread(proc.join, 5.0)


async def _exited(proc: Any, timeout_s: float) -> bool:
    """Whether ``proc`` exits within ``timeout_s``, waited for on the event loop (its
    sentinel becomes readable), without holding a worker thread."""
    if proc.exitcode is not None:
        return True
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    sentinel = proc.sentinel

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(sentinel, readable)
    try:
        await asyncio.wait_for(exited, timeout_s)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(sentinel)
    return True


def incomplete_harbor_models() -> list[type[Any]]:
    """Harbor's pydantic models not yet built. Pydantic builds a model whose forward
    references did not resolve at import on its first use, which in a forked trial
    means in every trial (TrialLock, EnvironmentConfig, VerifierConfig: Trial.create
    uses them); the forkserver builds them once (services.runner.forkserver_preload)."""
    from pydantic import BaseModel

    found: dict[type[Any], None] = {}
    stack: list[type[Any]] = [BaseModel]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            if sub.__module__.startswith("harbor.") and not sub.__pydantic_complete__:
                found[sub] = None
    return list(found)
