"""How a command enters a sandbox without running anything the trial can change.

Entering takes privilege: ``nsenter`` joins the sandbox's user namespace, which hands
it every capability there, and only then can ``setpriv`` lower the bound to Docker's
set. Everything that runs before that bound is in place must come from the host and
must not read the trial's files or environment:

- host helpers (the cgroup join, ``nsenter``, ``unshare``, ``mount``, ``bwrap``,
  ``slirp4netns``) are started by absolute host path with ``HELPER_ENV`` (nothing of
  the runner's environment, nothing of the trial's: a task's ``ENV LD_PRELOAD`` would
  otherwise load into host root processes);
- ``setpriv`` runs inside the trial's root, where ``/usr`` is the trial's writable
  overlay: it is a copy of the host's, with its libraries and the dynamic loader,
  in a folder bound read-only at ``HELPERS_TARGET`` (a mount point the trial can
  neither write, rename nor unmount), started through that loader with the
  library cache off, and ``/etc/ld.so.preload`` is masked by an empty read-only file
  (the loader reads it whatever the invocation);
- the command's environment travels in a memfd and is exported by the trial's own
  bash after the bound is applied (``env_loader``), so it is never on a command
  line (other host users can read those) and never seen by a privileged helper.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.localenv.errors import LocalEnvironmentError

HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HELPER_ENV: Mapping[str, str] = {"PATH": HOST_PATH, "LANG": "C"}
"""The whole environment of every host helper: the runner's secrets stay out of the
sandbox's long-lived processes, and the trial's variables out of privileged ones."""
HELPERS_TARGET = "/.trialbus-exec"
PRELOAD_FILE = "/etc/ld.so.preload"
_PRIVILEGED = ("setpriv",)
_HELPERS: dict[Path, ExecHelpers] = {}
_LDD: dict[tuple[Path, int, int], list[Path]] = {}


def host_tool(name: str) -> str:
    """Absolute path of a host program, looked up on ``HOST_PATH`` only."""
    found = shutil.which(name, path=HOST_PATH)
    if found is None:
        raise LocalEnvironmentError(
            f"{name} is not installed on this host: apt-get install bubblewrap slirp4netns "
            "util-linux (or run `make setup`)"
        )
    return found


@dataclass(frozen=True, slots=True)
class ExecHelpers:
    """The host folder bound read-only at ``HELPERS_TARGET``."""

    host_dir: Path

    @property
    def empty_file(self) -> Path:
        """An empty file, bound over ``/etc/ld.so.preload``."""
        return self.host_dir / "empty"

    def privileged(self, name: str) -> list[str]:
        """argv prefix that runs helper ``name`` from the bound folder, loader included."""
        return [
            f"{HELPERS_TARGET}/ld.so",
            "--inhibit-cache",
            "--library-path",
            f"{HELPERS_TARGET}/lib",
            f"{HELPERS_TARGET}/{name}",
        ]


def prepare_helpers(root: Path) -> ExecHelpers:
    """Copy the privileged helpers, their libraries and loader under ``root`` (once)."""
    sources = {name: Path(host_tool(name)).resolve() for name in _PRIVILEGED}
    deps = {name: _shared_objects(path) for name, path in sources.items()}
    loader = next((p for d in deps.values() for p in d if "ld-linux" in p.name), None)
    if loader is None:
        raise LocalEnvironmentError(f"no dynamic loader found for {', '.join(_PRIVILEGED)}")
    libs = {p for d in deps.values() for p in d if p != loader}
    files = (*sources.values(), *libs, loader)
    stamp = repr(sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    folder = root / f"helpers-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}"
    known = _HELPERS.get(folder)
    if known is not None and folder.is_dir():
        return known
    if not folder.is_dir():
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = root / f".helpers-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        (tmp / "lib").mkdir(parents=True)
        shutil.copy2(loader, tmp / "ld.so")
        for lib in libs:
            shutil.copy2(lib, tmp / "lib" / lib.name)
        for name, path in sources.items():
            shutil.copy2(path, tmp / name)
        (tmp / "empty").write_bytes(b"")
        for p in (tmp, tmp / "lib"):
            p.chmod(0o755)
        try:
            tmp.rename(folder)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    helpers = ExecHelpers(folder)
    _HELPERS[folder] = helpers
    return helpers


def _shared_objects(binary: Path) -> list[Path]:
    """The shared objects ``binary`` loads (its loader included), as ldd reports them."""
    st = binary.stat()
    key = (binary, st.st_size, st.st_mtime_ns)
    if key not in _LDD:
        _LDD[key] = _ldd(binary)
    return _LDD[key]


def _ldd(binary: Path) -> list[Path]:
    try:
        out = subprocess.run(
            [host_tool("ldd"), str(binary)],
            env=dict(HELPER_ENV),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise LocalEnvironmentError(f"cannot list the libraries of {binary}: {exc}") from exc
    found = []
    for line in out.splitlines():
        words = line.split()
        path = words[2] if "=>" in words and len(words) > 2 else words[0] if words else ""
        if path.startswith("/"):
            found.append(Path(path).resolve())
    return found


def env_loader(fd: int) -> list[str]:
    """argv prefix: export the NUL-separated ``NAME=value`` pairs read from ``fd``, then
    exec the rest. It is the trial's own bash, run after the capability bound, so
    replacing it gains nothing. Names bash cannot export (``a.b``) are dropped."""
    # Start from nothing: the helpers' own variables (and the PWD bash exports) must
    # not show through where the command's environment does not set them.
    script = (
        f"unset SHLVL OLDPWD PWD {' '.join(HELPER_ENV)}; "
        f'while IFS= read -r -d "" kv; do export -- "$kv" 2>/dev/null; done <&{fd}; '
        f'exec {fd}<&-; exec "$@"'
    )
    return ["bash", "-c", script, "trialbus-env"]


def env_memfd(env: Mapping[str, str]) -> int:
    """A memfd holding ``env`` for ``env_loader`` (no disk, no command line)."""
    fd = os.memfd_create("trialbus-env", 0)
    data = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items() if "\0" not in k + v)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
