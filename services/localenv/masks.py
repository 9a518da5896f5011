"""Host secrets hidden from every trial: masks written into a task's layer.

A trial sees the host's /etc and /var as read-only lower layers, and root inside is
the host's uid 0, so without masks it reads the host's password hashes, SSH host
keys and TLS private keys. The layer (which sits above the host folders in every
overlay, the build's included) gets, before the first Dockerfile step runs:

- ``/etc/shadow``, ``/etc/gshadow`` (and their ``-`` backups): the host's entries
  with every password field replaced by ``*``, same owner and mode, so the users an
  image expects still exist and ``useradd``/``passwd`` work as in Docker;
- SSH host keys and the files in ``/etc/ssl/private``: overlay whiteouts (absent,
  so ``ssh-keygen -A`` makes the trial its own keys);
- ``/var/backups`` (Debian keeps ``shadow.bak`` there): an opaque, empty folder.

``fingerprint`` changes when any of them changes on the host, so the layer cache
key does too and no layer keeps an outdated mask.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

SHADOW_FILES = ("shadow", "shadow-", "gshadow", "gshadow-")
WHITEOUT_GLOBS = ("ssh/ssh_host_*key*", "ssl/private/*")
OPAQUE_VAR_DIRS = ("backups",)
# The mount uses ``userxattr`` (overlayfs in a user namespace): its xattrs are user.*.
_OPAQUE_XATTR = "user.overlay.opaque"


def masked_paths(host_root: Path = Path("/")) -> list[str]:
    """The host paths masked today (absolute, for logs and the fingerprint)."""
    etc = host_root / "etc"
    found = [f"/etc/{n}" for n in SHADOW_FILES if (etc / n).is_file()]
    for pattern in WHITEOUT_GLOBS:
        found += sorted(f"/{p.relative_to(host_root)}" for p in etc.glob(pattern))
    found += [f"/var/{d}" for d in OPAQUE_VAR_DIRS if (host_root / "var" / d).is_dir()]
    return found


def fingerprint(host_root: Path = Path("/")) -> str:
    """Changes whenever a masked host file appears, disappears or changes."""
    parts = []
    for rel in masked_paths(host_root):
        with contextlib.suppress(OSError):
            st = (host_root / rel.lstrip("/")).lstat()
            parts.append(f"{rel}:{st.st_size}:{st.st_mtime_ns}")
    return ";".join(parts)


def mask_host_secrets(fs: Path, host_root: Path = Path("/")) -> list[str]:
    """Write the masks into a layer's ``fs`` folder (``fs/etc``, ``fs/var``); the masked
    paths. Needs root (whiteouts are device nodes)."""
    if os.geteuid() != 0:
        # Root inside is then this runner's own uid: it reads what the runner reads,
        # and the runner can neither read these files nor make whiteouts.
        return []
    etc, var = fs / "etc", fs / "var"
    done = []
    for name in SHADOW_FILES:
        host = host_root / "etc" / name
        if not host.is_file() or host.is_symlink():
            continue
        st = host.stat()
        dest = etc / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(_locked_out(host.read_text(errors="replace")))
        os.chown(dest, st.st_uid, st.st_gid)
        dest.chmod(stat.S_IMODE(st.st_mode))
        done.append(f"/etc/{name}")
    for pattern in WHITEOUT_GLOBS:
        for host in sorted((host_root / "etc").glob(pattern)):
            rel = host.relative_to(host_root / "etc")
            dest = etc / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(dest):
                dest.unlink()
            os.mknod(dest, stat.S_IFCHR | 0o000, os.makedev(0, 0))
            done.append(f"/etc/{rel}")
    for name in OPAQUE_VAR_DIRS:
        if (host_root / "var" / name).is_dir():
            dest = var / name
            dest.mkdir(parents=True, exist_ok=True)
            os.setxattr(dest, _OPAQUE_XATTR, b"y")
            done.append(f"/var/{name}")
    return done


def _locked_out(text: str) -> str:
    """shadow/gshadow text with every password field (the second) set to ``*``."""
    lines = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) > 1 and not line.startswith("#"):
            fields[1] = "*"
        lines.append(":".join(fields))
    return "\n".join(lines) + ("\n" if lines else "")
