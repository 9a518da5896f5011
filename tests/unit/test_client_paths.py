"""How the HTTP API names its tasks root in an answer (services.submitter.routes):
``<tasks root>``, as the client wrote its paths, never the root's place on the host;
on every route that resolves task folders (a submission, a retry of one trial or of
every unscored one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.errors import ExperimentNotFound
from services.submitter.resolve import TaskFolders
from services.submitter.routes import as_client_sees, client_paths

ROOT = Path("/srv/tasks")
FOLDERS = TaskFolders(ROOT, ROOT)


def test_the_root_is_named_as_the_client_sees_it_and_nothing_else() -> None:
    assert as_client_sees("task folder /srv/tasks/a does not exist", FOLDERS) == (
        "task folder <tasks root>/a does not exist"
    )
    assert as_client_sees("read from /srv/tasks: missing", FOLDERS) == (
        "read from <tasks root>: missing"
    )
    # The control: a sibling whose name starts with the root's is left as it is.
    assert as_client_sees("resolves to /srv/tasks-old/a", FOLDERS) == "resolves to /srv/tasks-old/a"


def test_an_error_raised_inside_keeps_its_kind_and_loses_the_host_path() -> None:
    with pytest.raises(ExperimentNotFound) as raised, client_paths(FOLDERS):
        raise ExperimentNotFound("task 'x': the manifest's task folders, read from /srv/tasks")
    assert str(raised.value) == "task 'x': the manifest's task folders, read from <tasks root>"
    # Another kind of error is not the client's input: left alone.
    with pytest.raises(OSError, match="/srv/tasks"), client_paths(FOLDERS):
        raise OSError("disk error under /srv/tasks")
