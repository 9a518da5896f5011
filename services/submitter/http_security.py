"""The HTTP API's door: what a request must show before any route (or body) is read.

``api_access(settings)`` decides at start who may call (a tokens file, or no-auth on a
loopback address only) and refuses unsafe settings with ``ApiConfigError``. ``secure``
puts two ASGI middlewares in front of the app, outermost first:

1. Starlette's TrustedHostMiddleware: a Host header outside the allowed hosts is a 400,
   so a web page that rebinds its own name to 127.0.0.1 cannot reach the API.
2. ``ApiGuard``, in this order, before the body is read: a browser's cross-origin
   request (``Origin`` of another host) is a 403; a missing or unknown bearer token a
   401 (every path but /healthz and the dashboard's login page; a browser asking for a
   dashboard page is sent to the login page instead); a body that is not JSON or YAML
   a 415 (the login form alone may post a form; ``/tasks`` takes a gzipped tar and
   nothing else); a body larger than ``api_max_body_bytes`` (``api_max_task_bytes``
   for ``/tasks``) a 413, judged from Content-Length and again while the body
   streams in. The body is then read (bounded) and handed to the route, with the
   caller's ``Identity`` in ``request.state.identity``.

A browser authenticates with the session cookie the login page sets (``SESSION_COOKIE``:
the token itself, HttpOnly, SameSite=Strict). The cookie is a read pass: it is honoured
on GET and HEAD only, so nothing a page (or another site) makes a browser send can
submit or cancel; writes need the ``Authorization`` header (docs/security.md).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common.logging import get_logger
from services.common.settings import SubmitterSettings
from services.submitter.api_tokens import (
    ANONYMOUS,
    ApiConfigError,
    Identity,
    TokenTable,
    load_token_table,
)

log = get_logger(__name__)

MANIFEST_MEDIA_TYPES = frozenset({"application/json", "application/yaml", "application/x-yaml"})
"""What a body may be. Not text/plain: a web page can send that cross-site without a
CORS preflight, and so without the API's consent."""
LOGIN_PATH = "/ui/login"
"""The dashboard's login page: answered without a token (it is where one is given)."""
DASHBOARD_PREFIX = "/ui/"
SESSION_COOKIE = "trialbus_session"
"""The browser's credential: the API token, set by the login page (HttpOnly,
SameSite=Strict) and honoured on safe methods only (``COOKIE_METHODS``)."""
COOKIE_METHODS = frozenset({"GET", "HEAD"})
TASKS_PATH = "/tasks"
"""Task uploads: a gzipped tar of one task folder (the only non-manifest body)."""
TASK_MEDIA_TYPES = frozenset({"application/gzip", "application/x-gzip"})
"""What a task upload may be; like the manifest types, not sendable cross-site without
a CORS preflight."""
FORM_MEDIA_TYPE = "application/x-www-form-urlencoded"
"""What the login form posts; accepted on ``LOGIN_PATH`` only."""
DASHBOARD_STATIC = (
    "/ui/static/dashboard.css",
    "/ui/static/dashboard.js",
    "/ui/static/favicon.svg",
)
"""The login page's style, script and icon: the same for everyone, so open."""
OPEN_PATHS = frozenset({"/healthz", LOGIN_PATH, *DASHBOARD_STATIC})
"""Paths answered without a token (health checks, the login page and its files), still
behind the Host and Origin checks."""


