"""Users and groups as the sandbox's own /etc/passwd and /etc/group define them."""

from __future__ import annotations

from pathlib import Path

from services.localenv.errors import LocalEnvironmentError
from services.localenv.spec import resolve_in_root


def _entries(root: Path, name: str) -> list[list[str]]:
    try:
        text = resolve_in_root(root, f"/etc/{name}").read_text(errors="replace")
    except OSError:
        return []
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def lookup_user(root: Path, user: str | int) -> tuple[int, int, str]:
    """(uid, gid, home) of ``user`` (a name, a uid, or ``uid:gid``) inside the sandbox.

    A uid absent from /etc/passwd is accepted as Docker does (gid = uid, HOME = /);
    an unknown name raises ``LocalEnvironmentError``.
    """
    text = str(user)
    name, _, group = text.partition(":")
    entries = _entries(root, "passwd")
    if name.isdigit():
        uid = int(name)
        match = next((e for e in entries if len(e) > 5 and e[2] == name), None)
        gid, home = (int(match[3]), match[5]) if match else (uid, "/")
    else:
        match = next((e for e in entries if len(e) > 5 and e[0] == name), None)
        if match is None:
            raise LocalEnvironmentError(
                f"user {name!r} does not exist in the environment's /etc/passwd"
            )
        uid, gid, home = int(match[2]), int(match[3]), match[5]
    if group:
        gid = lookup_group(root, group)
    return uid, gid, home or "/"


def lookup_group(root: Path, group: str) -> int:
    """Numeric gid of a group name or number inside the sandbox."""
    if group.isdigit():
        return int(group)
    match = next((e for e in _entries(root, "group") if len(e) > 2 and e[0] == group), None)
    if match is None:
        raise LocalEnvironmentError(
            f"group {group!r} does not exist in the environment's /etc/group"
        )
    return int(match[2])
