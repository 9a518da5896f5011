"""A manifest whose events would be too large is refused at submit, before any publish.

Consumers terminate an event over MAX_EVENT_BYTES as poison (schemas.events), so a
large agent kwargs value would otherwise make its trials vanish. Through the HTTP API
(in-process, its lifespan connected to the session's nats-server): a 600 KB kwargs
value is a 422 naming ``agents[0].kwargs`` and the limit, and neither stream holds a
message; the control, the same manifest just under the limit, is published and every
event it published is one a consumer accepts.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.aio.client import Client as NatsClient

from schemas.events import MAX_EVENT_BYTES, parse_event
from schemas.manifest import ExperimentManifest
from services.common.errors import ManifestError
from services.submitter.submit import prepare
from tests.e2e.cli import run_module
from tests.e2e.events import stream_payloads
from tests.support.api_client import EXAMPLE_TASKS
from tests.support.servers import Servers

pytestmark = pytest.mark.integration


def _manifest(prompt_chars: int) -> dict[str, Any]:
    return {
        "name": "event-size",
        "tasks": ["hello-file"],
        "agents": [{"name": "nop", "kwargs": {"prompt": "x" * prompt_chars}}],
    }


def _refused_size(prompt_chars: int) -> int | None:
    """The size of the event the submit check refuses for this prompt (None: passes)."""
    manifest = ExperimentManifest.model_validate(_manifest(prompt_chars))
    try:
        prepare(manifest, EXAMPLE_TASKS, EXAMPLE_TASKS)  # measures (check_event_sizes)
    except ManifestError as exc:  # its message gives the event's size
        return int(str(exc).split(" bytes, over")[0].rsplit(" ", 1)[1])
    return None


def _just_under() -> int:
    """The longest prompt (within 64 bytes) whose events all fit."""
    chars = 600 * 1024
    while (size := _refused_size(chars)) is not None:
        chars -= size - MAX_EVENT_BYTES + 64  # 64: ids' digits may vary
    return chars


async def test_an_oversized_kwargs_value_is_refused_naming_it_and_nothing_is_published(
    servers: Servers, nc: NatsClient
) -> None:
    js, topology = nc.jetstream(), servers.topology
    async with servers.examples_api(check_runners=False) as api:
        refused = await api.post("/experiments", json=_manifest(600 * 1024))
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert "agents[0].kwargs.prompt" in error, error
        assert f"{MAX_EVENT_BYTES}-byte limit" in error, error
        assert await stream_payloads(js, topology.work_stream) == []
        assert await stream_payloads(js, topology.events_stream) == []

        # Control: just under the limit, the same manifest is published, and a
        # consumer accepts each of its events (parse_event enforces the limit).
        accepted = await api.post("/experiments", json=_manifest(_just_under()))
        assert accepted.status_code == 202, accepted.text
        work = await stream_payloads(js, topology.work_stream)
        events = await stream_payloads(js, topology.events_stream)
        assert len(work) == 1 and len(events) == 1
        for payload in (*work, *events):
            assert MAX_EVENT_BYTES - 1024 < len(payload) <= MAX_EVENT_BYTES, len(payload)
            parse_event(payload)


def test_the_cli_refuses_it_with_exit_2_naming_the_file_and_the_field(
    servers: Servers, tmp_path: Path
) -> None:
    shutil.copytree(EXAMPLE_TASKS / "hello-file", tmp_path / "hello-file")
    manifest = tmp_path / "big.yaml"
    manifest.write_text(yaml.safe_dump(_manifest(600 * 1024)))
    env = {**servers.env(), "TRIALBUS_CHECK_RUNNERS": "false"}
    done = run_module(env, "submit", str(manifest))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{manifest}: agents[0].kwargs.prompt" in done.stderr, done.stderr
    assert f"{MAX_EVENT_BYTES}-byte limit" in done.stderr, done.stderr
    # Control: the same manifest with a short prompt is published.
    manifest.write_text(yaml.safe_dump(_manifest(1024)))
    fits = run_module(env, "submit", str(manifest))
    assert fits.returncode == 0, fits.stdout + fits.stderr
