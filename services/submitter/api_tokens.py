"""Who is calling the HTTP API: identities, and the tokens file that maps tokens to them.

The tokens file (``TRIALBUS_API_TOKENS_FILE``) is a small YAML or JSON document that
stores the SHA-256 of each token, never the token itself, so a copy of the file (a
backup, a support bundle) lets nobody in::

    tokens:
      - {sha256: <64 hex digits>, user: alice, team: red}
      - {sha256: <64 hex digits>, team: blue}
      - {sha256: <64 hex digits>, user: ops, admin: true}
      - {sha256: <64 hex digits>, team: release, priority_classes: [urgent, normal, batch]}

It must be a regular file that only its owner can read or write (``chmod 600``), like
a credentials file. ``issue_token`` adds an entry and returns the new token (what
``trialbus up`` calls). An identity is recorded on each experiment it submits
(``submitted_by`` in the ledger's copy of the manifest); only that identity or an
admin may resubmit or cancel the experiment over HTTP.

``priority_classes`` lists the priority classes (docs/scheduling.md) a token may
submit in. Without it, a token may use the installation's default class and every
class of no greater weight (``normal`` and ``batch`` by default), never a higher one
(``urgent``); an admin may use every class.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator
from pydantic_core import ErrorDetails

from schemas.constraints import require_either
from schemas.documented import DOCUMENTED
from schemas.subjects import CLASS_PATTERN
from services.common.errors import UserInputError
from services.common.priority import PriorityClasses
from services.common.private_files import write_private
from services.common.validation import problem_lines

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$"
"""User and team names: short, printable, safe in logs and messages."""
MAX_TOKENS_FILE_BYTES = 1024 * 1024
_NAME = re.compile(NAME_PATTERN)


class ApiConfigError(UserInputError):
    """The HTTP API's access settings or tokens file are unusable; it does not start."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request acts as: a user and/or a team, possibly an admin.

    ``ANONYMOUS`` (the API run with ``TRIALBUS_API_NO_AUTH`` on loopback) is an admin
    with no name: anyone who can reach a loopback-only API without a token can do
    everything anyway, and nothing is recorded as the submitter.
    """

    user: str | None = None
    team: str | None = None
    admin: bool = False
    priority_classes: tuple[str, ...] | None = None
    """Classes this identity may submit in; None: the default class and lower ones."""

    def record(self) -> dict[str, str] | None:
        """What is stored as ``submitted_by`` (None for the anonymous identity)."""
        out = {k: v for k, v in (("user", self.user), ("team", self.team)) if v is not None}
        return out or None

    @property
    def label(self) -> str:
        """For messages and logs: ``user alice (team red)``, ``team blue``."""
        if self.user and self.team:
            return f"user {self.user} (team {self.team})"
        if self.user or self.team:
            return f"user {self.user}" if self.user else f"team {self.team}"
        return "anonymous (no-auth API)"

    def may_use(self, priority_class: str, classes: PriorityClasses) -> bool:
        """Whether this identity may submit an experiment in ``priority_class``."""
        if self.admin:
            return True
        if self.priority_classes is not None:
            return priority_class in self.priority_classes
        known = dict(classes.weights)
        weight = known.get(priority_class)
        return weight is not None and weight <= known[classes.default]

    def may_change(self, owner: Identity | None) -> bool:
        """Whether this identity may resubmit or cancel what ``owner`` submitted."""
        if self.admin:
            return True
        return owner is not None and (owner.user, owner.team) == (self.user, self.team)


ANONYMOUS = Identity(admin=True)


def owner_from_record(value: Any) -> Identity | None:
    """The identity stored as ``submitted_by``, or None if absent or malformed.

    A malformed value (a bus client forging the event) names nobody, so only an
    admin can act on that experiment over HTTP.
    """
    if not isinstance(value, dict) or not value or set(value) - {"user", "team"}:
        return None
    if not all(isinstance(v, str) and _NAME.match(v) for v in value.values()):
        return None
    return Identity(user=value.get("user"), team=value.get("team"))


class _Entry(BaseModel):
    """One token of the tokens file: the digest it is known by and who it acts as."""

    model_config = ConfigDict(extra="forbid", frozen=True, **DOCUMENTED)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The token's SHA-256 in hex; the token itself is never stored."""
    user: str | None = Field(default=None, pattern=NAME_PATTERN)
    """The user the token acts as (recorded as the submitter of what it submits)."""
    team: str | None = Field(default=None, pattern=NAME_PATTERN)
    """The team the token acts as: its quotas apply to what the token submits."""
    admin: StrictBool = False
    """May change every experiment, whoever submitted it, and submit in every class."""
    priority_classes: list[Annotated[str, Field(pattern=CLASS_PATTERN)]] | None = Field(
        default=None, max_length=64
    )
    """The priority classes the token may submit in (None: the installation's default class
    and every class of no greater weight)."""

    @model_validator(mode="after")
    def _named(self) -> _Entry:
        return require_either(self, "user", "team", "the identity the token acts as")


