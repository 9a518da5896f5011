"""A trial's only way out while its network policy is an allowlist: an HTTP proxy that
connects to the hosts the task allows and to nothing else.

Harbor's ``network_mode = "allowlist"`` (``allowed_hosts``: hostnames, ``*.suffix``
wildcards, IP addresses and CIDR ranges) is how a task keeps an agent off the web but
on, say, its model provider's API. The local sandbox has no route out in that phase
(no slirp4netns: only ``lo``). Its one exit is this proxy, listening on the sandbox's
own loopback (the listening socket is made inside the sandbox's network namespace, by
a short-lived thread that enters it; connections out are made from the host's), and
named in every command's environment (``HTTP_PROXY``, ``HTTPS_PROXY`` and their lower
case forms; ``NO_PROXY`` for the loopback). It takes

- ``CONNECT host:port`` (HTTPS and any other TCP through a tunnel), and
- absolute-form ``GET http://host/...`` (plain HTTP, forwarded in origin form),

and answers 403 naming the host for anything the allowlist does not name. A name is
matched before it is resolved (on the host); a literal address must lie in a listed
address or range. Whatever the name, the host's loopback, link-local addresses (cloud
metadata services), unspecified and multicast addresses are refused, as slirp4netns
refuses the host's loopback in public mode.

What this is not: a transparent filter. A program that ignores the proxy variables
(or unsets them) has no network at all in this phase, so the policy fails closed; it
does not pass. Docker's environment does the same with a transparent proxy and
nftables, which a runner here need not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from services.localenv.errors import LocalEnvironmentError

HEAD_MAX_BYTES: Final = 64 * 1024
"""A request's head (request line and headers) is read up to this size."""
HEAD_TIMEOUT_S: Final = 30.0
CONNECT_TIMEOUT_S: Final = 30.0
CHUNK: Final = 64 * 1024
MAX_CONNECTIONS: Final = 256
"""Connections through the proxy at once, at most (the trial process holds each)."""
NO_PROXY: Final = "localhost,127.0.0.1,::1"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Allowlist:
    """Harbor's ``allowed_hosts``, as the proxy matches them."""

    names: frozenset[str]
    suffixes: tuple[str, ...]
    """``*.example.com`` -> ``.example.com``: its subdomains, not the name itself."""
    networks: tuple[Network, ...]
    """Listed addresses (as /32 or /128) and ranges."""

    @classmethod
    def of(cls, hosts: Sequence[str]) -> Allowlist:
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[Network] = []
        for entry in (h.strip().lower().rstrip(".") for h in hosts):
            if entry.startswith("*."):
                suffixes.append(entry[1:])
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                names.add(entry)
        return cls(frozenset(names), tuple(suffixes), tuple(networks))

    def allows(self, host: str) -> bool:
        """Whether a request may go to ``host`` (a name or a literal address)."""
        host = host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host in self.names or any(host.endswith(s) for s in self.suffixes)
        return any(address in network for network in self.networks)


def unreachable(address: Address) -> bool:
    """Addresses no trial may reach through the proxy, whatever its allowlist (an
    IPv4-mapped IPv6 address is judged as the IPv4 address it maps)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_unspecified
        or address.is_multicast
    )


@dataclass(frozen=True, slots=True)
class Request:
    """Where a proxied request goes, and what is sent there first (plain HTTP)."""

    host: str
    port: int
    tunnel: bool
    forward: bytes = b""


class Refused(Exception):
    """A request the proxy does not carry: ``status`` and the reason sent back."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def _host_port(authority: str, default_port: int) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise Refused(400, f"bad port in {authority!r}") from None
    if not host or not 0 < port < 65536:
        raise Refused(400, f"bad host or port in {authority!r}")
    return host, port


def parse_head(head: bytes) -> Request:
    """The request a proxy client sent (its head up to the blank line), or Refused."""
    line, _, rest = head.partition(b"\r\n")
    try:
        method, target, version = line.decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "not an HTTP proxy request") from None
    if not version.startswith("HTTP/1."):
        raise Refused(400, f"unsupported version {version!r}")
    if method == "CONNECT":
        host, port = _host_port(target, 443)
        return Request(host, port, tunnel=True)
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.netloc:
        raise Refused(
            400, f"{method} {target[:200]!r}: send https:// through CONNECT, http:// in full"
        )
    host, port = _host_port(parts.netloc.rpartition("@")[2], 80)
    path = parts.path or "/"
    origin = f"{method} {path}{'?' + parts.query if parts.query else ''} {version}"
    headers = [h for h in rest.split(b"\r\n") if not h.lower().startswith(b"proxy-")]
    return Request(host, port, tunnel=False, forward=b"\r\n".join([origin.encode(), *headers]))