@dataclass(frozen=True, slots=True)
class ApiAccess:
    """Who may call the API and what a request may carry (built once, at start)."""

    tokens: TokenTable | None
    """None: no authentication (only ever on a loopback address)."""
    allowed_hosts: tuple[str, ...]
    max_body_bytes: int
    max_task_bytes: int = 64 * 1024 * 1024
    """Body limit of a task upload (``TASKS_PATH``), a bigger one than a manifest's."""

    def body_limit(self, path: str) -> tuple[int, str]:
        """The body limit of ``path`` and the setting that sets it."""
        if path == TASKS_PATH:
            return self.max_task_bytes, "TRIALBUS_API_MAX_TASK_BYTES"
        return self.max_body_bytes, "TRIALBUS_API_MAX_BODY_BYTES"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the API on this machine (no name is resolved)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(settings: SubmitterSettings) -> tuple[str, ...]:
    """The Host header values answered: the setting, else the bind address and loopback."""
    if settings.api_allowed_hosts is not None:
        hosts = [
            h.strip().strip("[]").lower()
            for h in settings.api_allowed_hosts.split(",")
            if h.strip()
        ]
        if not hosts:
            raise ApiConfigError("TRIALBUS_API_ALLOWED_HOSTS is set but names no host")
        return tuple(hosts)
    hosts = ["localhost", "127.0.0.1", "::1"]
    bind = settings.http_host.strip("[]").lower()
    if bind not in ("0.0.0.0", "::", "") and bind not in hosts:
        hosts.insert(0, bind)
    return tuple(hosts)


def api_access(settings: SubmitterSettings) -> ApiAccess:
    """The API's access rules from its settings; ApiConfigError says what to fix."""
    hosts = allowed_hosts(settings)
    if settings.api_no_auth:
        if settings.api_tokens_file is not None:
            raise ApiConfigError(
                "both TRIALBUS_API_TOKENS_FILE and TRIALBUS_API_NO_AUTH are set; choose one"
            )
        if not is_loopback(settings.http_host):
            raise ApiConfigError(
                f"TRIALBUS_API_NO_AUTH is accepted only on a loopback address, and "
                f"TRIALBUS_HTTP_HOST is {settings.http_host!r}: anyone who can reach it "
                "could submit and cancel experiments. Give a tokens file "
                "(TRIALBUS_API_TOKENS_FILE) or bind 127.0.0.1"
            )
        log.warning("HTTP API without authentication (loopback only)", host=settings.http_host)
        return ApiAccess(None, hosts, settings.api_max_body_bytes, settings.api_max_task_bytes)
    if settings.api_tokens_file is None:
        raise ApiConfigError(
            "the HTTP API needs tokens: set TRIALBUS_API_TOKENS_FILE to a 0600 file of "
            "token SHA-256s (`trialbus up` writes one; see docs/security.md), or "
            "TRIALBUS_API_NO_AUTH=true with TRIALBUS_HTTP_HOST=127.0.0.1. "
            "(TRIALBUS_API_TOKEN is no longer read.)"
        )
    table = load_token_table(settings.api_tokens_file)
    log.info("HTTP API tokens loaded", n_tokens=len(table), allowed_hosts=list(hosts))
    return ApiAccess(table, hosts, settings.api_max_body_bytes, settings.api_max_task_bytes)


def identify_token(access: ApiAccess, token: str) -> Identity | None:
    """Who ``token`` is under ``access`` (the login form checks a typed token this way)."""
    if access.tokens is None:
        return ANONYMOUS
    return access.tokens.identify(token.strip()) if token.strip() else None


def media_type(content_type: str | None) -> str:
    """``application/json; charset=utf-8`` -> ``application/json``."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Host matching as TrustedHostMiddleware does it (``*``, ``*.example.org``)."""
    host = host.lower()
    return any(
        p == "*" or host == p or (p.startswith("*.") and host.endswith(p[1:])) for p in allowed
    )


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def session_token(headers: Headers, method: str) -> str | None:
    """The session cookie's token on a safe method (``COOKIE_METHODS``), else None."""
    if method.upper() not in COOKIE_METHODS:
        return None
    token = cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE, "").strip()
    return token or None


