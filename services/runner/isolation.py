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
then ("outcome", fields) or ("cancelled", None). A reader thread per trial hands the
messages to the event loop; when the pipe ends, a sink that asks for it
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

from services.runner.live_logs import ClosableLogSink
from services.runner.trial_process import Outcome, TrialJob, child_main, failed

PRELOAD = ("services.runner.forkserver_preload",)
# ~4 s of CPU to import (more without a bytecode cache): worth it on a runner that
# serves LLM agents, pure cost on one that runs oracle/nop (the demo, benchmarks).
# multiprocessing skips a preload module it cannot import.
LLM_PRELOAD = ("litellm", "harbor.agents.terminus_2")
CANCEL_GRACE_S = 20.0

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
        try:
            while (message := await queue.get()) is not None:
                kind = message[0]
                if kind == "log" and on_log is not None:
                    await on_log(message[1], message[2], message[3])
                elif kind == "outcome":
                    outcome = message[1]
            await asyncio.to_thread(proc.join)
        except asyncio.CancelledError:
            await self._stop(proc)
            raise
        finally:
            if proc.exitcode is None:  # an error above: never leave a trial running
                proc.kill()
            if isinstance(on_log, ClosableLogSink):
                # The output has ended (or will never come): the sink publishes what
                # redaction kept back and how much its cap dropped.
                with contextlib.suppress(Exception):
                    await on_log.close()
        if outcome is None:
            return failed(
                "TrialProcessDied",
                f"the trial's process exited with status {proc.exitcode} before reporting",
            )
        return outcome

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
