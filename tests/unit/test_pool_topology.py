"""Names and rights of runner pools: subjects, durables, users, inboxes, registry keys.

What the real nats-server makes of these is proven in tests/security/test_bus_permissions.py
and tests/integration/test_leaf_pool.py; here, the names themselves.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.nats_auth import load_credentials, write_auth
from infra.nats_permissions import inbox_prefix, principal, role_permissions, user_name
from schemas.runners import registry_key
from schemas.subjects import DEFAULT_POOL, Topology

T = Topology("tb")


def test_work_is_routed_per_pool_and_the_default_keeps_its_names() -> None:
    assert T.work_subject("exp1") == "tb.work.default.exp1"
    assert T.work_subject("exp1", "gpu") == "tb.work.gpu.exp1"
    assert T.work_pool_filter("gpu") == "tb.work.gpu.>"
    assert T.work_wildcard == "tb.work.>"  # the stream still holds every pool
    assert T.runner_durable_for(DEFAULT_POOL) == T.runner_durable == "tb-runners"
    assert T.runner_durable_for("gpu") == "tb-runners-gpu"
    # Pools' filters never overlap (a work-queue stream refuses overlapping durables).
    assert not T.work_pool_filter("gpu").startswith(T.work_pool_filter("default")[:-1])


@pytest.mark.parametrize("bad", ["GPU", "a.b", "*", ">", "", "-x", "a" * 33])
def test_a_pool_name_that_is_no_subject_token_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="pool"):
        T.work_subject("exp1", bad)
    with pytest.raises(ValueError, match="pool"):
        registry_key(bad, "r1")


def test_a_pool_runner_has_its_own_user_inbox_durable_and_keys() -> None:
    assert principal("runner", "gpu") == "runner-gpu"
    assert user_name(T, "runner", "gpu") == "tb-runner-gpu"
    assert inbox_prefix(T, "runner", "gpu") == "_INBOX.tb.runner-gpu"
    default, gpu = role_permissions(T, "runner"), role_permissions(T, "runner", "gpu")
    next_gpu = f"$JS.API.CONSUMER.MSG.NEXT.{T.work_stream}.tb-runners-gpu"
    next_default = f"$JS.API.CONSUMER.MSG.NEXT.{T.work_stream}.tb-runners"
    assert next_gpu in gpu.publish and next_default not in gpu.publish
    assert next_default in default.publish and next_gpu not in default.publish
    assert f"$KV.{T.runners_bucket}.gpu.>" in gpu.publish
    assert f"$KV.{T.runners_bucket}.default.>" in default.publish
    # The default runner's inbox wildcard does not cover the gpu runners' replies.
    assert default.subscribe == ("_INBOX.tb.runner.>",)
    assert gpu.subscribe == ("_INBOX.tb.runner-gpu.>",)
    with pytest.raises(ValueError, match="only runners belong to a pool"):
        role_permissions(T, "submitter", "gpu")


def test_a_jetstream_domain_adds_the_domain_form_of_each_api_right() -> None:
    plain = role_permissions(T, "runner", "gpu")
    leaf = role_permissions(T, "runner", "gpu", js_domain="hub")
    api = [p for p in plain.publish if p.startswith("$JS.API.")]
    assert api and all(p in leaf.publish for p in plain.publish)
    assert {p for p in leaf.publish if p.startswith("$JS.hub.API.")} == {
        p.replace("$JS.API.", "$JS.hub.API.") for p in api
    }
    with pytest.raises(ValueError, match="JetStream domain"):
        role_permissions(T, "runner", js_domain="a.b")


def test_write_auth_adds_a_runner_user_per_pool(tmp_path: Path) -> None:
    files = write_auth(tmp_path / "auth", T, pools=["gpu", DEFAULT_POOL, "gpu"])
    assert sorted(files.credentials) == sorted(
        ["admin", "submitter", "runner", "importer", "watcher", "subscriber", "runner-gpu"]
    )
    cred = load_credentials(files.credentials["runner-gpu"], "runner")
    assert (cred.user, cred.inbox_prefix) == ("tb-runner-gpu", "_INBOX.tb.runner-gpu")
    config = files.server_config.read_text()
    assert config.count('"tb-runner-gpu"') == 1
    assert "tb-runners-gpu" in config
