"""This machine's addresses other than loopback, for tests that must reach it (or prove
they cannot) the way another host would."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

_SIOCGIFADDR = 0x8915


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()))
        except OSError:
            return None  # no IPv4 address on this interface
    return socket.inet_ntoa(packed[20:24])


def non_loopback_addresses() -> list[str]:
    """This machine's IPv4 and global IPv6 addresses other than loopback.

    Fails (never skips) when there is none or the interfaces cannot be read: the
    test cannot decide then."""
    found: list[str] = []
    for _index, name in socket.if_nameindex():
        v4 = _ipv4_of(name)
        if v4 and not ipaddress.ip_address(v4).is_loopback:
            found.append(v4)
    inet6 = Path("/proc/net/if_inet6")
    if inet6.exists():
        for line in inet6.read_text().splitlines():
            raw, _idx, _plen, scope = line.split()[:4]
            address = ipaddress.IPv6Address(bytes.fromhex(raw))
            if scope == "00" and not address.is_loopback:  # global scope only
                found.append(str(address))
    assert found, (
        "no non-loopback address found on this machine (socket.if_nameindex, "
        "/proc/net/if_inet6): the test cannot decide"
    )
    return found
