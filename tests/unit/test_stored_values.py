"""Each kind of kept report value reads back equal to what was computed
(services/reports/stored.py's ``decode(encode(v)) == v``), so a value a new process
reads from the ledger shows what computing it would."""

from __future__ import annotations

from datetime import UTC, datetime

from services.common.ports import ExperimentInfo
from services.reports import queries, stored
from services.reports.progress import Recorded
from services.reports.report_cache import deep_size
from services.reports.trials import lines_value
from services.submitter.dashboard_stream import PAGE_CODEC, page_view_of
from tests.support.records import report_record, single_reward

INFO = ExperimentInfo("exp", "name", 6, {"agents": [{"name": "oracle"}], "n": 1.5})


def _records() -> list:  # type: ignore[type-arg]
    return [
        report_record(single_reward(float(i % 2)), task=f"t{i % 3}", agent=a)
        for i in range(3)
        for a in ("oracle", "nop")
    ]


def test_every_kind_reads_back_equal() -> None:
    records = _records()
    for info in (INFO, None):
        view = page_view_of("exp", info, records)
        assert stored.decode(stored.encode(view, PAGE_CODEC), PAGE_CODEC) == view
        basis = queries.progress_basis("exp", info, records)
        codec = stored.PROGRESS_CODEC
        assert stored.decode(stored.encode(basis, codec), codec) == basis
        report = queries.report_value("exp", info, records)
        assert (
            stored.decode(stored.encode(report, stored.REPORT_CODEC), stored.REPORT_CODEC) == report
        )
        board = queries.leaderboard_rows("exp", info, records)
        codec_b = stored.ROWS_CODEC
        assert stored.decode(stored.encode(board, codec_b), codec_b) == board
        lines = lines_value("exp", info, records)
        assert stored.decode(stored.encode(lines, codec_b), codec_b) == lines


def test_times_keep_their_zone_and_microseconds() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    recorded = Recorded({"total": 1}, frozenset({"a", "b"}), at, None)
    back = stored.recorded_of_json(stored.recorded_to_json(recorded))
    assert back == recorded and back.first_start is not None
    assert back.first_start.utcoffset() is not None
    # Negative control: a naive time would not compare equal to the aware one.
    assert back.first_start != at.replace(tzinfo=None)


def test_the_token_names_the_content_version_and_the_code() -> None:
    token = stored.token("v7")
    assert token.startswith("v7/") and token != stored.token("v8")
    assert token.endswith(stored.fingerprint()) and len(stored.fingerprint()) == 16


def test_the_size_of_a_read_value_is_estimated_without_walking_it() -> None:
    view = page_view_of("exp", INFO, _records() * 20)
    blob = stored.encode(view, PAGE_CODEC)
    estimate = stored._decode_sized(blob, PAGE_CODEC)[1]
    held = deep_size(stored.decode(blob, PAGE_CODEC))
    # An estimate (the cache's budget is one too): within a factor of two.
    assert held / 2 <= estimate <= 2 * held
    # Negative control: the JSON's length alone would be far under.
    assert estimate / stored.BYTES_PER_JSON_BYTE < held / 2
