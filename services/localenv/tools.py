"""Test tooling the local environment lends to every trial, read-only.

Terminal-Bench verifiers typically download uv from its website, ``source
$HOME/.local/bin/env`` and run ``uvx -p 3.X -w pytest ... pytest``. Where that
website is out of reach, the trial still finds:

- ``uv`` and ``uvx`` from trialbus's own environment (PyPI package ``uv``), bound at
  /opt/trialbus/libexec and linked from /opt/trialbus/bin (the end of PATH);
- ``$HOME/.local/bin/{env,uv,uvx}`` for root, as the uv installer leaves them (a
  successful download simply replaces them);
- ``python3.X`` links in /opt/trialbus/bin for the host's interpreters, so
  ``uvx -p 3.X`` finds one without downloading (each interpreter's folder is bound
  read-only at its host path, because such builds only run from there).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from services.localenv.images import Interpreter
from services.localenv.spec import Bind

TOOLS_DIR = "/opt/trialbus"
TOOLS_BIN = f"{TOOLS_DIR}/bin"
UV_ENV_SCRIPT = """#!/bin/sh
# add binaries to PATH if they aren't added yet (as uv's installer writes it)
case ":${PATH}:" in
    *:"$HOME/.local/bin":*)
        ;;
    *)
        export PATH="$HOME/.local/bin:$PATH"
        ;;
esac
"""


def find_uv() -> tuple[Path, Path] | None:
    """uv and uvx next to this interpreter (the project's venv), or on PATH."""
    here = Path(sys.executable).parent
    for folder in (here, *(Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p)):
        uv, uvx = folder / "uv", folder / "uvx"
        if uv.is_file() and uvx.is_file():
            return uv, uvx
    return None


@dataclass(frozen=True, slots=True)
class Toolbox:
    """The host side of /opt/trialbus: a folder of links plus the binds they need."""

    bin_dir: Path
    binds: tuple[Bind, ...]
    fingerprint: str

    @classmethod
    def prepare(cls, cache_root: Path, pythons: list[Interpreter]) -> Toolbox | None:
        """Write (once) the links folder under ``cache_root``; None without uv."""
        found = find_uv()
        if found is None:
            return None
        uv, uvx = found
        links: dict[str, str] = {
            "uv": f"{TOOLS_DIR}/libexec/uv",
            "uvx": f"{TOOLS_DIR}/libexec/uvx",
        }
        binds = [
            Bind(uv.resolve(), f"{TOOLS_DIR}/libexec/uv", read_only=True),
            Bind(uvx.resolve(), f"{TOOLS_DIR}/libexec/uvx", read_only=True),
        ]
        for py in pythons:
            links[f"python{py.version}"] = py.executable
            if py.needs_bind:
                binds.append(Bind(Path(py.prefix), py.prefix, read_only=True))
        stat = uv.stat()
        digest = hashlib.sha256(
            repr((sorted(links.items()), str(uv), stat.st_size, stat.st_mtime_ns)).encode()
        ).hexdigest()[:16]
        bin_dir = cache_root / f"tools-{digest}" / "bin"
        if not bin_dir.is_dir():
            # Unique per call: concurrent first trials in one runner process each
            # build their own copy; the first rename wins, the others are dropped.
            tmp = cache_root / f".tools-{digest}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "bin").mkdir(parents=True)
            for name, target in links.items():
                (tmp / "bin" / name).symlink_to(target)
            try:
                tmp.rename(bin_dir.parent)
            except OSError:  # another process made it first
                shutil.rmtree(tmp, ignore_errors=True)
        binds.append(Bind(bin_dir, TOOLS_BIN, read_only=True))
        return cls(bin_dir=bin_dir, binds=tuple(binds), fingerprint=digest)


def seed_home(root_home: Path) -> None:
    """Leave ``~/.local/bin`` as uv's installer would (run at layer build time)."""
    local_bin = root_home / ".local" / "bin"
    local_bin.mkdir(parents=True, exist_ok=True)
    env = local_bin / "env"
    env.write_text(UV_ENV_SCRIPT)
    env.chmod(0o755)
    for name in ("uv", "uvx"):
        link = local_bin / name
        if not link.is_symlink() and not link.exists():
            link.symlink_to(f"{TOOLS_BIN}/{name}")
