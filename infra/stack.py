"""The embedded stack for an operator: ``trialbus up`` runs it until Ctrl-C, supervised;
``trialbus demo`` runs one experiment through a fresh one.

The stack itself (servers plus service processes) is ``EmbeddedStack`` in
infra.embedded_stack; it is re-exported here with ``LEDGER_ARGS`` and
``ServiceProcess``, where the end-to-end tests import them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from infra.embedded import free_port
from infra.embedded_stack import LEDGER_ARGS, EmbeddedStack
from infra.service_process import ServiceProcess
from infra.stack_settings import from_this_shell
from infra.supervise import GaveUp, RestartPolicy, Supervisor
from services.common.errors import EXIT_OK, EXIT_UNAVAILABLE
from services.common.stackfile import read_stack_file, write_stack_file

__all__ = [
    "LEDGER_ARGS",
    "EmbeddedStack",
    "ServiceProcess",
    "run_demo",
    "run_stack_forever",
    "serve",
]


class Printer(Protocol):
    """The console the commands talk to (a rich Console; print only)."""

    def print(self, *objects: Any, **kwargs: Any) -> None: ...


def run_stack_forever(data_dir: Path, *, runners: int, concurrency: int, console: Printer) -> int:
    """``trialbus up``: the stack on the usual ports when free, supervised until Ctrl-C,
    its services given the shell's trialbus settings (infra.stack_settings)."""
    _quiet_logging()
    shell = from_this_shell()
    for line in shell.lines():
        console.print(line, highlight=False)
    stack = EmbeddedStack(
        data_dir,
        n_runners=runners,
        concurrency=concurrency,
        nats_port=_port_or_free(4222),
        ledger_port=_port_or_free(27017),
        http_port=_port_or_free(8080),
        extra_env=shell.passed,
    )
    return serve(stack, console)


def serve(stack: EmbeddedStack, console: Printer, policy: RestartPolicy | None = None) -> int:
    """Start ``stack``, write the stack file, supervise every child until SIGINT/SIGTERM.

    A child that dies (nats-server, the ledger or a service) is restarted in place and
    the console says so; one that dies more often than ``policy`` allows stops the
    whole stack with a message naming it. Returns the exit code: 0 after Ctrl-C, 3
    (unavailable) when the stack could not start or was given up.
    """
    from services.common.stackfile import stack_file

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def say(text: str) -> None:
        console.print(text, highlight=False)

    try:
        stack.start()
    except (RuntimeError, TimeoutError) as exc:  # EmbeddedServerError, a service that died
        say(f"trialbus could not start: {exc}")
        return EXIT_UNAVAILABLE
    assert stack.nats_url and stack.ledger_url
    path = stack_file()
    other = read_stack_file(path)  # None: missing, or its stack is gone
    owns_file = other is None or other.get("pid") == os.getpid()
    if owns_file:
        write_stack_file(
            path,
            nats_url=stack.nats_url,
            ledger_url=stack.ledger_url,
            jobs_dir=stack.jobs_dir,
            pid=os.getpid(),
            nats_credentials_dir=stack.nats_auth.folder if stack.nats_auth else None,
        )
    else:
        assert other is not None
        say(
            f"note: {path} names the running stack of pid {other.get('pid')}, left as it "
            "is: commands run here reach that one. To reach this one by a stack file, "
            "start it with TRIALBUS_STACK_FILE set to another file and give commands the "
            "same setting"
        )
    nats_auth = (
        f" (authentication required: credentials per role in {stack.nats_auth.folder})"
        if stack.nats_auth
        else ""
    )
    say(
        f"trialbus is up: NATS {stack.nats_url}{nats_auth}, "
        f"ledger {stack.ledger_url} (SecantusDB, beta), "
        f"HTTP http://127.0.0.1:{stack.http_port} (bearer token in {stack.api_token_path}), "
        f"jobs {stack.jobs_dir}. Ctrl-C stops it."
    )
    # Its own line, last: the one thing a person starting trialbus wants to click.
    token = stack.api_token_path
    say(f"dashboard: {dashboard_url(stack.http_port)} (log in with the token in {token})")
    code = EXIT_OK
    try:
        Supervisor(stack.children, say, policy).run(stop.wait)
    except GaveUp as exc:
        say(f"{exc}. Stopping trialbus.")
        code = EXIT_UNAVAILABLE
    finally:
        say("stopping trialbus ...")
        stack.stop()
        if owns_file:  # another stack's file stays: commands still reach it
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return code


def dashboard_url(http_port: int | None) -> str:
    """Where the web dashboard of a stack whose HTTP API listens on ``http_port`` is."""
    return f"http://127.0.0.1:{http_port}/ui/"


def _quiet_logging() -> None:
    """This process's own log lines (provisioning NATS) go to stderr, warnings only.

    Like every CLI command: stdout is the command's output (the demo's leaderboard);
    the console says what the operator needs, the services log to their files.
    """
    from services.common.logging import configure_logging

    configure_logging("WARNING")


def _port_or_free(port: int) -> int:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return free_port()
    return port


def run_demo(
    manifest: Path,
    data_dir: Path,
    *,
    concurrency: int,
    console: Printer,
    table: Callable[[list[dict[str, Any]], str], None],
) -> int:
    """``trialbus demo``: a fresh embedded stack, one experiment end to end, the leaderboard."""
    from services.common.settings import SubmitterSettings
    from services.submitter.commands import submit_and_wait
    from services.submitter.manifest_io import load_manifest

    _quiet_logging()
    load_manifest(manifest)  # refuse a bad manifest before starting anything
    t0 = time.monotonic()
    # fresh: a demo never reuses earlier results (emptied once the folder is its own)
    stack = EmbeddedStack(data_dir, concurrency=concurrency, fresh=True)
    try:
        stack.start()
    except (RuntimeError, TimeoutError) as exc:  # as serve() says it
        console.print(f"trialbus could not start: {exc}", highlight=False)
        return EXIT_UNAVAILABLE
    try:
        console.print(
            f"embedded stack up in {time.monotonic() - t0:.1f}s "
            f"(NATS {stack.nats_url}, ledger {stack.ledger_url})",
            highlight=False,
        )
        settings = SubmitterSettings(
            nats_url=stack.nats_url or "",
            ledger_url=stack.ledger_url or "",
            jobs_dir=stack.jobs_dir,
            nats_credentials=stack.nats_credentials("submitter"),
        )
        outcome = asyncio.run(
            submit_and_wait(settings, manifest, wait=True, timeout_s=900, progress=console)
        )
        s = outcome.summary
        console.print(
            f"experiment {s['experiment_id']} finished in "
            f"{time.monotonic() - t0:.1f}s; job folder: {stack.jobs_dir / s['experiment_id']}",
            highlight=False,
        )
        table(outcome.rows or [], f"leaderboard: {s['experiment_id']}")
    finally:
        stack.stop()
    return 0 if outcome.counts.get("pending", 1) == 0 else 4