class ApiGuard:
    """ASGI middleware: origin, token, media type and size, checked before the body."""

    def __init__(self, app: ASGIApp, access: ApiAccess) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse, or read the body (bounded) and pass the request on with its identity."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, answer, extra = refusal
            response: Response = JSONResponse(answer, status, extra)
            if status == 401 and _wants_login_page(scope):
                response = RedirectResponse(LOGIN_PATH, status_code=303)
            client = scope.get("client")
            log.info(
                "HTTP request refused",
                status=status,
                method=scope["method"],
                path=scope["path"],
                client=client[0] if client else None,
            )
            if _declares_body(headers):
                # Close rather than drain: the unread body is never received.
                extra = {**(extra or {}), "Connection": "close"}
                response.headers.update(extra)
            await response(scope, receive, send)
            return
        if not _declares_body(headers):
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive, send)
        if body is not None:
            await self.app(scope, _replay(body, receive), send)

    def _refusal(
        self, scope: Scope, headers: Headers
    ) -> tuple[int, dict[str, Any], dict[str, str] | None] | None:
        origin = headers.get("origin")
        if origin is not None:
            origin_host = urlsplit(origin).hostname
            if origin_host is None or not host_allowed(origin_host, self.access.allowed_hosts):
                return 403, {"error": "cross-origin requests are not accepted"}, None
        if scope["path"] not in OPEN_PATHS:
            identity = self._identify(headers, scope["method"])
            if identity is None:
                detail = {"detail": "missing or wrong bearer token"}
                return 401, detail, {"WWW-Authenticate": "Bearer"}
            scope.setdefault("state", {})["identity"] = identity
        if _declares_body(headers):
            declared = media_type(headers.get("content-type"))
            path = scope["path"]
            if path == TASKS_PATH:
                if declared not in TASK_MEDIA_TYPES:
                    return 415, {"error": _task_media_message(declared)}, None
            elif declared not in MANIFEST_MEDIA_TYPES and not (
                path == LOGIN_PATH and declared == FORM_MEDIA_TYPE
            ):
                return 415, {"error": _media_message(declared)}, None
            length = headers.get("content-length")
            limit, _ = self.access.body_limit(path)
            if length is not None and length.isdigit() and int(length) > limit:
                return 413, {"error": self._too_large(path)}, None
        return None

    def _identify(self, headers: Headers, method: str) -> Identity | None:
        if self.access.tokens is None:
            return ANONYMOUS
        # The header wins; the cookie counts only where a browser reads (GET, HEAD).
        token = bearer_token(headers.get("authorization")) or session_token(headers, method)
        return None if token is None else self.access.tokens.identify(token)

    def _too_large(self, path: str) -> str:
        limit, setting = self.access.body_limit(path)
        fix = (
            "make the task smaller (large data belongs in the task's image)"
            if path == TASKS_PATH
            else "split the experiment into several manifests"
        )
        return f"request body larger than {limit} bytes ({setting}); {fix}"

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None once a 413 was sent (or the client went away)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self.access.body_limit(scope["path"])[0]:
                # Stop reading here: the rest of the body is never received.
                log.info("HTTP request refused", status=413, path=scope["path"])
                answer = {"error": self._too_large(scope["path"])}
                refused = JSONResponse(answer, 413, {"Connection": "close"})
                await refused(scope, receive, send)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _wants_login_page(scope: Scope) -> bool:
    """A browser's unauthenticated read of a dashboard page: send it to log in."""
    return scope["method"] in COOKIE_METHODS and str(scope["path"]).startswith(DASHBOARD_PREFIX)


def _declares_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    return "transfer-encoding" in headers or (length is not None and length.strip() != "0")


def _media_message(declared: str) -> str:
    got = f"Content-Type {declared}" if declared else "a body without Content-Type"
    return f"{got} is not accepted; send the manifest as application/json or application/yaml"


def _task_media_message(declared: str) -> str:
    got = f"Content-Type {declared}" if declared else "a body without Content-Type"
    return (
        f"{got} is not accepted; send the task folder as a gzipped tar "
        "(application/gzip), e.g. `tar czf - -C TASK_FOLDER .`"
    )


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the already-read body once, then defers to the server."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def secure(app: FastAPI, access: ApiAccess) -> None:
    """Put the Host check and the guard in front of every route of ``app``."""
    app.state.api_access = access  # the login form checks typed tokens against it
    app.add_middleware(ApiGuard, access=access)
    # Starlette compares an IPv6 Host with its brackets ("[::1]"); Origin hosts have none.
    trusted = [f"[{h}]" if ":" in h else h for h in access.allowed_hosts]
    # Added last, so it runs first: a rebinding page gets nothing else from the API.
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=trusted, www_redirect=False)
