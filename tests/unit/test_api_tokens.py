"""The HTTP API's identities, tokens file and access rules (pure logic and files; the
boundary itself is tested against the running service in tests/security/test_http_api.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request

from services.common.settings import SubmitterSettings
from services.submitter.api_tokens import (
    ANONYMOUS,
    ApiConfigError,
    Identity,
    issue_token,
    load_token_table,
    owner_from_record,
    token_digest,
)
from services.submitter.http_security import (
    allowed_hosts,
    api_access,
    bearer_token,
    is_loopback,
    media_type,
    secure,
)


def test_issued_tokens_identify_their_identity_and_only_a_digest_is_stored(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.yaml"
    alice = issue_token(path, user="alice", team="red")
    ops = issue_token(path, user="ops", admin=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert alice not in text and ops not in text
    assert token_digest(alice) in text and token_digest(ops) in text
    table = load_token_table(path)
    assert len(table) == 2
    assert table.identify(alice) == Identity("alice", "red", admin=False)
    assert table.identify(ops) == Identity("ops", None, admin=True)
    # Negative controls: a near miss, another scheme's value, the digest itself.
    for wrong in (alice[:-1], alice + "x", "", token_digest(alice)):
        assert table.identify(wrong) is None


@pytest.mark.parametrize(
    ("content", "mode", "message"),
    [
        ("tokens: []\n", 0o600, "tokens: List should have at least 1 item"),
        ("tokens:\n  - {sha256: not-a-digest, user: a}\n", 0o600, "tokens[0].sha256: must be"),
        (f"tokens:\n  - {{sha256: {'a' * 64}}}\n", 0o600, "give user, team or both"),
        (f"tokens:\n  - {{sha256: {'a' * 64}, user: a, role: x}}\n", 0o600, "unknown field"),
        (f"tokens:\n  - {{sha256: {'a' * 64}, user: 'a b'}}\n", 0o600, "tokens[0].user"),
        (f"tokens:\n  - {{sha256: {'a' * 64}, user: a, admin: 'yes'}}\n", 0o600, "admin"),
        (
            f"tokens:\n  - {{sha256: {'a' * 64}, user: a}}\n  - {{sha256: {'a' * 64}, user: b}}\n",
            0o600,
            "tokens[1]: the same token as tokens[0]",
        ),
        ("tokens: [\n", 0o600, "not valid YAML or JSON"),
        (f"tokens:\n  - {{sha256: {'a' * 64}, user: a}}\n", 0o640, "run `chmod 600"),
        (f"tokens:\n  - {{sha256: {'a' * 64}, user: a}}\n", 0o604, "run `chmod 600"),
    ],
)
def test_a_bad_tokens_file_is_refused_naming_the_field(
    tmp_path: Path, content: str, mode: int, message: str
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(ApiConfigError) as info:
        load_token_table(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    # Control: the same file with one good entry at 0600 loads.
    path.write_text(f"tokens:\n  - {{sha256: {'a' * 64}, user: a}}\n")
    path.chmod(0o600)
    assert len(load_token_table(path)) == 1


def test_a_pasted_token_is_never_echoed_and_a_fifo_never_waited_for(tmp_path: Path) -> None:
    pasted = tmp_path / "pasted.yaml"
    pasted.write_text("tokens:\n  - {sha256: s3cr3t-token-value, user: a}\n")
    pasted.chmod(0o600)
    with pytest.raises(ApiConfigError) as info:
        load_token_table(pasted)
    assert "s3cr3t-token-value" not in str(info.value)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ApiConfigError, match="not a regular file"):
        load_token_table(fifo)
    with pytest.raises(ApiConfigError, match="cannot read"):
        load_token_table(tmp_path / "missing.yaml")


def test_owners_and_who_may_change_what() -> None:
    alice = owner_from_record({"user": "alice", "team": "red"})
    assert alice == Identity("alice", "red")
    assert Identity("alice", "red").may_change(alice)
    assert not Identity("bob", "red").may_change(alice)
    assert not Identity("alice", None).may_change(alice)  # another identity
    assert not Identity("alice", "red").may_change(None)  # no recorded owner
    assert Identity("ops", admin=True).may_change(alice)
    assert Identity("ops", admin=True).may_change(None)
    assert ANONYMOUS.record() is None and ANONYMOUS.admin
    for forged in (None, {}, {"user": "a", "admin": True}, {"user": 3}, {"user": "a b"}, "alice"):
        assert owner_from_record(forged) is None


def test_access_rules_from_settings(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.5.5.5") and is_loopback("[::1]")
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.2", "example.org"))
    assert allowed_hosts(SubmitterSettings()) == ("localhost", "127.0.0.1", "::1")
    assert allowed_hosts(SubmitterSettings(http_host="0.0.0.0")) == (
        "localhost",
        "127.0.0.1",
        "::1",
    )
    assert allowed_hosts(SubmitterSettings(http_host="10.0.0.5"))[0] == "10.0.0.5"
    custom = SubmitterSettings(api_allowed_hosts="api.example.org, *.lab.example")
    assert allowed_hosts(custom) == ("api.example.org", "*.lab.example")
    with pytest.raises(ApiConfigError, match="needs tokens"):
        api_access(SubmitterSettings())
    with pytest.raises(ApiConfigError, match="only on a loopback address"):
        api_access(SubmitterSettings(http_host="0.0.0.0", api_no_auth=True))
    tokens = tmp_path / "tokens.yaml"
    issue_token(tokens, team="blue")
    with pytest.raises(ApiConfigError, match="choose one"):
        api_access(SubmitterSettings(api_no_auth=True, api_tokens_file=tokens))
    # Controls: each safe combination is accepted.
    assert api_access(SubmitterSettings(api_no_auth=True)).tokens is None
    served = api_access(SubmitterSettings(http_host="0.0.0.0", api_tokens_file=tokens))
    assert served.tokens is not None and len(served.tokens) == 1


def test_header_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer abc") == "abc"
    for refused in (None, "", "abc", "Basic abc", "Bearer", "Bearer ", "Token abc"):
        assert bearer_token(refused) is None
    assert media_type("application/JSON; charset=utf-8") == "application/json"
    assert media_type(None) == ""


async def test_the_guard_answers_the_apis_own_names_ipv6_included() -> None:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"n": len(await request.body())}

    settings = SubmitterSettings(api_no_auth=True, api_allowed_hosts="localhost,[::1]")
    secure(app, api_access(settings))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        for host, origin, status in [
            ("[::1]:8080", "http://[::1]:8080", 200),
            ("localhost", "http://localhost:8080", 200),
            ("127.0.0.1", None, 400),  # not in this list
            ("[::2]:8080", None, 400),
            ("localhost", "http://[::2]:8080", 403),
        ]:
            headers = {"Host": host, "Content-Type": "application/json"}
            if origin is not None:
                headers["Origin"] = origin
            r = await c.post("/echo", content=b"{}", headers=headers)
            assert r.status_code == status, (host, origin, r.text)
