"""Run a trial script of tests/support as its own process, with secrets in its
environment as a runner has them (its API keys, and a ledger URL with a password).

The Harbor redaction tests (tests/integration/test_live_logs_harbor.py,
tests/integration/test_redaction_harbor.py) start their script this way and then look
for these values where they must not be.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from tests.support.live_log_trial import ROOT

SECRETS = {
    "OPENAI_API_KEY": "sk-proj-live-0123456789abcdefghij",
    "MYLLM_CRED": "cred-9876543210zyxwvutsrq",
}
"""The variables the agent's ``api_key_env`` names (tests.support.leak_agent.SHOWN)."""
LEDGER_PASSWORD = "ledger-pw-abcdefghij0123"
"""The password in the process's LEDGER_URL, which the runner must also keep secret."""


async def run_with_secrets(
    module: str, nats_url: str, prefix: str, work: Path, *, timeout_s: float
) -> None:
    """``python -m MODULE NATS_URL PREFIX WORK`` from the checkout, with SECRETS and a
    LEDGER_URL holding LEDGER_PASSWORD added to this environment; the test fails, with
    the end of the script's output, unless it exits 0 within ``timeout_s``."""
    env = {
        **os.environ,
        **SECRETS,
        "LEDGER_URL": f"mongodb://runner:{LEDGER_PASSWORD}@127.0.0.1:1/trialbus",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        nats_url,
        prefix,
        str(work),
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    assert proc.returncode == 0, out.decode()[-3000:]
