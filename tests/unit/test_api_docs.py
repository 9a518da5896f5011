"""The committed API documents (docs/openapi.json, docs/asyncapi.json) are what the code
generates, and the AsyncAPI document carries every event on its channel."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schemas.events import EVENT_TYPES
from services import api_docs
from services.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return api_docs.generate()


def test_committed_documents_are_current(generated: dict[str, str]) -> None:
    assert api_docs.stale_documents(ROOT, generated) == [], "run `make api-docs` and commit"


def test_a_changed_or_missing_document_is_stale(generated: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    for rel in generated:
        shutil.copy(ROOT / rel, tmp_path / rel)
    assert api_docs.stale_documents(tmp_path, generated) == []
    edited = tmp_path / api_docs.DOCS["asyncapi"]
    edited.write_text(edited.read_text().replace("TrialFailed", "TrialFailure", 1))
    (tmp_path / api_docs.DOCS["openapi"]).unlink()
    assert sorted(api_docs.stale_documents(tmp_path, generated)) == sorted(generated)


def test_cli_check_exits_1_when_stale_and_writes_when_asked(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    runner = CliRunner()
    stale = runner.invoke(app, ["api-docs", "--check", "--root", str(tmp_path)])
    assert stale.exit_code == 1
    assert "stale: docs/openapi.json" in stale.output
    wrote = runner.invoke(app, ["api-docs", "--root", str(tmp_path)])
    assert wrote.exit_code == 0, wrote.output
    fresh = runner.invoke(app, ["api-docs", "--check", "--root", str(tmp_path)])
    assert fresh.exit_code == 0, fresh.output


def test_every_event_is_a_message_on_its_channel_with_publishers_and_receivers(
    generated: dict[str, str],
) -> None:
    doc = json.loads(generated[api_docs.DOCS["asyncapi"]])
    models = {m.__name__: api_docs._event_type(m) for m in api_docs.event_models()}
    assert sorted(models.values()) == sorted(EVENT_TYPES)
    assert sorted(doc["channels"]) == sorted(EVENT_TYPES)
    for name, etype in models.items():
        channel = doc["channels"][etype]
        assert list(channel["messages"]) == [name]
        payload = doc["components"]["messages"][name]["payload"]
        assert payload == {"$ref": f"#/components/schemas/{name}"}
        schema = doc["components"]["schemas"][name]
        assert schema["properties"]["type"]["const"] == etype
        actions = {
            op["action"]
            for op in doc["operations"].values()
            if op["channel"]["$ref"] == f"#/channels/{etype}"
        }
        assert actions == {"send", "receive"}, etype
    addresses = {t: c["address"] for t, c in doc["channels"].items()}
    assert addresses["trial_requested"] == "trialbus.work.{pool}.{experiment_id}"
    assert addresses["trial_log"] == "trialbus.logs.{experiment_id}.{trial_id}"
    assert addresses["trial_completed"] == "trialbus.events.trial_completed.{experiment_id}"
    ops = doc["operations"]
    # From the FastStream apps' own declarations and the runner's pool filter:
    assert "importer.receive.trial_completed" in ops
    assert "watcher.receive.trial_failed" in ops
    assert "runner.receive.trial_requested" in ops
    # Control: nobody's events filter catches work or log subjects.
    assert "importer.receive.trial_requested" not in ops
    assert "watcher.receive.trial_log" not in ops
    assert "runner.receive.trial_completed" not in ops


def test_subject_matching_follows_nats_wildcards() -> None:
    match = api_docs._subject_matches
    assert match("a.*.*", "a.b.c") and match("a.>", "a.b.c") and match("a.b", "a.b")
    assert not match("a.*.*", "a.b") and not match("a.*", "a.b.c") and not match("a.>", "a")
    assert not match("a.events.*.*", "a.work.b.c")


def test_openapi_lists_the_api_not_the_dashboard_and_guards_it(generated: dict[str, str]) -> None:
    doc = json.loads(generated[api_docs.DOCS["openapi"]])
    paths = doc["paths"]
    assert "/experiments" in paths and "/experiments/{experiment_id}/leaderboard" in paths
    assert not [p for p in paths if p.startswith("/ui")]
    assert paths["/experiments"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in paths["/healthz"]["get"]
