"""Who a ``trialbus submit`` is recorded as (services.submitter.commands.cli_submitter):
the operator's ``TRIALBUS_CLI_TEAM``, recorded as ``submitted_by`` exactly as an API
token's team is, so the queue, status and the dashboard see it; never the manifest.
With real processes: tests/integration/test_cli_team.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.manifest import ExperimentManifest
from services.common.ports import ExperimentInfo
from services.reports.progress import team_of
from services.submitter.api_tokens import Identity, owner_from_record
from services.submitter.commands import cli_submitter
from services.submitter.submit import PreparedExperiment, experiment_submitted, prepare

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "tasks"
MANIFEST = {"name": "cli-team", "tasks": ["hello-file"], "agents": [{"name": "oracle"}]}


def _prepared() -> PreparedExperiment:
    return prepare(ExperimentManifest.model_validate(MANIFEST), TASKS)


def _recorded(prepared: PreparedExperiment, submitted_by: object) -> ExperimentInfo:
    manifest: dict[str, object] = {**MANIFEST, "experiment_id": prepared.experiment_id}
    manifest["submitted_by"] = submitted_by
    return ExperimentInfo(prepared.experiment_id, "cli-team", 1, manifest)


def test_the_cli_team_is_recorded_as_the_submitter() -> None:
    prepared = cli_submitter(_prepared(), None, "red")
    assert (prepared.submitted_by, prepared.team) == ({"team": "red"}, "red")
    # What the importer stores, hence what queue, status and the dashboard read.
    stored = experiment_submitted(prepared, 1).manifest
    assert stored["submitted_by"] == {"team": "red"}
    info = ExperimentInfo(prepared.experiment_id, "cli-team", 1, stored)
    assert team_of(info) == "red"
    # An owner over HTTP as a team-only token's submission is: that team's team-only
    # tokens may change it; a user's token of the team, or another team's, may not.
    owner = owner_from_record(stored["submitted_by"])
    assert Identity(team="red").may_change(owner)
    assert not Identity(user="rita", team="red").may_change(owner)
    assert not Identity(team="blue").may_change(owner)


def test_without_the_variable_nobody_is_recorded() -> None:
    # Negative control: no TRIALBUS_CLI_TEAM, no submitter, no team, no quota.
    prepared = cli_submitter(_prepared(), None, None)
    assert (prepared.submitted_by, prepared.team) == (None, None)
    stored = experiment_submitted(prepared, 1).manifest
    assert "submitted_by" not in stored
    assert team_of(ExperimentInfo(prepared.experiment_id, "cli-team", 1, stored)) is None


def test_a_resubmission_keeps_the_recorded_owner_and_its_team() -> None:
    # As an admin token does: ownership and quotas do not move with whoever resubmits.
    prepared = _prepared()
    info = _recorded(prepared, {"user": "bo", "team": "blue"})
    again = cli_submitter(prepared, info, "red")
    assert (again.submitted_by, again.team) == ({"user": "bo", "team": "blue"}, "blue")
    # An owner with no team keeps having none (its quotas were none).
    alone = cli_submitter(prepared, _recorded(prepared, {"user": "bo"}), "red")
    assert (alone.submitted_by, alone.team) == ({"user": "bo"}, None)


@pytest.mark.parametrize("recorded", [None, {"team": "no spaces allowed"}, {"role": "x"}, "red"])
def test_no_or_a_malformed_record_is_replaced_by_the_cli_team(recorded: object) -> None:
    # A record naming nobody (a forged event) protects nothing: the CLI's team applies.
    prepared = _prepared()
    again = cli_submitter(prepared, _recorded(prepared, recorded), "red")
    assert (again.submitted_by, again.team) == ({"team": "red"}, "red")


def test_the_manifest_cannot_name_its_submitter_or_team() -> None:
    for key, value in (("submitted_by", {"team": "red"}), ("team", "red")):
        with pytest.raises(ValidationError, match=key):
            ExperimentManifest.model_validate({**MANIFEST, key: value})
