"""The real ``trialbus`` command, pointed at one test stack.

End-to-end tests drive trialbus the way a user does: through the installed console
script, with the stack's URLs and names in the environment. The command is found next
to the running interpreter, so the tests work from any clone location.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.embedded_stack import stack_env

ROOT = Path(__file__).resolve().parents[2]
TRIALBUS = Path(sys.executable).with_name("trialbus")


@dataclass(frozen=True)
class Cli:
    """``trialbus`` with the environment of one stack (URLs, prefix, database)."""

    nats_url: str
    ledger_url: str
    prefix: str
    ledger_db: str
    stack_file: Path
    extra_env: tuple[tuple[str, str], ...] = ()

    @property
    def env(self) -> dict[str, str]:
        """The caller's environment minus its TRIALBUS_* settings, plus this stack's."""
        env = stack_env(self.nats_url, self.ledger_url, self.prefix, self.ledger_db)
        # Never pick up a developer's running `trialbus up`.
        env["TRIALBUS_STACK_FILE"] = str(self.stack_file)
        env.update(dict(self.extra_env))
        return env

    def argv(self, *args: str) -> list[str]:
        """The command line for ``trialbus ARGS``."""
        if not TRIALBUS.is_file():
            raise AssertionError(f"{TRIALBUS} is missing: install the project (make setup)")
        return [str(TRIALBUS), *args]

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``trialbus ARGS`` to completion (blocking)."""
        return subprocess.run(
            self.argv(*args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )

    def json(self, *args: str, timeout: float = 300, exit_code: int = 0) -> Any:
        """``trialbus ARGS --json``: assert the exit code, return the parsed output."""
        proc = self.run(*args, "--json", timeout=timeout)
        assert proc.returncode == exit_code, proc.stderr[-3000:]
        return json.loads(proc.stdout)

    async def arun(self, *args: str, limit_s: float = 300) -> tuple[int | None, bytes, bytes]:
        """``trialbus ARGS`` without blocking the event loop: (exit code, stdout, stderr)."""
        proc = await asyncio.create_subprocess_exec(
            *self.argv(*args),
            env=self.env,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), limit_s)
        return proc.returncode, stdout, stderr

    async def ajson(self, *args: str, limit_s: float = 300, exit_code: int = 0) -> Any:
        """:meth:`json` without blocking the event loop (event taps keep reading)."""
        returncode, stdout, stderr = await self.arun(*args, "--json", limit_s=limit_s)
        assert returncode == exit_code, stderr.decode()[-3000:]
        return json.loads(stdout)


def run_module(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m services ARGS`` with ``env``, to completion (blocking).

    The CLI through this interpreter rather than the console script: for tests that
    set up their own environment rather than a :class:`Cli` of one stack.
    """
    return subprocess.run(
        [sys.executable, "-m", "services", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
