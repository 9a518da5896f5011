"""Secret redaction for live trial output (pure: text in, text out).

A runner knows the secrets a trial may see: the values of the variables the agent's
``api_key_env`` names, and the runner's own credentials. Before a chunk of live output
leaves the runner (services.runner.live_logs), every occurrence of one of those values
becomes ``[redacted:NAME]``, NAME being the variable's (or credential's) name.

What is caught: the exact value, and its base64 forms (standard and URL-safe, at each
of the three byte alignments, so a key inside ``Authorization: Basic ...`` is caught
too), also when an occurrence is split across chunks. Occurrences that overlap are
merged into one span naming every secret involved (``[redacted:A+B]``).

What is not caught (docs/security.md, "Live logs"): any other transformation of a value
(hex, percent- or JSON-escaped, reversed, a prefix or a suffix alone, a value broken
by a line wrap or a terminal escape sequence, case changes), and secrets the runner
does not know (a task's own, or one the agent fetched). A value shorter than
``MIN_SECRET_CHARS`` is not searched for: "1234" or "true" would redact half of
every log, and hiding a short value does not protect it. The live-log sink withholds
a trial's output instead when one of its secrets is that short.

Streaming (``RedactingStream``): a chunk's end may hold the start of a secret whose
rest comes in the next chunk. The stream keeps back only the longest end of the text
that is the beginning of some needle (at most the longest needle's length minus one
characters), so output that cannot start a secret is never delayed; ``flush`` releases
what is kept at the end of the output.
"""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from schemas.events import TrialRequested
    from services.common.settings import RunnerSettings

MIN_SECRET_CHARS = 8
"""Values shorter than this are not searched for (see the module docstring)."""
BINARY_SNIFF_BYTES = 8192
"""A file with a NUL byte in its first this many bytes is binary (``redact_file``)."""


def marker(names: Iterable[str]) -> str:
    """What replaces a redacted span: ``[redacted:NAME]`` (names joined by ``+``)."""
    return f"[redacted:{'+'.join(sorted(set(names)))}]"


