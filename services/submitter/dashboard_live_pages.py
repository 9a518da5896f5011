"""Live push for the fleet page (``/ui/runners``) and the queue page (``/ui/queue``).

Neither has a stream of events to follow: the runner registry is a KV bucket the
submitter reads by direct gets (watching it would be a consumer on the bucket's stream,
a bus right the submitter role does not have and does not get for this), and the
queue is stream infos and ledger reads. So the server re-reads on a timer through the
pages' own read paths (``follow.fleet``, ``follow.read_queue``), renders the page's
part with the page's own template, and pushes it over Server-Sent Events only when it
changed. One read per period serves every open page (``SharedRead``): ten viewers cost
what one does. Without JavaScript the pages keep their refresh link.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from services.submitter import dashboard_views as views
from services.submitter.dashboard_stream import KEEPALIVE_S, sse
from services.submitter.follow import fleet, read_queue
from services.submitter.live_feeds import UNAVAILABLE

RUNNERS_EVERY_S = 2.0
"""The fleet page's period: a runner rewrites its record within a second of a change
of load, and every page shows the heartbeat's age in seconds."""
QUEUE_EVERY_S = 5.0
"""The queue page's period: a read costs two stream infos and a ledger read per
waiting experiment, so less often than the fleet."""


class SharedRead:
    """The latest result of ``read``, read again at most every ``every_s`` seconds
    however many callers ask: the open pages of one kind share one read."""

    def __init__(self, read: Callable[[], Awaitable[str]], every_s: float) -> None:
        self._read = read
        self._every_s = every_s
        self._lock = asyncio.Lock()
        self._at = -math.inf
        self._value = ""
        self.reads = 0
        """How many times ``read`` ran (for the tests and the curious)."""

    async def latest(self) -> str:
        """The last result if younger than the period, else a new read (its errors
        propagate and the next caller tries again)."""
        async with self._lock:
            if time.monotonic() - self._at >= self._every_s:
                self._value = await self._read()
                self._at = time.monotonic()
                self.reads += 1
            return self._value


async def page_stream(shared: SharedRead, target: str, every_s: float) -> AsyncIterator[str]:
    """``page`` events ``{target, html}`` (the element id and its new content): one on
    connect, then one each period the content changed; ``unavailable`` ``{message}``
    while a read fails (NATS or the ledger away), and the stream goes on trying. A
    comment every ``KEEPALIVE_S`` while nothing changes."""
    last: str | None = None
    down = False
    said = time.monotonic()
    while True:
        try:
            html = await shared.latest()
        except UNAVAILABLE as exc:
            if not down:  # once per outage, not once per period
                yield sse("unavailable", {"message": f"cannot read now: {exc}"})
                said = time.monotonic()
            down, last = True, None  # once back, the page is sent again
        else:
            down = False
            if html != last:
                yield sse("page", {"target": target, "html": html})
                last, said = html, time.monotonic()
        if time.monotonic() - said >= KEEPALIVE_S:
            yield ": keepalive\n\n"
            said = time.monotonic()
        await asyncio.sleep(every_s)


async def runners_context(app: Any) -> dict[str, Any]:
    """The fleet page's context (``follow.fleet``, the read path of ``GET /runners``)."""
    registry = await app.state.nats.registry()
    return views.fleet_view(await fleet(registry), registry.heartbeat_s)


async def queue_context(app: Any) -> dict[str, Any]:
    """The queue page's context (``follow.read_queue``, the read path of ``GET /queue``),
    spend caps judged by the ports' team quotas."""
    ports = app.state.ports
    view = await read_queue(app.state.nats, ports.ledger, ports.quotas)
    return view.as_dict()


def build_live_page_routes(
    stream_response: Callable[[AsyncIterator[str]], Response],
) -> APIRouter:
    """``GET /runners/events`` and ``GET /queue/events`` (under ``/ui``, behind the
    dashboard's guard); ``stream_response``: the dashboard's SSE answer."""
    router = APIRouter()
    shared: dict[str, SharedRead] = {}

    def shared_read(request: Request, part: str, every_s: float) -> SharedRead:
        app = request.app

        async def read() -> str:
            if part == "_runners.html":
                context = await runners_context(app)
            else:
                context = await queue_context(app)
            return views.PAGES.get_template(part).render(**context)

        if part not in shared:  # one per app: the router is built once per app
            shared[part] = SharedRead(read, every_s)
        return shared[part]

    @router.get("/runners/events")
    async def runners_events(request: Request) -> Response:
        read = shared_read(request, "_runners.html", RUNNERS_EVERY_S)
        return stream_response(page_stream(read, "fleet", RUNNERS_EVERY_S))

    @router.get("/queue/events")
    async def queue_events(request: Request) -> Response:
        read = shared_read(request, "_queue.html", QUEUE_EVERY_S)
        return stream_response(page_stream(read, "queue-live", QUEUE_EVERY_S))

    return router
