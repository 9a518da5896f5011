"""``trialbus up`` in a child process, for tests that act on a running stack.

The child runs ``infra.stack.serve`` exactly as ``trialbus up`` does, only with free
ports, its data under a test folder and the runner settings a test chooses (the
instant executor, short ack waits). ``StackConsole`` collects every line its
console prints so a test waits on what the operator would read, never on a sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# The child process running the stack: what `trialbus up` does, with test settings.
DRIVER = """
import json, sys
from pathlib import Path
from rich.console import Console
from infra.embedded import free_port
from infra.stack import EmbeddedStack, serve
cfg = json.loads(sys.argv[1])
stack = EmbeddedStack(
    Path(cfg["data_dir"]), n_runners=1, concurrency=4, runner_env=cfg["runner_env"],
    nats_port=free_port(), ledger_port=free_port(), http_port=free_port(),
)
sys.exit(serve(stack, Console(file=sys.stdout, soft_wrap=True, width=400)))
"""


@dataclass
class StackConsole:
    """The stack's process, every line its console printed, and what it wrote."""

    proc: subprocess.Popen[str]
    data_dir: Path
    stack_file: Path
    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    closed: bool = False

    def read_console(self) -> None:
        """Collect the console's lines until the process closes its output."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.closed = True  # the process exited: no more lines will come
            self.changed.notify_all()

    def wait_line(self, text: str, timeout: float, after: int = 0) -> int:
        """Index of the first console line after ``after`` containing ``text``."""
        with self.changed:
            found = self.changed.wait_for(
                lambda: self.closed or any(text in x for x in self.lines[after:]), timeout
            )
            hits = [i for i in range(after, len(self.lines)) if text in self.lines[i]]
            if not found or not hits:
                raise AssertionError(
                    f"console never said {text!r}; it said:\n" + "\n".join(self.lines)
                )
            return hits[0]

    @property
    def stack(self) -> dict[str, Any]:
        """The stack file the running stack wrote (its URLs, pid, credentials folder)."""
        data: dict[str, Any] = json.loads(self.stack_file.read_text())
        return data


@contextlib.contextmanager
def launched[C: StackConsole](
    root: Path, runner_env: Mapping[str, str], kind: type[C], stack_file: Path | None = None
) -> Iterator[C]:
    """Run the stack under ``root`` as `trialbus up` does; Ctrl-C (SIGINT) it at the
    end if still up. ``kind`` is the test's StackConsole subclass; ``stack_file``
    (default ``root/stack.json``) its TRIALBUS_STACK_FILE."""
    stack_file = stack_file or root / "stack.json"
    config = {"data_dir": str(root / "data"), "runner_env": dict(runner_env)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALBUS_")}
    env["TRIALBUS_STACK_FILE"] = str(stack_file)
    argv = [sys.executable, "-u", "-c", DRIVER, json.dumps(config)]
    with watched(argv, ROOT, env, root / "data", stack_file, kind) as handle:
        yield handle


@contextlib.contextmanager
def watched[C: StackConsole](
    argv: list[str],
    cwd: Path,
    env: Mapping[str, str],
    data_dir: Path,
    stack_file: Path,
    kind: type[C],
) -> Iterator[C]:
    """Start a stack's process (``argv`` in ``cwd``), collect its console; Ctrl-C
    (SIGINT) it at the end if still up."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    handle = kind(proc, data_dir, stack_file)
    reader = threading.Thread(target=handle.read_console, daemon=True)
    reader.start()
    try:
        yield handle
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)
