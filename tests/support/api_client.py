"""The submitter's HTTP API run in-process, and an httpx client of it.

Tests of the API's behaviour need no server process: the app's lifespan runs (NATS
and the ledger connected, as in production) and requests go through ASGI.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from services.common.settings import SubmitterSettings
from services.submitter.app import create_app

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
"""The repository's example tasks (what a manifest's ``tasks: [hello-file]`` names)."""


def submitter_settings(
    nats_url: str, ledger_url: str, ledger_db: str, prefix: str, **options: Any
) -> SubmitterSettings:
    """The submitter's settings on the test's NATS and ledger (JSON logs); ``options``
    are further SubmitterSettings fields."""
    return SubmitterSettings(
        nats_url=nats_url,
        ledger_url=ledger_url,
        ledger_db=ledger_db,
        prefix=prefix,
        log_json=True,
        **options,
    )


@asynccontextmanager
async def api_client(
    nats_url: str, ledger_url: str, ledger_db: str, prefix: str, **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a submitter app on the test's NATS and ledger (JSON logs), for as
    long as the block runs; ``options`` are further SubmitterSettings fields."""
    settings = submitter_settings(nats_url, ledger_url, ledger_db, prefix, **options)
    app: FastAPI = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        # The Host header must be one the API answers (localhost by default).
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            yield c


def examples_api(
    nats_url: str, ledger_url: str, ledger_db: str, prefix: str, *, check_runners: bool
) -> AbstractAsyncContextManager[httpx.AsyncClient]:
    """:func:`api_client` as on a developer's loopback: no authentication, task paths
    inside ``EXAMPLE_TASKS``; ``check_runners``: whether a submission needs a live
    runner that can take it."""
    return api_client(
        nats_url,
        ledger_url,
        ledger_db,
        prefix,
        api_no_auth=True,
        tasks_root=EXAMPLE_TASKS,
        check_runners=check_runners,
    )


async def submit_example(
    nats_url: str, ledger_url: str, ledger_db: str, prefix: str, manifest: str
) -> str:
    """Submit the YAML ``manifest`` (example tasks) over the HTTP API in-process; its
    experiment id. A refusal fails the test with the API's answer."""
    # No runner check: the test's runner may not be live yet; it checks again anyway.
    async with examples_api(nats_url, ledger_url, ledger_db, prefix, check_runners=False) as c:
        answer = await c.post(
            "/experiments", content=manifest, headers={"Content-Type": "application/yaml"}
        )
    assert answer.status_code == 202, answer.text
    experiment_id: str = answer.json()["experiment_id"]
    return experiment_id
