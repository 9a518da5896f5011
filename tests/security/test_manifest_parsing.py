"""Manifest parsing is bounded in time and memory, whatever the YAML text does.

Each parse runs in a child process under an address-space limit and a wall-clock
timeout, so a regression fails the test instead of hanging or swapping the machine.
The child calls ``parse_manifest_text`` (what the HTTP API calls) or
``load_manifest`` (what ``trialbus submit`` calls).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "bad_inputs" / "manifests"
LIMIT_S = 10.0
MEMORY_LIMIT = 768 * 1024 * 1024

_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    from services.common.errors import ManifestError
    from services.submitter.manifest_io import load_manifest, parse_manifest_text
    from pathlib import Path
    started = time.monotonic()
    try:
        if sys.argv[1] == "text":
            parse_manifest_text(Path(sys.argv[2]).read_text(), "api-body")
        else:
            load_manifest(Path(sys.argv[2]))
        outcome = ("accepted", "")
    except ManifestError as exc:
        outcome = ("refused", str(exc))
    except MemoryError:
        outcome = ("memory", "")
    print(json.dumps([*outcome, time.monotonic() - started]))
    """
)


def _parse(mode: str, path: Path, timeout_s: float = LIMIT_S) -> tuple[str, str, float]:
    """(outcome, message, seconds) of parsing ``path`` in a bounded child process."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD.format(limit=MEMORY_LIMIT), mode, str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return "timeout", "", time.monotonic() - started
    if done.returncode != 0 or not done.stdout.strip():
        return "crashed", done.stderr[-2000:], time.monotonic() - started
    outcome, message, seconds = json.loads(done.stdout.strip().splitlines()[-1])
    return str(outcome), str(message), float(seconds)


@pytest.mark.parametrize("mode", ["text", "file"])
def test_merge_key_bomb_is_refused_at_once_naming_the_line(mode: str) -> None:
    # 743 bytes; before the fix six levels took 10 s and 200 MB, each level x10 more.
    outcome, message, seconds = _parse(mode, CORPUS / "merge-key-bomb.yaml")
    assert outcome == "refused", (outcome, message)
    assert "line 8: YAML merge keys ('<<') are not allowed" in message
    assert seconds < 1.0, seconds


def test_plain_aliases_stay_allowed(tmp_path: Path) -> None:
    # Negative control: the refusal is about merge keys, not anchors and aliases.
    manifest = tmp_path / "aliases.yaml"
    manifest.write_text(
        "name: aliases\ntasks: [examples/tasks/hello-file]\n"
        "agents:\n  - name: oracle\n    kwargs: {a: &x {k: 1}, b: *x}\n"
    )
    outcome, message, _ = _parse("text", manifest)
    assert outcome == "accepted", message


def test_node_budget_bounds_a_flat_manifest(tmp_path: Path) -> None:
    # Under the byte limit yet 500,000 nodes: refused once the budget is spent, so the
    # parse costs what 100,000 nodes cost (seconds), not what the text holds.
    manifest = tmp_path / "flat.yaml"
    manifest.write_text("name: flat\nx: [" + ",".join(["1"] * 500_000) + "]\n")
    outcome, message, _ = _parse("text", manifest, timeout_s=4 * LIMIT_S)
    assert outcome == "refused" and "more than 100000 YAML nodes" in message, (outcome, message)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "manifest.yaml"
    os.mkfifo(fifo)
    outcome, message, _ = _parse("file", fifo)
    assert outcome == "refused" and "not a regular file" in message, (outcome, message)


def test_an_endless_file_is_read_only_up_to_the_limit() -> None:
    # /dev/zero never ends: the reader must stop at the byte limit, not at EOF.
    outcome, message, _ = _parse("file", Path("/dev/zero"))
    assert outcome == "refused" and "not a regular file" in message, (outcome, message)
