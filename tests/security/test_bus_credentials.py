"""The bus's generated files and lists, checked without a server.

File modes, regeneration, refusing unsafe credentials, the work boundary in the lists,
and the provisioned durables agreeing with the apps. test_bus_permissions.py proves the
lists against a real nats-server.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from infra.nats_auth import CredentialsError, connect_as, load_credentials, write_auth
from infra.nats_permissions import ROLES, role_permissions
from schemas.subjects import Topology

TOPO = Topology("trialbus")


async def test_credentials_never_travel_in_urls(tmp_path: Path) -> None:
    files = write_auth(tmp_path / "auth", TOPO)
    cred = load_credentials(files.credentials["runner"])
    # Refused before any connection is tried: no server is needed to prove it.
    with pytest.raises(CredentialsError, match="user info"):
        await connect_as(["nats://u:p@127.0.0.1:1"], cred, name="x")
    assert cred.password not in repr(cred)


def test_files_are_private_and_credentials_survive_regeneration(tmp_path: Path) -> None:
    files = write_auth(tmp_path / "auth", TOPO)
    assert stat.S_IMODE(os.stat(files.folder).st_mode) == 0o700
    for path in (files.server_config, *files.credentials.values()):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    before = {r: load_credentials(p).password for r, p in files.credentials.items()}
    again = write_auth(tmp_path / "auth", TOPO)
    assert {r: load_credentials(p).password for r, p in again.credentials.items()} == before
    rotated = write_auth(tmp_path / "auth", TOPO, rotate=True)
    after = {r: load_credentials(p).password for r, p in rotated.credentials.items()}
    assert all(after[r] != before[r] for r in ROLES)
    # Another role's file is refused (a service handed the wrong one)...
    with pytest.raises(CredentialsError, match="expected 'submitter'"):
        load_credentials(files.credentials["runner"], role="submitter")
    assert load_credentials(files.credentials["runner"], role="runner").role == "runner"
    # ...and so is a credentials file others can read, naming the fix.
    os.chmod(files.credentials["runner"], 0o644)
    with pytest.raises(CredentialsError, match="chmod 600"):
        load_credentials(files.credentials["runner"])


def test_permission_lists_are_exact_for_the_work_boundary() -> None:
    """The lists a reviewer reads: who may publish work and who may consume it."""
    work_publishers = [r for r in ROLES if TOPO.work_wildcard in role_permissions(TOPO, r).publish]
    assert work_publishers == ["submitter"]
    next_work = f"$JS.API.CONSUMER.MSG.NEXT.{TOPO.work_stream}.{TOPO.runner_durable}"
    assert [r for r in ROLES if next_work in role_permissions(TOPO, r).publish] == ["runner"]
    for role in ROLES:
        subs = role_permissions(TOPO, role).subscribe
        assert "_INBOX.>" not in subs and ">" not in subs, role


def test_provisioned_event_durables_match_the_apps() -> None:
    """FastStream binds to the admin's durable without updating it, so the admin's
    ack_wait is the one in force: it must be the apps' own."""
    from infra.nats_provision import EVENTS_ACK_WAIT_S, events_durable_configs
    from services.importer.app import ACK_WAIT_S as IMPORTER_ACK_WAIT_S
    from services.importer.handlers import importer_filters
    from services.watcher.app import ACK_WAIT_S as WATCHER_ACK_WAIT_S

    assert EVENTS_ACK_WAIT_S == IMPORTER_ACK_WAIT_S == WATCHER_ACK_WAIT_S
    names = [c.durable_name for c in events_durable_configs(TOPO)]
    assert names == [TOPO.importer_durable, TOPO.watcher_durable]
    importer, watcher = events_durable_configs(TOPO)
    assert importer.filter_subjects == importer_filters(TOPO)
    assert watcher.filter_subject == TOPO.event_filter()
