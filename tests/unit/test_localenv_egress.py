"""The allowlist proxy's pure parts (services/localenv/egress.py): which hosts an
allowlist names, how a proxy request is read, which addresses stay out of reach.
Against a real sandbox: tests/integration/test_localenv.py."""

from __future__ import annotations

import ipaddress

import pytest

from services.localenv.egress import Allowlist, Refused, parse_head, unreachable

ALLOWED = Allowlist.of(
    ["API.example.com.", "*.pypi.org", "192.0.2.7", "10.1.0.0/16", "2001:db8::1"]
)


@pytest.mark.parametrize(
    "host",
    [
        "api.example.com",
        "API.EXAMPLE.COM.",
        "files.pypi.org",
        "a.b.pypi.org",
        "192.0.2.7",
        "10.1.200.3",
        "[2001:db8::1]",
        "2001:db8::1",
    ],
)
def test_what_the_allowlist_names_is_allowed(host: str) -> None:
    assert ALLOWED.allows(host)


@pytest.mark.parametrize(
    "host",
    [
        "example.com",  # the parent of a listed name
        "pypi.org",  # a wildcard names the subdomains, not the name itself
        "evilpypi.org",
        "api.example.com.evil.net",
        "192.0.2.8",
        "10.2.0.1",
        "2001:db8::2",
        "",
    ],
)
def test_what_it_does_not_name_is_not(host: str) -> None:
    assert not ALLOWED.allows(host)


@pytest.mark.parametrize(
    ("address", "out_of_reach"),
    [
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("169.254.169.254", True),  # cloud metadata services
        ("fe80::1", True),
        ("0.0.0.0", True),
        ("224.0.0.1", True),
        ("::ffff:127.0.0.1", True),  # the host's loopback, IPv4-mapped
        ("::ffff:169.254.169.254", True),
        ("::ffff:192.0.2.7", False),
        ("192.0.2.7", False),
        ("10.1.0.1", False),
        ("2001:db8::1", False),
    ],
)
def test_the_host_s_loopback_and_link_local_addresses_stay_out_of_reach(
    address: str, out_of_reach: bool
) -> None:
    assert unreachable(ipaddress.ip_address(address)) is out_of_reach


def test_a_connect_names_host_and_port() -> None:
    request = parse_head(b"CONNECT api.example.com:8443 HTTP/1.1\r\nHost: api.example.com")
    assert (request.host, request.port, request.tunnel) == ("api.example.com", 8443, True)
    assert parse_head(b"CONNECT [2001:db8::1]:443 HTTP/1.1").host == "2001:db8::1"


def test_a_plain_http_request_is_forwarded_in_origin_form_without_proxy_headers() -> None:
    head = (
        b"GET http://user@api.example.com/v1/models?x=1 HTTP/1.1\r\n"
        b"Host: api.example.com\r\nProxy-Authorization: Basic c2VjcmV0\r\nAccept: */*"
    )
    request = parse_head(head)
    assert (request.host, request.port, request.tunnel) == ("api.example.com", 80, False)
    assert request.forward == (
        b"GET /v1/models?x=1 HTTP/1.1\r\nHost: api.example.com\r\nAccept: */*"
    )


@pytest.mark.parametrize(
    ("head", "fragment"),
    [
        (b"GET /path HTTP/1.1", "send https:// through CONNECT"),
        (b"GET https://api.example.com/ HTTP/1.1", "send https:// through CONNECT"),
        (b"CONNECT api.example.com:http HTTP/1.1", "bad port"),
        (b"CONNECT api.example.com:70000 HTTP/1.1", "bad host or port"),
        (b"CONNECT api.example.com:443 HTTP/2", "unsupported version"),
        (b"\x16\x03\x01\x02\x00\xff", "not an HTTP proxy request"),  # a TLS hello
        (b"GET http://x/ HTTP/1.1 extra", "not an HTTP proxy request"),
    ],
)
def test_what_is_not_a_proxy_request_is_a_400_naming_why(head: bytes, fragment: str) -> None:
    with pytest.raises(Refused) as refused:
        parse_head(head)
    assert refused.value.status == 400 and fragment in str(refused.value)
