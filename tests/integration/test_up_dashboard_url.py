"""``trialbus up`` prints the dashboard's URL, and the URL it prints opens the dashboard.

The stack runs in a child process exactly as ``trialbus up`` runs it (tests/support/
stack_console.py); the test reads the console as a person would, then opens the URL
with the operator's token (the page lists experiments) and without it (the control:
sent to the login page, not shown the list).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.support.stack_console import StackConsole, launched

pytestmark = pytest.mark.integration

URL = re.compile(r"dashboard: (http://127\.0\.0\.1:\d+/ui/) \(log in with the token in (\S+)\)")


def test_up_prints_a_dashboard_url_that_opens(tmp_path: Path) -> None:
    with launched(tmp_path, {}, StackConsole) as handle:
        up = handle.wait_line("trialbus is up", timeout=180)
        at = handle.wait_line("dashboard: ", timeout=30, after=up)
        found = URL.search(handle.lines[at])
        assert found, handle.lines[at]
        url, token_file = found.group(1), Path(found.group(2))
        token = token_file.read_text().strip()

        page = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        anonymous = httpx.get(url, timeout=30)

    assert page.status_code == 200, page.text[:500]
    assert "<title>Experiments" in page.text
    assert anonymous.status_code in (302, 303, 307)
    assert anonymous.headers["location"].endswith("/ui/login")
