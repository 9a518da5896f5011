"""The fleet and queue pages' live push (services/submitter/dashboard_live_pages.py):
one read serves every open page within a period; the stream sends the part on
connect and again only when it changed, says once when a read fails and sends the
part again when reads come back. Controls: past the period a new read happens; a
changed part is sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from services.common.errors import LedgerUnavailable
from services.submitter.dashboard_live_pages import SharedRead, page_stream


class Source:
    """Answers a scripted list of contents (an exception is raised), the last forever."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)

    async def read(self) -> str:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_open_pages_share_one_read_within_a_period() -> None:
    calls = 0

    async def read() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)  # let the other callers queue behind the lock
        return f"<p>{calls}</p>"

    shared = SharedRead(read, every_s=3600.0)
    got = await asyncio.gather(*(shared.latest() for _ in range(10)))
    assert got == ["<p>1</p>"] * 10 and calls == 1 == shared.reads
    # Control: with no period left, every call reads again.
    fresh = SharedRead(read, every_s=0.0)
    await fresh.latest()
    await fresh.latest()
    assert fresh.reads == 2


async def _take(stream: AsyncIterator[str], n: int) -> list[tuple[str, dict[str, str]]]:
    out = []
    async for chunk in stream:
        if chunk.startswith(":"):
            continue
        event, data = chunk.strip().split("\n")
        out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
        if len(out) == n:
            break
    return out


async def test_the_stream_sends_only_changes() -> None:
    source = Source("a", "a", "a", "b", "b", "c")
    events = await _take(page_stream(SharedRead(source.read, 0.0), "fleet", 0.0), 3)
    # "a" once though read three times; "b" and "c" as they came (the control).
    assert [(e, d["html"]) for e, d in events] == [("page", "a"), ("page", "b"), ("page", "c")]
    assert {d["target"] for _, d in events} == {"fleet"}


async def test_an_outage_is_said_once_and_the_part_sent_again_after() -> None:
    down = LedgerUnavailable("ledger at 127.0.0.1:1 unreachable")
    source = Source("a", down, down, down, "a")
    events = await _take(page_stream(SharedRead(source.read, 0.0), "queue-live", 0.0), 3)
    assert [e for e, _ in events] == ["page", "unavailable", "page"]
    assert "unreachable" in events[1][1]["message"]
    # Sent again although unchanged: the page said it was not updating meanwhile.
    assert events[2][1]["html"] == "a"
