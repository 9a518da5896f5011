"""The trial page's phase timeline (bars where Harbor says the phases ran, read back
from the SVG) and the stored folder's reading (a real packed trial archive): listing,
one file, what is refused, and the download names."""

from __future__ import annotations

import gzip
import io
import re
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from schemas.record import PhaseTiming
from services.common.archive import TRIAL_MANIFEST, pack_trial
from services.importer.records import RecordContext, build_record
from services.submitter import dashboard_trial as dt
from tests.harbor_fixtures import HarborTrials

T0 = datetime(2026, 11, 26, 7, 0, tzinfo=UTC)


def _timing(**offsets: float) -> PhaseTiming:
    return PhaseTiming(
        started_at=T0,
        total_s=100.0,
        environment_setup_s=10.0,
        agent_setup_s=5.0,
        agent_execution_s=60.0,
        verifier_s=20.0,
        phase_offsets_s=offsets,
    )


def _rects(svg: str) -> dict[str, tuple[float, float]]:
    """Each phase's bar as (x, width), read back from the SVG."""
    found = re.findall(
        r'<g class="phase ([a-z_]+)">.*?<rect x="([\d.]+)" y="\d+" width="([\d.]+)"', svg
    )
    return {key: (float(x), float(w)) for key, x, w in found}


def test_bars_start_where_harbor_says_and_scale_with_their_duration() -> None:
    offsets = {"environment_setup": 1.0, "agent_setup": 12.0, "agent_execution": 18.0}
    view = dt.timeline(_timing(verifier=79.0, **offsets))
    assert view is not None and view["approximate"] is False
    bars = _rects(str(view["svg"]))
    assert list(bars) == ["environment_setup", "agent_setup", "agent_execution", "verifier"]
    scale = (dt.WIDTH - dt._LABEL_W - 10) / 100.0  # the span is total_s
    for key, start, seconds in (
        ("environment_setup", 1.0, 10.0),
        ("agent_execution", 18.0, 60.0),
        ("verifier", 79.0, 20.0),
    ):
        x, w = bars[key]
        assert x == pytest.approx(dt._LABEL_W + start * scale, abs=0.1)
        assert w == pytest.approx(seconds * scale, abs=0.1)
    rows = {r["key"]: r for r in view["rows"]}  # type: ignore[attr-defined]
    assert (rows["verifier"]["start"], rows["verifier"]["seconds"]) == ("+79.0 s", "20.0 s")
    assert rows["agent_execution"]["share"] == "60%"
    # Control: another start moves that bar, and only it.
    moved = _rects(str(dt.timeline(_timing(verifier=78.0, **offsets))["svg"]))  # type: ignore[index]
    assert moved["verifier"][0] < bars["verifier"][0]
    assert moved["agent_execution"] == bars["agent_execution"]


def test_a_record_with_durations_only_is_drawn_back_to_back_and_says_so() -> None:
    view = dt.timeline(_timing())
    assert view is not None and view["approximate"] is True
    bars = _rects(str(view["svg"]))
    scale = (dt.WIDTH - dt._LABEL_W - 10) / 100.0
    assert bars["agent_setup"][0] == pytest.approx(dt._LABEL_W + 10.0 * scale, abs=0.1)
    assert bars["verifier"][0] == pytest.approx(dt._LABEL_W + 75.0 * scale, abs=0.1)


def test_no_phase_no_timeline_and_a_skipped_phase_has_no_bar() -> None:
    assert dt.timeline(PhaseTiming(started_at=T0)) is None
    partial = PhaseTiming(started_at=T0, total_s=30.0, environment_setup_s=30.0)
    view = dt.timeline(partial)
    assert view is not None and list(_rects(str(view["svg"]))) == ["environment_setup"]


def test_the_svg_escapes_nothing_it_should_not_and_names_each_bar() -> None:
    svg = str(dt.timeline(_timing())["svg"])  # type: ignore[index]
    assert "<title>agent run: 1m 00s (60.0 s), from +15.0 s</title>" in svg
    # Under a minute, the seconds alone: "10s (10.0 s)" would say them twice.
    assert "<title>environment setup: 10.0 s, from +0.0 s</title>" in svg
    assert 'role="img"' in svg and "style=" not in svg  # the CSP allows no inline style


def test_the_importer_records_each_phase_start(harbor_trials: HarborTrials) -> None:
    record = build_record(
        harbor_trials["oracle"], RecordContext(experiment_id="e", trial_id="t", source="import")
    )
    t = record.timing
    offsets = t.phase_offsets_s
    assert list(offsets) == ["environment_setup", "agent_setup", "agent_execution", "verifier"]
    starts = list(offsets.values())
    assert starts == sorted(starts) and starts[0] >= 0
    assert t.total_s is not None and offsets["verifier"] + (t.verifier_s or 0) <= t.total_s + 0.01
    view = dt.timeline(t)
    assert view is not None and view["approximate"] is False


@pytest.fixture
def archive(tmp_path: Path) -> bytes:
    folder = tmp_path / "trial"
    (folder / "agent").mkdir(parents=True)
    (folder / "result.json").write_text('{"reward": 1}')
    (folder / "agent" / "trajectory.json").write_text("[1, 2, 3]")
    (folder / "page.html").write_text("<script>alert(1)</script>")
    return pack_trial(folder).data


def test_the_archive_lists_its_regular_files_and_serves_one(archive: bytes) -> None:
    files, more = dt.archive_files(archive)
    paths = {f.path: f.size for f in files}
    assert not more
    assert {"result.json", "agent/trajectory.json", "page.html", TRIAL_MANIFEST} <= set(paths)
    assert "agent" not in paths  # folders are not files
    assert paths["agent/trajectory.json"] == len("[1, 2, 3]")
    assert dt.archive_member(archive, "agent/trajectory.json") == b"[1, 2, 3]"
    # Controls: a name not in the archive, a path that climbs, a folder.
    assert dt.archive_member(archive, "agent/nothing.json") is None
    assert dt.archive_member(archive, "../result.json") is None
    assert dt.archive_member(archive, "agent") is None


def test_unreadable_and_oversized_archives_are_refused(
    archive: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(dt.ArchiveUnreadable, match="not a readable"):
        dt.archive_files(b"not a tar.gz")
    with pytest.raises(dt.ArchiveUnreadable, match="not a readable"):
        dt.archive_member(gzip.compress(b"x" * 600), "result.json")
    monkeypatch.setattr(dt, "FILE_MAX_BYTES", 4)
    with pytest.raises(dt.FileTooLarge, match=r"agent/trajectory\.json is 9 bytes"):
        dt.archive_member(archive, "agent/trajectory.json")
    monkeypatch.setattr(dt, "READ_BUDGET_BYTES", 10)
    with pytest.raises(dt.ArchiveUnreadable, match="unpacks to more than 10 bytes"):
        dt.archive_files(_bomb())


def _bomb() -> bytes:
    """A small .tar.gz of one file of 1 MiB of zeros."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 1 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    return gzip.compress(raw.getvalue())


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("agent/trajectory.json", "trajectory.json"),
        ("../../etc/passwd", "passwd"),
        ('a"; filename=evil.sh', "a_filename_evil.sh"),
        (".bashrc", "bashrc"),
        ("résumé\r\n.txt", "r_sum_.txt"),
        ("", "download"),
    ],
)
def test_download_names_are_safe(name: str, safe: str) -> None:
    assert dt.download_name(name) == safe
    assert dt.attachment(name) == f'attachment; filename="{safe}"'