def base64_forms(value: str) -> set[str]:
    """The base64 text that stands for ``value`` wherever it sits in an encoded stream.

    At byte offset 0, 1 or 2 of a 3-byte group the value's bytes encode differently;
    for each offset, the characters that depend on the value's bytes alone (not on its
    neighbours) are the needle. Standard and URL-safe alphabets; padding left off.
    """
    raw = value.encode()
    forms: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw + b"\0\0").decode()
        start = -(-8 * offset // 6)  # first character made of the value's bits only
        end = 8 * (offset + len(raw)) // 6  # one past the last such character
        core = encoded[start:end]
        if len(core) >= MIN_SECRET_CHARS:
            forms.add(core)
            forms.add(core.translate(str.maketrans("+/", "-_")))
    return forms


@dataclass(frozen=True, slots=True)
class Needle:
    """One text to find, and the name of the secret it stands for."""

    text: str
    name: str


class Redactor:
    """Knows a trial's secrets; redacts whole texts or builds streams that do."""

    def __init__(self, secrets: Mapping[str, str], *, encodings: bool = True) -> None:
        """``secrets``: name -> value. Values under ``MIN_SECRET_CHARS`` are listed in
        ``too_short`` and not searched for; ``encodings`` adds the base64 forms."""
        self.too_short = sorted(n for n, v in secrets.items() if 0 < len(v) < MIN_SECRET_CHARS)
        needles: dict[str, set[str]] = {}
        for name, value in secrets.items():
            if len(value) < MIN_SECRET_CHARS:
                continue
            for text in {value, *(base64_forms(value) if encodings else ())}:
                needles.setdefault(text, set()).add(name)
        self.needles = tuple(Needle(t, "+".join(sorted(n))) for t, n in sorted(needles.items()))
        self.names = sorted(n for n, v in secrets.items() if len(v) >= MIN_SECRET_CHARS)
        self.longest = max((len(n.text) for n in self.needles), default=0)
        self._starts = frozenset(n.text[0] for n in self.needles)

    def spans(self, text: str) -> list[tuple[int, int, set[str]]]:
        """Every occurrence of every needle, overlapping ones merged: (start, end, names)."""
        found: list[tuple[int, int, str]] = []
        for needle in self.needles:
            at = text.find(needle.text)
            while at >= 0:
                found.append((at, at + len(needle.text), needle.name))
                at = text.find(needle.text, at + 1)
        found.sort()
        merged: list[tuple[int, int, set[str]]] = []
        for start, end, name in found:
            if merged and start < merged[-1][1]:
                last = merged[-1]
                merged[-1] = (last[0], max(last[1], end), last[2] | set(name.split("+")))
            else:
                merged.append((start, end, set(name.split("+"))))
        return merged

    def redact(self, text: str) -> str:
        """``text`` with every known secret (and its base64 forms) replaced."""
        return self._apply(text, self.spans(text))

    def redact_counted(self, text: str) -> tuple[str, int]:
        """``redact``, and how many spans were replaced."""
        spans = self.spans(text)
        return self._apply(text, spans), len(spans)

    def redact_cut(self, text: str) -> str:
        """``redact`` for a text cut at an arbitrary point (a message cut to a length):
        an end that begins a secret is dropped too, as ``[cut]``."""
        stream = self.stream()
        safe = stream.feed(text)
        return f"{safe}[cut]" if stream.held else safe

    def redact_file(self, blob: bytes) -> tuple[bytes, int] | None:
        """A text file's bytes with the secrets replaced, and the count; None: binary.

        Text is a file without a NUL byte in its first ``BINARY_SNIFF_BYTES`` (git's
        rule); its bytes are read as UTF-8 with undecodable bytes kept as they are
        (surrogateescape), so a Latin-1 log is redacted too and nothing else changes.
        A binary file (an image, a compressed log, a database) is left as it is:
        replacing bytes inside it would corrupt it, and a compressed secret is not
        found anyway (docs/security.md says so).
        """
        if not self.needles or b"\0" in blob[:BINARY_SNIFF_BYTES]:
            return None
        text, n = self.redact_counted(blob.decode("utf-8", "surrogateescape"))
        return (text.encode("utf-8", "surrogateescape"), n) if n else (blob, 0)

    @staticmethod
    def _apply(text: str, spans: list[tuple[int, int, set[str]]]) -> str:
        out: list[str] = []
        pos = 0
        for start, end, names in spans:
            out.append(text[pos:start])
            out.append(marker(names))
            pos = end
        out.append(text[pos:])
        return "".join(out)

    def pending_start(self, text: str) -> int:
        """Where the longest end of ``text`` that begins some needle starts (len: none)."""
        for i in range(max(0, len(text) - self.longest + 1), len(text)):
            if text[i] in self._starts:
                rest = text[i:]
                if any(n.text.startswith(rest) for n in self.needles):
                    return i
        return len(text)

    def stream(self) -> RedactingStream:
        """A stream over one output (one phase's stdout or stderr)."""
        return RedactingStream(self)


class RedactingStream:
    """Redacts one output chunk by chunk, catching secrets split between chunks."""

    def __init__(self, redactor: Redactor) -> None:
        self._redactor = redactor
        self._held = ""

    @property
    def held(self) -> int:
        """Characters kept back (the possible start of a secret)."""
        return len(self._held)

    def feed(self, chunk: str) -> str:
        """The redacted text that is safe to publish now (may be empty)."""
        redactor = self._redactor
        if not redactor.needles:
            return chunk
        text = self._held + chunk
        spans = redactor.spans(text)
        # An occurrence starting before ``cut`` is whole in ``text`` (else text[start:]
        # would begin a needle, so start >= cut). A span crossing ``cut`` is kept back
        # whole: an unfinished secret overlapping it must be merged with it next time.
        cut = redactor.pending_start(text)
        for start, end, _ in spans:
            if start < cut < end:
                cut = start
        self._held = text[cut:]
        return Redactor._apply(text[:cut], [s for s in spans if s[1] <= cut])

    def flush(self) -> str:
        """What was kept back, redacted: the output has ended."""
        text, self._held = self._held, ""
        return self._redactor.redact(text)


def runner_secrets(credentials_file: Path | None, urls: Mapping[str, str]) -> dict[str, str]:
    """The runner's own secrets a trial could find: its NATS password, URL passwords.

    ``credentials_file``: a NATS credentials file, whatever role it is for (named
    after its setting, TRIALBUS_NATS_CREDENTIALS); skipped when it cannot be read (the
    runner would not have connected with it either). ``urls``: setting name -> URL,
    whose ``user:password@`` part, if any, is a secret (``LEDGER_URL=mongodb://u:p@h``).
    """
    found: dict[str, str] = {}
    if credentials_file is not None:
        from infra.nats_auth import CredentialsError, load_credentials

        with contextlib.suppress(CredentialsError, OSError):
            found["TRIALBUS_NATS_CREDENTIALS"] = load_credentials(credentials_file).password
    for name, url in urls.items():
        for one in url.split(","):
            with contextlib.suppress(ValueError):
                password = urlsplit(one.strip()).password
                if password:
                    found[name] = password  # as written in the environment
    return found


@dataclass(frozen=True, slots=True)
class TrialSecrets:
    """The secrets a trial may see: the runner's own, and its agent's ``api_key_env``.

    Built once per runner (``from_settings``); the executor redacts the exception
    messages it reports with it and the trial folders are redacted with it before they
    are stored (services.common.trial_folders), so events and ledger records do not
    carry what live logs already hide.
    """

    runner: Mapping[str, str]
    environ: Mapping[str, str] | None = None
    """The environment trials inherit (None: this process's, read at each call)."""

    @classmethod
    def from_settings(
        cls, settings: RunnerSettings, environ: Mapping[str, str] | None = None
    ) -> TrialSecrets:
        """The secrets of a runner configured by ``settings``."""
        return cls(
            runner_secrets(
                settings.nats_credentials,
                {"NATS_URL": settings.nats_url, "LEDGER_URL": settings.ledger_url},
            ),
            environ,
        )

    def of(self, request: TrialRequested) -> dict[str, str]:
        """Name -> value of every secret ``request``'s trial may see."""
        env = os.environ if self.environ is None else self.environ
        found = dict(self.runner)
        for name in request.agent.api_key_env:
            value = env.get(name)
            if value:
                found[name] = value
        return found

    def redactor(self, request: TrialRequested) -> Redactor:
        """A redactor of ``request``'s secrets."""
        return Redactor(self.of(request))