def enforceable() -> bool:
    """Whether this process can enforce an allowlist: the proxy's socket is made inside
    the sandbox's network namespace, which only root can enter (``_listen_inside``).
    What the local environment says it can do, and what a runner announces
    (``local.allowlist``: services/runner/capabilities.py)."""
    return os.geteuid() == 0


def _listen_inside(netns_pid: int) -> socket.socket:
    """A listening socket on 127.0.0.1 of the network namespace of ``netns_pid``.

    Made by a thread that enters the namespace, binds and leaves: a socket keeps the
    namespace it was made in, and no other thread of this process ever changes its own.
    """
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def enter() -> None:
        try:
            own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            failed.append(exc)
            return
        try:
            target = os.open(f"/proc/{netns_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.setns(target, os.CLONE_NEWNET)
                try:
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.bind(("127.0.0.1", 0))
                    sock.listen(128)
                    sock.setblocking(False)
                    made.append(sock)
                finally:
                    os.setns(own, os.CLONE_NEWNET)
            finally:
                os.close(target)
        except OSError as exc:  # reported to the caller; the thread then ends
            failed.append(exc)
        finally:
            os.close(own)

    thread = threading.Thread(target=enter, name="trialbus-egress-listen")
    thread.start()
    thread.join()
    if failed:
        for sock in made:
            sock.close()
        raise LocalEnvironmentError(
            f"cannot open the allowlist proxy inside the sandbox: {failed[0]} (the runner "
            "needs root to enter the sandbox's network namespace)"
        )
    return made[0]


class EgressProxy:
    """The proxy of one sandbox; ``allowlist`` None refuses every request."""

    def __init__(self, logger: logging.Logger) -> None:
        self.allowlist: Allowlist | None = None
        self.port: int | None = None
        self._logger = logger
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def env(self) -> dict[str, str]:
        """The variables that send a command's requests through the proxy."""
        url = f"http://127.0.0.1:{self.port}"
        names = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
        # NODE_USE_ENV_PROXY: Node's built-in fetch reads the variables only with it.
        return {
            **dict.fromkeys(names, url),
            "NO_PROXY": NO_PROXY,
            "no_proxy": NO_PROXY,
            "NODE_USE_ENV_PROXY": "1",
        }

    async def start(self, netns_pid: int) -> None:
        sock = await asyncio.to_thread(_listen_inside, netns_pid)
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._serve, sock=sock, limit=HEAD_MAX_BYTES)

    async def allow(self, allowlist: Allowlist | None) -> None:
        """Apply a phase's allowlist; connections of the previous phase are closed."""
        self.allowlist = allowlist
        for writer in list(self._open):
            writer.close()

    async def stop(self) -> None:
        await self.allow(None)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        up_writer: asyncio.StreamWriter | None = None
        try:
            if len(self._open) > 2 * MAX_CONNECTIONS:
                await _answer(writer, 503, f"more than {MAX_CONNECTIONS} connections at once")
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
                request = parse_head(head[:-4])
                up_reader, up_writer = await self._connect(request)
            except Refused as refused:
                await _answer(writer, refused.status, str(refused))
                return
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                await _answer(writer, 400, f"no request head within {HEAD_MAX_BYTES} bytes")
                return
            self._open.add(up_writer)
            if request.tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_writer.write(request.forward + b"\r\n\r\n")
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (ConnectionError, OSError, RuntimeError):
            pass  # either side went away, or the phase ended and closed it
        finally:
            for end in (writer, up_writer):
                if end is not None:
                    self._open.discard(end)
                    end.close()

    async def _connect(self, request: Request) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        allowlist = self.allowlist
        if allowlist is None:
            raise Refused(403, "the network is off in this phase of the trial")
        if not allowlist.allows(request.host):
            self._logger.info("local environment: egress to %s refused", request.host)
            raise Refused(403, f"{request.host} is not in the task's allowed_hosts")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                request.host, request.port, type=socket.SOCK_STREAM
            )
        except OSError as exc:
            raise Refused(502, f"{request.host}: cannot resolve ({exc})") from None
        addresses = [ipaddress.ip_address(info[4][0]) for info in infos]
        usable = [a for a in addresses if not unreachable(a)]
        if not usable:
            raise Refused(403, f"{request.host} resolves only to addresses no trial may reach")
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(str(usable[0]), request.port), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            raise Refused(502, f"{request.host}:{request.port}: {exc}") from None
        if self.allowlist is not allowlist:  # the phase changed while it connected
            up_writer.close()
            raise Refused(403, "the trial's network policy changed")
        return up_reader, up_writer


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    text = f"trialbus egress: {reason}\n".encode()
    phrases = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Unavailable"}
    phrase = phrases.get(status, "Error")
    writer.write(
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n".encode()
        + text
    )
    with contextlib.suppress(ConnectionError, OSError):
        await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