class _TokensFile(BaseModel):
    """The API's tokens file (``TRIALBUS_API_TOKENS_FILE``, mode 0600)."""

    model_config = ConfigDict(extra="forbid", frozen=True, **DOCUMENTED)

    tokens: list[_Entry] = Field(min_length=1)
    """Every token the HTTP API accepts."""


def _message(err: ErrorDetails) -> str | None:
    if err["loc"][-1:] == ("sha256",) and err["type"] != "missing":
        # Never echo the value: it may be a raw token pasted by mistake.
        return "must be the token's SHA-256 as 64 lowercase hex digits, not the token"
    if err["type"] == "extra_forbidden":
        return "unknown field (fields: sha256, user, team, admin, priority_classes)"
    return None


def _read_private(path: Path) -> bytes:
    """The file's bytes, if it is a regular file that only its owner may access."""
    try:
        # O_NONBLOCK: a FIFO put in its place must not hang the start; refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ApiConfigError(f"cannot read the API tokens file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ApiConfigError(f"the API tokens file {path} is not a regular file")
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ApiConfigError(
                f"the API tokens file {path} is accessible to other users (mode "
                f"{stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`"
            )
        raw = f.read(MAX_TOKENS_FILE_BYTES + 1)
    if len(raw) > MAX_TOKENS_FILE_BYTES:
        raise ApiConfigError(f"the API tokens file {path} is larger than 1 MiB")
    return raw


def _parse(path: Path, raw: bytes) -> _TokensFile:
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
        return _TokensFile.model_validate(data)
    except (UnicodeDecodeError, yaml.YAMLError):
        raise ApiConfigError(
            f"{path}: not valid YAML or JSON (expected `tokens: [{{sha256: ..., user: ...}}]`)"
        ) from None
    except ValidationError as exc:
        raise ApiConfigError(problem_lines(str(path), exc, _message)) from None


class TokenTable:
    """Token digests to identities; lookups compare every digest in constant time."""

    def __init__(self, entries: list[tuple[bytes, Identity]]) -> None:
        self._entries = tuple(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def identify(self, token: str) -> Identity | None:
        """The identity of ``token``, or None. No early exit: every entry is compared."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for known, identity in self._entries:
            if hmac.compare_digest(digest, known):
                found = identity
        return found


def load_token_table(path: Path) -> TokenTable:
    """Read and check the tokens file (raises ApiConfigError naming the file and fix)."""
    parsed = _parse(path, _read_private(path))
    seen: dict[str, int] = {}
    entries = []
    for i, e in enumerate(parsed.tokens):
        if e.sha256 in seen:
            raise ApiConfigError(
                f"{path}: tokens[{i}]: the same token as tokens[{seen[e.sha256]}] "
                "(a token acts as one identity)"
            )
        seen[e.sha256] = i
        identity = Identity(e.user, e.team, e.admin, _classes(e.priority_classes))
        entries.append((bytes.fromhex(e.sha256), identity))
    return TokenTable(entries)


def _classes(listed: list[str] | None) -> tuple[str, ...] | None:
    return None if listed is None else tuple(listed)


def token_digest(token: str) -> str:
    """The hex SHA-256 stored in the tokens file for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


def issue_token(
    path: Path,
    *,
    user: str | None = None,
    team: str | None = None,
    admin: bool = False,
    priority_classes: list[str] | None = None,
) -> str:
    """Add a new token for this identity to the tokens file (created 0600); return it.

    ``priority_classes``: the classes it may submit in (None: the default rule).
    The token is returned once and never stored: only its digest is written.
    """
    token = secrets.token_urlsafe(32)  # 256 random bits
    try:
        entry = _Entry(
            sha256=token_digest(token),
            user=user,
            team=team,
            admin=admin,
            priority_classes=priority_classes,
        )
    except ValidationError as exc:
        raise ApiConfigError(problem_lines("the new token", exc, _message)) from None
    current: list[dict[str, Any]] = []
    if path.exists():
        current = [
            e.model_dump(exclude_defaults=True) for e in _parse(path, _read_private(path)).tokens
        ]
    text = yaml.safe_dump({"tokens": [*current, entry.model_dump(exclude_defaults=True)]})
    write_private(path, text)
    return token
