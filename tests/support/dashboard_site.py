"""The submitter's app served on a real loopback port, and a browser logged in to it.

The dashboard tests need a real HTTP server (a browser connects to it) with a tokens
file of one user. ``served_api`` runs the app under uvicorn in this event loop for as
long as the block runs; ``logged_in_page`` opens headless chromium, logs in through
the form as a person would, and collects every page error and console error (a CSP
violation is one) for the test to assert on.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn

from infra.managed_process import free_port
from services.common.settings import SubmitterSettings
from services.submitter.api_tokens import token_digest
from services.submitter.app import create_app
from tests.conftest import skip_unless
from tests.support.api_client import submitter_settings

START_S = 20.0
"""Bound on uvicorn's start and stop."""


def chromium_path() -> str:
    """Debian's chromium (``make setup`` installs it); a skip, which fails under CI."""
    path = shutil.which("chromium")
    skip_unless(None if path else "chromium is not installed (`make setup` installs it)")
    assert path is not None
    return path


def one_user_tokens(folder: Path, token: str, identity: str = "user: ada") -> Path:
    """A 0600 tokens file in ``folder`` granting ``token`` to ``identity`` (YAML fields)."""
    tokens = folder / "api-tokens.yaml"
    tokens.write_text(f"tokens:\n  - {{sha256: {token_digest(token)}, {identity}}}\n")
    tokens.chmod(0o600)
    return tokens


def site_settings(
    tmp_path: Path,
    nats_url: str,
    ledger_url: str,
    ledger_db: str,
    prefix: str,
    token: str,
    identity: str = "user: ada",
) -> SubmitterSettings:
    """The submitter's settings on the test's NATS and ledger, ``token`` its one user."""
    tokens = one_user_tokens(tmp_path, token, identity)
    return submitter_settings(nats_url, ledger_url, ledger_db, prefix, api_tokens_file=tokens)


@asynccontextmanager
async def served_api(settings: SubmitterSettings) -> AsyncIterator[str]:
    """The app under uvicorn on a free loopback port while the block runs; its base URL."""
    port = free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    task = asyncio.create_task(srv.serve())
    try:
        async with asyncio.timeout(START_S):
            # uvicorn offers a flag, not an event, for this.
            while not srv.started:
                if task.done():
                    task.result()  # raises what stopped it
                await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        await asyncio.wait_for(task, START_S)


@asynccontextmanager
async def logged_in_page(
    pw: Any, chromium: str, base: str, token: str
) -> AsyncIterator[tuple[Any, list[str]]]:
    """A desktop-sized chromium page logged in to ``base`` with ``token`` (through the
    login form), and the list its page and console errors are appended to."""
    browser = await pw.chromium.launch(
        executable_path=chromium, headless=True, args=["--no-sandbox"]
    )
    try:
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        await page.goto(f"{base}/ui/login")
        await page.fill("#token", token)
        await page.click("button[type=submit]")
        await page.wait_for_url(f"{base}/ui/")
        yield page, errors
    finally:
        await browser.close()
