"""``trialbus import`` / ``status`` skip NATS at once when nothing listens
(services.submitter.connections._all_refused), and only then."""

from __future__ import annotations

import asyncio
import socket

from services.submitter.connections import _all_refused


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: a connect is refused


async def test_a_port_where_nothing_listens_is_refused() -> None:
    assert await _all_refused([f"nats://127.0.0.1:{_closed_port()}"])
    assert await _all_refused([f"127.0.0.1:{_closed_port()}", f"tls://127.0.0.1:{_closed_port()}"])


async def test_one_listening_server_is_left_to_nats() -> None:
    # Negative control: something accepts, so the probe must not decide for nats-py.
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert not await _all_refused([f"nats://127.0.0.1:{port}"])
        assert not await _all_refused(
            [f"nats://127.0.0.1:{_closed_port()}", f"nats://127.0.0.1:{port}"]
        )
    finally:
        server.close()
        await server.wait_closed()


async def test_no_servers_is_not_refused() -> None:
    assert not await _all_refused([])
