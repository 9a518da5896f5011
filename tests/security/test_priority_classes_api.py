"""Who may submit in which priority class (docs/scheduling.md), over the HTTP API.

The submitter app runs in process (its lifespan connects to the session's nats-server
and ledger) with a tokens file: a token without ``priority_classes`` may use the
default class and lower ones, never ``urgent``; a token that lists ``urgent`` may; an
admin may use every class. A refusal is a 403 naming the class, and nothing is
published; each refusal has its negative control (the same manifest accepted from the
token that may), and an accepted experiment's trials are on their class's subject.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nats
import pytest

from schemas.subjects import Topology
from services.common.priority import PriorityClasses
from services.submitter.api_tokens import (
    ApiConfigError,
    Identity,
    issue_token,
    load_token_table,
)
from tests.security.http_api_support import api_as_users, random_tokens, write_tokens_file
from tests.support.servers import Servers

pytestmark = pytest.mark.integration

TOKENS = random_tokens(
    alice={"user": "alice"},
    release={"team": "release", "priority_classes": ["urgent"]},
    ops={"user": "ops", "admin": True},
)


def manifest(name: str, priority_class: str | None) -> dict[str, Any]:
    compute: dict[str, Any] = {"environment": "local"}
    if priority_class is not None:
        compute["priority_class"] = priority_class
    return {
        "name": name,
        "tasks": ["hello-file"],
        "agents": [{"name": "oracle"}],
        "compute": compute,
    }


async def work_subjects(nats_url: str, topology: Topology) -> dict[str, int]:
    """Messages per subject in the work stream."""
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().stream_info(
            topology.work_stream, subjects_filter=topology.work_wildcard
        )
        return dict(info.state.subjects or {})
    finally:
        await nc.close()


def test_who_may_use_which_class(tmp_path: Path) -> None:
    classes = PriorityClasses.parse("urgent=8,normal=3,batch=1")
    table = load_token_table(write_tokens_file(tmp_path / "tokens.yaml", TOKENS))
    alice, release, ops = (table.identify(TOKENS[n][0]) for n in ("alice", "release", "ops"))
    assert alice == Identity(user="alice")
    assert release == Identity(team="release", priority_classes=("urgent",))
    assert alice is not None and release is not None and ops is not None
    assert [c for c in classes.names if alice.may_use(c, classes)] == ["normal", "batch"]
    assert [c for c in classes.names if release.may_use(c, classes)] == ["urgent"]
    assert [c for c in classes.names if ops.may_use(c, classes)] == list(classes.names)
    assert not alice.may_use("vip", classes)
    # `trialbus api-token --priority-class` writes the same entry; a bad name is refused.
    issued = issue_token(tmp_path / "issued.yaml", team="ci", priority_classes=["urgent"])
    ci = load_token_table(tmp_path / "issued.yaml").identify(issued)
    assert ci == Identity(team="ci", priority_classes=("urgent",))
    with pytest.raises(ApiConfigError, match=r"priority_classes\[0\]"):
        issue_token(tmp_path / "issued.yaml", team="ci", priority_classes=["URGENT"])


async def test_a_token_submits_only_in_the_classes_it_may_use(
    servers: Servers, nats_url: str, topology: Topology
) -> None:
    async with api_as_users(servers, TOKENS) as (api, as_):
        body = manifest("u1", "urgent")
        refused = await api.post("/experiments", json=body, headers=as_("alice"))
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert "compute.priority_class" in error and "'urgent'" in error and "alice" in error
        assert await work_subjects(nats_url, topology) == {}  # nothing published

        unknown = await api.post("/experiments", json=manifest("u2", "vip"), headers=as_("ops"))
        assert unknown.status_code == 422, unknown.text
        assert "compute.priority_class" in unknown.json()["error"]
        assert "'vip'" in unknown.json()["error"]
        assert await work_subjects(nats_url, topology) == {}

        # Negative controls: the same urgent manifest from a token that lists urgent,
        # and from an admin; alice's batch and unclassed manifests.
        accepted = {}
        for name, cls, who in (
            ("u1", "urgent", "release"),
            ("u3", "urgent", "ops"),
            ("b1", "batch", "alice"),
            ("n1", None, "alice"),
        ):
            answer = await api.post("/experiments", json=manifest(name, cls), headers=as_(who))
            assert answer.status_code == 202, answer.text
            accepted[answer.json()["experiment_id"]] = cls
        expected = {topology.work_subject(exp, "default", cls): 1 for exp, cls in accepted.items()}
        assert await work_subjects(nats_url, topology) == expected
