"""Map a Dockerfile's base image (FROM) onto what this host can offer.

The local environment has no images: every trial sees the host's own /usr, /etc and
/var (through per-trial overlays). A base image is accepted when the host is a
reasonable stand-in for it:

- ``ubuntu:*`` and ``debian:*`` (and Terminal-Bench's ``t-bench/ubuntu-*`` images):
  the host system as it is.
- ``python:3.X[-variant]`` (and ``t-bench/python-3-X``): the host system plus a
  Python 3.X installed as ``/usr/local`` (a virtual environment over a host
  interpreter of that version, so ``python``, ``python3`` and ``pip`` resolve there as
  in the official images). The version must be installed on the host.

Anything else is refused with ``UnsupportedEnvironmentError`` unless the environment's
``base_images`` option maps it (exact name or shell pattern -> ``"host"`` or
``"python3.X"``).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from services.localenv.errors import UnsupportedEnvironmentError

_HOST_RE = re.compile(
    r"^(?:(?:docker\.io/)?(?:library/)?(?:ubuntu|debian)"
    r"|ghcr\.io/laude-institute/t-bench/(?:ubuntu|debian)[\w.-]*)(?::[\w.-]+)?(?:@sha256:\w+)?$"
)
_PYTHON_RE = re.compile(
    r"^(?:(?:docker\.io/)?(?:library/)?python:(?P<v>3\.\d+)(?:[.\w-]*)"
    r"|ghcr\.io/laude-institute/t-bench/python-3-(?P<m>\d+)(?::[\w.-]+)?)(?:@sha256:\w+)?$"
)
_PYTHON_SPEC_RE = re.compile(r"^python:?(3\.\d+)$")


@dataclass(frozen=True, slots=True)
class Interpreter:
    """A host Python interpreter a trial may use.

    ``prefix`` must be bound into the sandbox at the same path when it lies outside
    /usr (interpreters built with an absolute library path only run from there).
    """

    version: str
    executable: str
    prefix: str

    @property
    def needs_bind(self) -> bool:
        return not (self.prefix == "/usr" or self.prefix.startswith("/usr/"))


@dataclass(frozen=True, slots=True)
class BaseImage:
    """What a FROM line maps to: the host system, optionally with a Python as /usr/local."""

    reference: str
    python: Interpreter | None = None

    def describe(self) -> str:
        if self.python is None:
            return f"{self.reference} -> this host's system"
        return (
            f"{self.reference} -> this host's system with Python {self.python.version} "
            f"({self.python.executable}) as /usr/local"
        )


def interpreter_candidates(version: str, home: Path | None = None) -> list[str]:
    """Where a host Python ``version`` (e.g. "3.12") may live, most preferred first."""
    home = home or Path(os.path.expanduser("~"))
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or home / ".pyenv")
    found = [f"/usr/local/bin/python{version}"]
    found += sorted(
        glob.glob(str(pyenv_root / "versions" / f"{version}.*" / "bin" / f"python{version}")),
        key=_patch_order,
        reverse=True,
    )
    uv_dir = home / ".local" / "share" / "uv" / "python"
    found += sorted(
        glob.glob(str(uv_dir / f"cpython-{version}.*-linux-*" / "bin" / f"python{version}")),
        key=_patch_order,
        reverse=True,
    )
    found.append(f"/usr/bin/python{version}")
    # The interpreter trialbus itself runs on is always there.
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        found.append(str(Path(sys.base_prefix) / "bin" / f"python{version}"))
    return found


def _patch_order(path: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", path)
    return tuple(int(x) for x in match.groups()) if match else (0,)


def find_interpreter(version: str, extra: Mapping[str, str] | None = None) -> Interpreter | None:
    """The host interpreter for Python ``version``, or None when none is installed."""
    paths: Sequence[str] = [p for p in [(extra or {}).get(version)] if p]
    for path in [*paths, *interpreter_candidates(version)]:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            real = os.path.realpath(path)
            prefix = str(Path(real).parent.parent)
            return Interpreter(version=version, executable=path, prefix=prefix)
    return None


def host_interpreters(extra: Mapping[str, str] | None = None) -> list[Interpreter]:
    """Every Python 3.8+ found on the host (one per minor version)."""
    found = []
    for minor in range(8, 20):
        interp = find_interpreter(f"3.{minor}", extra)
        if interp is not None:
            found.append(interp)
    return found


def resolve_base(
    reference: str,
    *,
    overrides: Mapping[str, str] | None = None,
    interpreters: Mapping[str, str] | None = None,
    where: str = "Dockerfile",
) -> BaseImage:
    """Map a FROM reference to a ``BaseImage`` (raises UnsupportedEnvironmentError)."""
    version = python_version_for(reference, overrides=overrides, where=where)
    if version is None:
        return BaseImage(reference)
    interp = find_interpreter(version, interpreters)
    if interp is None:
        raise UnsupportedEnvironmentError(
            f"{where}: base image {reference!r} needs Python {version}, which is not "
            f"installed on this host (looked in {', '.join(interpreter_candidates(version))}); "
            f"install it (e.g. `pyenv install {version}`) or name one with the environment "
            f'option python_interpreters: {{"{version}": "/path/to/python{version}"}}'
        )
    return BaseImage(reference, python=interp)


def python_version_for(
    reference: str, *, overrides: Mapping[str, str] | None = None, where: str = "Dockerfile"
) -> str | None:
    """The Python version a FROM reference stands for here (None: the host system as it
    is), whatever this host has installed; raises UnsupportedEnvironmentError for an
    image with no equivalent (the submitter's check too: task_fit.unhostable)."""
    mapped = _override_for(reference, overrides or {})
    if mapped is not None:
        if mapped == "host":
            return None
        spec = _PYTHON_SPEC_RE.match(mapped)
        if spec is None:
            raise UnsupportedEnvironmentError(
                f"base_images maps {reference!r} to {mapped!r}; use 'host' or 'python3.X'"
            )
        return spec.group(1)
    if _HOST_RE.match(reference):
        return None
    if (match := _PYTHON_RE.match(reference)) is not None:
        return match.group("v") or f"3.{match.group('m')}"
    raise UnsupportedEnvironmentError(
        f"{where}: base image {reference!r} has no equivalent on this host (the local "
        "environment imitates ubuntu/debian and python:3.X images). Map it with the "
        "environment option base_images, e.g. "
        f'environment_kwargs: {{base_images: {{"{reference}": "host"}}}}, '
        "or run the task with a Docker environment"
    )


def _override_for(reference: str, overrides: Mapping[str, str]) -> str | None:
    if reference in overrides:
        return overrides[reference]
    for pattern, target in overrides.items():
        if fnmatch.fnmatchcase(reference, pattern):
            return target
    return None
